"""Bounded exponential backoff for the errors that go away by themselves.

Google Drive's FUSE mount answers EIO and ENOTCONN ("Transport endpoint is not connected")
while it reconnects; GCS answers 429 and 5xx under load (gcsfs' HttpError and
google.api_core's exceptions both carry the status in ``code``). Everything else fails at once.

Two budgets (docs/reliability.md):

- Training (``RetryPolicy()``): 5 tries of each operation, 0.5 to 8 s apart, and inside each
  try gcsfs' own 6 tries of each request (1 to 16 s apart): a storage that keeps failing
  fails an operation after about 3 minutes; an upload's body may wait up to 300 s for the
  server. Training outlives a GCS hiccup of a minute or two.
- Commands (``RetryPolicy(budget=30)``, set by the CLI): one operation retries and waits for
  answers for at most ``budget`` seconds in all: every request is tried once within the time
  left (`time_left`; gcsfs' own retries are set aside, `gcsfs_compat.bound_requests`), and no
  retry starts that would end past it. A command against a failing server ends with its one
  line in about that long.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from resumable.storage.errors import redact

logger = logging.getLogger("resumable")

T = TypeVar("T")

# The backoff's jitter: a generator of its own, never the global `random` a user's seeded
# training draws from (see `library_random`).
_JITTER = random.Random()

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


TRANSIENT_HTTP = frozenset({408, 429})  # and every 5xx

# Connection-level errors of the HTTP stacks under gcsfs and google-cloud-storage, matched by
# name so that local-only users need not import them: (top-level package, class name anywhere
# in the exception's MRO).
_TRANSIENT_CLASSES = frozenset(
    {
        ("aiohttp", "ClientConnectionError"),  # refused, reset, server disconnected, timeouts
        ("aiohttp", "ClientPayloadError"),  # a response cut short
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
        ("requests", "ChunkedEncodingError"),
        ("google", "TransportError"),  # google.auth: the token request itself met a network error
        ("google", "DataCorruption"),  # google.cloud.storage: a download's checksum did not match
    }
)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: flaky mounts, throttling, server errors, timeouts."""
    code = http_code(exc)
    if code is not None and (code in TRANSIENT_HTTP or 500 <= code < 600):
        return True
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    return any(
        (cls.__module__.split(".", 1)[0], cls.__name__) in _TRANSIENT_CLASSES for cls in type(exc).__mro__
    )


def http_code(exc: BaseException) -> int | None:
    """The HTTP status of gcsfs' HttpError or google-api-core's errors (an int, or digits)."""
    code = getattr(exc, "code", None)
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return None


class OutOfTime(ConnectionError):
    """No answer within the time left of an operation's budget (`RetryPolicy.budget`)."""


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("resumable_deadline", default=None)


@contextlib.contextmanager
def deadline_in(seconds: float | None) -> Iterator[None]:
    """Within: requests wait for answers no longer than ``seconds`` from now in all (`time_left`);
    an enclosing earlier deadline stays. None: no deadline is added. Seen by the event loop
    gcsfs runs its requests on (asyncio copies the caller's context into its tasks)."""
    if seconds is None:
        yield
        return
    ends = time.monotonic() + seconds
    current = _deadline.get()
    token = _deadline.set(ends if current is None else min(current, ends))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left(default: float | None = None) -> float | None:
    """Seconds a request may still wait: ``default`` without a deadline, else at most what is left
    (never below a millisecond: a request with no time left fails at once)."""
    ends = _deadline.get()
    if ends is None:
        return default
    left = max(0.001, ends - time.monotonic())
    return left if default is None else min(default, left)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient error.

    Args:
        attempts: Total tries, the first included. Defaults to 5.
        initial_delay: Seconds before the second try; doubles each time. Defaults to 0.5.
        max_delay: Upper bound of one wait, in seconds. Defaults to 8.
        budget: Seconds one operation may take in all, its retries and its waits for answers
            included (the module docstring); None: no bound but the tries. Defaults to None.
    """

    attempts: int = 5
    initial_delay: float = 0.5
    max_delay: float = 8.0
    budget: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(
                f"Invalid value for argument `attempts`. Received: attempts={self.attempts!r}. "
                "Expected an int >= 1."
            )
        for name in ("initial_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(
                    f"Invalid value for argument `{name}`. Received: {name}={value!r}. "
                    "Expected a number of seconds >= 0."
                )
        if self.budget is not None and not (isinstance(self.budget, (int, float)) and self.budget > 0):
            raise ValueError(
                f"Invalid value for argument `budget`. Received: budget={self.budget!r}. "
                "Expected a number of seconds > 0, or None."
            )

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn``, retrying transient errors; ``what`` names the operation in the log.

        With a `budget`, ``fn`` runs within its deadline (`deadline_in`) and no retry is started
        whose wait would end past it: the last error is raised instead.
        """
        with deadline_in(self.budget):
            return self._call(fn, what)

    def _call(self, fn: Callable[[], T], what: str) -> T:
        delay = self.initial_delay
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if attempt == self.attempts or not is_transient(exc):
                    raise
                wait = min(delay, self.max_delay) * (0.5 + _JITTER.random() / 2)
                left = time_left()
                if left is not None and wait >= left:
                    raise  # out of budget: the error as it is, not a wait that ends too late
                logger.warning(
                    "resumable: %s failed (%s: %s); retry %d of %d in %.1f s",
                    what, type(exc).__name__, redact(str(exc)), attempt, self.attempts - 1, wait,
                )
                time.sleep(wait)
                delay *= 2
        raise AssertionError("unreachable")  # the loop either returns or raises
