"""The oldest Keras resumable is tested with, checked at import without importing Keras.

The lanes (requirements/lanes.toml) test Keras 3.8.0 (Colab's "2025.07" runtime) to the newest;
setup.cfg requires the same. A Keras below it (installed with --no-deps, or downgraded after
resumable) gets one line at ``import resumable``: it may work, it is not tested.
"""

from __future__ import annotations

import logging
import re

OLDEST_KERAS = (3, 8)


def too_old(version: str) -> str | None:
    """One line when Keras ``version`` is below `OLDEST_KERAS`; None when it is not, or unreadable."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) >= OLDEST_KERAS:
        return None
    oldest = ".".join(map(str, OLDEST_KERAS))
    return (f"resumable: Keras {version} is older than {oldest}, the oldest resumable is tested with; "
            f"pip install 'keras>={oldest}'")


def warn_if_too_old() -> None:
    """Say `too_old` of the installed Keras, if any (reading its metadata, not importing it)."""
    from importlib import metadata

    try:
        version = metadata.version("keras")
    except metadata.PackageNotFoundError:
        return
    message = too_old(version)
    if message is not None:
        logging.getLogger("resumable").warning("%s", message)
