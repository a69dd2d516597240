"""Bounded exponential backoff for the errors that go away by themselves.

Google Drive's FUSE mount answers EIO and ENOTCONN ("Transport endpoint is not connected")
while it reconnects; GCS answers 429 and 5xx under load. Everything else fails at once.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

logger = logging.getLogger("resumable")

T = TypeVar("T")

TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.ENOTCONN,
        errno.EAGAIN,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ESTALE,
    }
)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: flaky mounts, throttling, server errors, timeouts."""
    code = getattr(exc, "code", None)
    if isinstance(code, int) and (code == 429 or 500 <= code < 600):
        return True
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    # aiohttp's connection errors, without importing aiohttp for local-only users.
    return type(exc).__module__.startswith("aiohttp") and "Connect" in type(exc).__name__


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient error.

    Args:
        attempts: Total tries, the first included. Defaults to 5.
        initial_delay: Seconds before the second try; doubles each time. Defaults to 0.5.
        max_delay: Upper bound of one wait, in seconds. Defaults to 8.
    """

    attempts: int = 5
    initial_delay: float = 0.5
    max_delay: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(
                f"Invalid value for argument `attempts`. Received: attempts={self.attempts}. "
                "Expected an int >= 1."
            )

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn``, retrying transient errors; ``what`` names the operation in the log."""
        delay = self.initial_delay
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if attempt == self.attempts or not is_transient(exc):
                    raise
                wait = min(delay, self.max_delay) * (0.5 + random.random() / 2)
                logger.warning(
                    "resumable: %s failed (%s: %s); retry %d of %d in %.1f s",
                    what, type(exc).__name__, exc, attempt, self.attempts - 1, wait,
                )
                time.sleep(wait)
                delay *= 2
        raise AssertionError("unreachable")  # the loop either returns or raises
