"""Bounded exponential backoff: transient errors are retried a few times, permanent ones never."""

from __future__ import annotations

import errno

import pytest

from resumable.storage import retry as retry_module
from resumable.storage.retry import RetryPolicy, is_transient


class CodeError(Exception):
    """Like gcsfs' HttpError and google-api-core's errors: an HTTP status in ``.code``."""

    def __init__(self, code: object) -> None:
        super().__init__(f"HTTP {code}")
        self.code = code


def _aiohttp_errors() -> list[tuple[BaseException, bool]]:
    aiohttp = pytest.importorskip("aiohttp")
    return [
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientPayloadError("cut short"), True),
        (aiohttp.ClientConnectionError("refused"), True),
        (aiohttp.InvalidURL("x"), False),
    ]


def _requests_errors() -> list[tuple[BaseException, bool]]:
    requests = pytest.importorskip("requests")
    return [
        (requests.exceptions.ConnectionError("reset"), True),
        (requests.exceptions.ReadTimeout("slow"), True),
        (requests.exceptions.InvalidURL("x"), False),
    ]


TABLE: list[tuple[BaseException, bool]] = [
    (OSError(errno.EIO, "Input/output error"), True),  # Drive's FUSE mount
    (OSError(errno.ENOTCONN, "Transport endpoint is not connected"), True),  # Drive, Errno 107
    (OSError(errno.ESTALE, "Stale file handle"), True),
    (OSError(errno.ENOSPC, "No space left on device"), False),
    (OSError(errno.EACCES, "Permission denied"), False),
    (FileNotFoundError(errno.ENOENT, "No such file"), False),
    (FileExistsError(errno.EEXIST, "exists"), False),
    (CodeError(429), True),
    (CodeError(500), True),
    (CodeError(503), True),
    (CodeError("503"), True),
    (CodeError(408), True),
    (CodeError(404), False),
    (CodeError(403), False),
    (CodeError(401), False),
    (CodeError(412), False),  # precondition failed: create-only lost a race
    (CodeError(None), False),
    (CodeError(True), False),
    (TimeoutError(), True),
    (ConnectionResetError(), True),
    (ValueError("bad"), False),
    (KeyError("x"), False),
]


@pytest.mark.parametrize(
    ("exc", "transient"),
    TABLE + _aiohttp_errors() + _requests_errors(),
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waited: list[float] = []
    monkeypatch.setattr(retry_module.time, "sleep", waited.append)
    return waited


def flaky(errors: list[BaseException], result: str = "done"):  # type: ignore[no-untyped-def]
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return result

    return fn, calls


def test_transient_errors_are_retried_until_success(sleeps: list[float]) -> None:
    fn, calls = flaky([OSError(errno.EIO, "eio"), CodeError(503), OSError(errno.ENOTCONN, "gone")])
    assert RetryPolicy(attempts=5, initial_delay=0.01).call(fn, "upload") == "done"
    assert len(calls) == 4 and len(sleeps) == 3


def test_attempts_are_bounded_and_the_last_error_is_raised(sleeps: list[float]) -> None:
    errors: list[BaseException] = [CodeError(429) for _ in range(10)]
    fn, calls = flaky(errors)
    with pytest.raises(CodeError) as caught:
        RetryPolicy(attempts=3, initial_delay=0.01).call(fn, "list")
    assert caught.value.code == 429
    assert len(calls) == 3 and len(sleeps) == 2 and len(errors) == 7


@pytest.mark.parametrize(
    "error",
    [CodeError(404), CodeError(403), FileNotFoundError("x"), ValueError("x"), OSError(errno.ENOSPC, "full")],
)
def test_permanent_errors_are_never_retried(sleeps: list[float], error: BaseException) -> None:
    fn, calls = flaky([error])
    with pytest.raises(type(error)):
        RetryPolicy(attempts=5, initial_delay=0.01).call(fn, "read")
    assert len(calls) == 1 and sleeps == []


def test_backoff_doubles_with_jitter_and_is_capped(sleeps: list[float]) -> None:
    fn, _ = flaky([OSError(errno.EIO, "eio") for _ in range(7)])
    RetryPolicy(attempts=8, initial_delay=1.0, max_delay=4.0).call(fn, "x")
    bounds = [1, 2, 4, 4, 4, 4, 4]
    assert len(sleeps) == len(bounds)
    for waited, bound in zip(sleeps, bounds, strict=True):
        assert bound / 2 <= waited <= bound


def test_real_sleeps_with_tiny_delays() -> None:
    fn, calls = flaky([OSError(errno.EIO, "eio"), OSError(errno.EIO, "eio")])
    assert RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.002).call(fn, "x") == "done"
    assert len(calls) == 3


def test_retries_are_logged(sleeps: list[float], caplog: pytest.LogCaptureFixture) -> None:
    fn, _ = flaky([OSError(errno.ENOTCONN, "Transport endpoint is not connected")])
    with caplog.at_level("WARNING", logger="resumable"):
        RetryPolicy(initial_delay=0.01).call(fn, "upload model.keras")
    assert "upload model.keras failed" in caplog.text and "retry 1 of 4" in caplog.text


def test_one_attempt_means_no_retry(sleeps: list[float]) -> None:
    fn, calls = flaky([OSError(errno.EIO, "eio")])
    with pytest.raises(OSError):
        RetryPolicy(attempts=1).call(fn, "x")
    assert len(calls) == 1 and sleeps == []


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"initial_delay": -1}, "initial_delay"),
        ({"max_delay": "8"}, "max_delay"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], argument: str) -> None:
    with pytest.raises(ValueError, match=f"Invalid value for argument `{argument}`"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
