"""Warnings that point at the user's line, not at resumable's (nor Keras') own files.

A warning raised in one of resumable's background threads (the uploader's) has no user line
to point at: it is one line naming the thread (``resumable-uploader:0: UserWarning: ...``),
not resumable's file with its source line printed under the message.
"""

from __future__ import annotations

import concurrent.futures.thread
import os
import sys
import threading
import warnings

# Packages whose frames stand between a user's call and resumable's warning (a callback runs
# inside Keras' fit, on a backend's code).
_THROUGH = ("resumable", "keras", "tensorflow", "jax", "torch")
# Where a thread's frames begin when no user code started the work: the thread's own run loop.
_THREAD_STARTS = (threading.__file__, concurrent.futures.thread.__file__)


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
    its backends: the user's line (a warning filter on the user's module applies). Without one
    (a background thread), attributed to the thread, in module ``resumable`` (for filters)."""
    prefixes = _library_dirs()
    level, frame = 2, sys._getframe(1)  # 2: this function's caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(prefixes):
        frame, level = frame.f_back, level + 1
    if frame.f_code.co_filename in _THREAD_STARTS or frame.f_code.co_filename.startswith(prefixes):
        warnings.warn_explicit(message, category, threading.current_thread().name, 0, module="resumable")
    elif sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=prefixes)
    else:
        warnings.warn(message, category, stacklevel=level)
