"""How the compat modules say that a Keras lacks an internal: one line naming the Keras version,
said once a session."""

from __future__ import annotations

import functools
import logging

import keras

logger = logging.getLogger("resumable")


def unsupported(what: str) -> str:
    """One line naming the Keras version and the internal resumable cannot find in it."""
    return f"resumable does not know {what} in Keras {keras.__version__}"


@functools.cache
def warn_once(message: str) -> None:
    """Say it once a session: these are asked at every save."""
    logger.warning("%s", message)
