"""A GCS server that fails: every command ends with its one line within its time budget.

The server is the real fake-gcs-server behind `fault_proxy.FaultProxy`, which answers 500,
429, 403, resets connections or stalls as told. Commands run as a user runs them: ``python -m
resumable ...`` in a process of its own, its stderr read as the terminal would show it (gcsfs'
and the other libraries' log lines included).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import FaultProxy, Rule
from storage_helpers import commit

from resumable import Manifest, RunStorage
from resumable.storage import retry
from resumable.storage.errors import translate

COMMANDS = {
    "list": ["list"],
    "list-deep": ["list", "--deep"],
    "inspect": ["inspect"],
    "verify": ["verify"],
    "verify-latest": ["verify", "--latest"],
    "prune": ["prune", "--keep-last", "1", "--yes"],
}


@pytest.fixture
def proxy(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server) as running:
        yield running


@pytest.fixture
def run(gcs_bucket: str, tmp_path: Path) -> str:
    """A run of three checkpoints, written straight to the server."""
    url = f"{gcs_bucket}/runs/exp1"
    storage = RunStorage(url)
    for epoch in (1, 2, 3):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 10))
    return url


def command(proxy: FaultProxy, *args: str, timeout: float | None = None,
            env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """``python -m resumable ARGS`` against the proxy: (exit code, stdout, stderr, seconds)."""
    environment = {**os.environ, "STORAGE_EMULATOR_HOST": proxy.url, "FSSPEC_GCS_TOKEN": "anon",
                   "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", **(env or {})}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "resumable", *args], capture_output=True, text=True,
                          env=environment, timeout=timeout or 120, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def error_line(stderr: str) -> str:
    """The one ``error:`` line, after any retry lines; and never a raw control character."""
    assert "\x1b" not in stderr and "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


STARTUP = 8.0  # seconds a `python -m resumable` process takes to start and list here, under load


@pytest.mark.parametrize("args", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_command_against_a_server_answering_500_ends_within_its_budget(
        proxy: FaultProxy, run: str, args: list[str]) -> None:
    proxy.add(Rule(500, match="/storage/v1/b/", times=None, message="backend error"),
              Rule(500, match="/download/", times=None))
    code, _, stderr, took = command(proxy, *args, run, "--timeout", "4")
    assert code == 2
    line = error_line(stderr)
    assert "500" in line or "backend error" in line, line
    assert took < 4 + STARTUP, (took, stderr)


def test_the_budget_comes_from_the_environment_too(proxy: FaultProxy, run: str) -> None:
    proxy.add(Rule(503, times=None))
    code, _, stderr, took = command(proxy, "list", run, env={retry_variable(): "3"})
    assert code == 2 and took < 3 + STARTUP, (took, stderr)
    code, _, stderr, _ = command(proxy, "list", run, env={retry_variable(): "soon"})
    assert code == 2 and error_line(stderr) == (
        f"error: {retry_variable()}='soon': expected a positive number of seconds, e.g. 30")


def retry_variable() -> str:
    from resumable.cli import budget

    return budget.VARIABLE


def test_a_server_that_never_answers_is_one_line_within_the_budget(proxy: FaultProxy, run: str) -> None:
    proxy.add(Rule("stall", times=None, seconds=60))
    code, _, stderr, took = command(proxy, "list", run, "--timeout", "3")
    assert code == 2 and took < 3 + STARTUP, (took, stderr)
    assert "no answer from the storage within" in error_line(stderr)


def test_resets_and_429s_that_pass_are_retried_within_the_budget(proxy: FaultProxy, run: str) -> None:
    proxy.add(Rule("reset", match="/o", times=2), Rule(429, match="/o", times=2))
    code, stdout, stderr, _ = command(proxy, "verify", run, "--timeout", "20")
    assert code == 0, stderr
    assert "verified 3 checkpoints: all files match their manifests" in stdout
    assert len(proxy.outcomes("reset")) == 2 and len(proxy.outcomes("429")) == 2


def test_a_403_is_a_permission_error_in_one_line(proxy: FaultProxy, run: str) -> None:
    proxy.add(Rule(403, times=None, message="nobody@p.iam.gserviceaccount.com may not list objects"))
    code, _, stderr, _ = command(proxy, "list", run, "--timeout", "5")
    assert code == 2
    line = error_line(stderr)
    assert "permission denied; check that this account may read and write it" in line, line


def test_a_server_s_control_characters_never_reach_the_terminal(proxy: FaultProxy, run: str) -> None:
    """gcsfs logs the server's text as it came (its 'out of retries' line): escaped, one line each."""
    proxy.add(Rule(500, times=None, message="\x1b[2J\x1b[31mcleared your screen\x1b]0;title\x07"))
    code, _, stderr, _ = command(proxy, "list", run, "--timeout", "3")
    assert code == 2 and "\x1b" not in stderr and "\x07" not in stderr
    assert "\\x1b[2J" in stderr  # shown, escaped
    error_line(stderr)


def test_a_bucket_listed_through_resets_lists_as_usual(proxy: FaultProxy, run: str) -> None:
    proxy.add(Rule("reset", nth=1, times=1))
    code, stdout, stderr, _ = command(proxy, "list", run)
    assert code == 0, stderr
    assert "3 checkpoints (3 ok)" in stdout


# ----------------------------------------------------------------------------- in one process


def test_gcsfs_forbidden_is_storage_permission_error() -> None:
    from resumable import StoragePermissionError

    error = translate(OSError("Forbidden: b/runs/exp1\nnobody may list"), "gs://b/runs/exp1", "gs://b/runs/exp1",
                      "b/runs/exp1", is_gcs=True, is_local=False)
    assert isinstance(error, StoragePermissionError)


def test_a_budget_stops_retrying_before_its_end() -> None:
    calls = []

    def failing() -> None:
        calls.append(time.monotonic())
        raise ConnectionError("reset")

    policy = retry.RetryPolicy(attempts=50, initial_delay=0.2, max_delay=0.2, budget=1.0)
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        policy.call(failing, "read")
    # a retry past the budget would add 0.2 s at least; the slack is for a busy CI machine's scheduling
    assert 0.5 < time.monotonic() - started <= 1.15
    assert 3 <= len(calls) < 50


def test_time_left_is_the_request_timeout_within_a_budget() -> None:
    assert retry.time_left(60.0) == 60.0
    with retry.deadline_in(2.0):
        assert 1.9 < (retry.time_left(60.0) or 0) <= 2.0
        with retry.deadline_in(30.0):  # an enclosing, earlier deadline stays
            assert (retry.time_left(60.0) or 0) <= 2.0
    assert retry.time_left() is None
