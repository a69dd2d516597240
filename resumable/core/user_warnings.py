"""Warnings that point at the user's line, not at resumable's (nor Keras') own files."""

from __future__ import annotations

import os
import sys
import warnings

# Packages whose frames stand between a user's call and resumable's warning (a callback runs
# inside Keras' fit, on a backend's code).
_THROUGH = ("resumable", "keras", "tensorflow", "jax", "torch")


def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _THROUGH:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(path) + os.sep)
    return tuple(dirs)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message)`` attributed to the first frame outside resumable, Keras and
    its backends: the user's line (a warning filter on the user's module applies)."""
    prefixes = _library_dirs()
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=prefixes)
        return
    level, frame = 2, sys._getframe(1)  # 2: this function's caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(prefixes):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
