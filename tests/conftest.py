"""Shared fixtures: a real fake-gcs-server process, one run folder per backend, and Ctrl-C as a
notebook has it."""

from __future__ import annotations

import os
import shutil
import signal

# Before anything imports gcsfs: its gRPC bucket probe stalls ~60 s against an emulator.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fake_gcs import fake_gcs_server, point_gcs_clients_at

from resumable.storage.lease import _release_at_exit as release_leases_held

BACKENDS = ["local", "memory", "gcs"]
GIB_PER_WORKER = 3  # a worker's own TensorFlow and JAX, a training job it forks, a 0.6 GB resume
DISK_GIB = 3  # the suite's peak under TMPDIR: 2.3 GB on two workers and on three (was 5.5)


def pytest_configure(config: pytest.Config) -> None:
    """A full disk fails tests far from the cause (CI once did, in five places): say it first."""
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller checked
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 2**30
    if free < DISK_GIB:
        pytest.exit(f"the suite writes up to {DISK_GIB} GB under {tmp}, and {free:.1f} GB is free there: "
                    "free some space, or point TMPDIR at a larger disk", returncode=4)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the lanes run without xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the README's command): a worker per usable CPU and one more, as memory allows.

    The suite's tests wait on processes they start, on real lease timeouts and on sleeps: on two
    CPUs, two workers left them idle part of the time (15.2 to 15.8 min), three took 13.5 to 14.7.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    fits = memory // (GIB_PER_WORKER * 2**30) if memory else cpus
    return max(1, min(cpus + 1, fits))


@pytest.fixture(scope="session", autouse=True)
def _private_tempdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Staging folders default to <tempdir>/resumable-cache: keep this run's inside pytest's tmp.

    Set in the environment too, so training subprocesses and notebook kernels use it.
    """
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    tempfile.tempdir = None  # recomputed from TMPDIR on next use
    yield
    shutil.rmtree(Path(tempfile.gettempdir()) / "resumable-cache", ignore_errors=True)
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
    tempfile.tempdir = None


@pytest.fixture(scope="module", autouse=True)
def _module_caches_removed() -> Iterator[None]:
    """A gs:// run stages and keeps copies under <tempdir>/resumable-cache/<run>, by design. Each
    test's run is its own, so remove the copies a module made when it ends: the suite's disk use
    stays about one module's (a GB), not the sum of them all (over 5 GB)."""
    cache = Path(tempfile.gettempdir()) / "resumable-cache"
    before = set(cache.iterdir()) if cache.is_dir() else set()
    yield
    for entry in (set(cache.iterdir()) if cache.is_dir() else set()) - before:
        shutil.rmtree(entry, ignore_errors=True)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    """Start fake-gcs-server on 127.0.0.1 over http; point gcsfs and fsspec at it."""
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "FSSPEC_GCS_TOKEN")}
    with fake_gcs_server() as endpoint:
        point_gcs_clients_at(endpoint)
        yield endpoint
        # A lease still held (a fit a test ended with an exception) is released as at exit, but
        # while the emulator answers: at exit its release would go to the real GCS' address.
        release_leases_held()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    fsspec.config.conf.get("gcs", {}).pop("token", None)


@pytest.fixture
def ctrl_c_as_in_a_notebook() -> Iterator[None]:
    """SIGINT raising KeyboardInterrupt, as in a notebook or a terminal, even where this test process
    was started with SIGINT ignored (a background job of a non-interactive shell: resumable then
    leaves it ignored, on purpose)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


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
