"""Crash consistency of RunStorage.commit, on every backend.

A commit killed between any two of its writes (a child process killed with SIGKILL, or an
exception raised in-process) leaves the previous latest checkpoint intact and the partial
one reported and ignored; the same name can then be committed again. A flipped byte in a
payload file is caught by the checksum.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from paths import JOBS, ROOT

from resumable import CorruptCheckpointError, Manifest, RetryPolicy, RunStorage, Status, StorageError

JOB = JOBS / "commit_job.py"
_spec = importlib.util.spec_from_file_location("commit_job", JOB)
assert _spec and _spec.loader
job: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(job)

N = job.WRITES_PER_COMMIT
MANIFEST_WRITE = job.MANIFEST_WRITE
INDEX_WRITE = N  # the run index is rewritten after the manifest: the checkpoint is committed by then
# Every write position of a commit; "after" the last write means the commit did finish.
CASES = [(k, "before") for k in range(1, N + 1)] + [(k, "torn") for k in range(1, N + 1)] + [(N, "after")]
# The child-process variant costs a Python start each: every "before", a torn payload file,
# a torn manifest and the control case that dies right after the manifest landed.
KILL_CASES = [(k, "before") for k in range(1, N + 1)] + [
    (1, "torn"), (MANIFEST_WRITE, "torn"), (MANIFEST_WRITE, "after"), (N, "torn"), (N, "after")]


def expected_status(k: int, mode: str) -> Status | None:
    """What list() must say about checkpoint 2 after dying at write k (None: absent)."""
    if mode == "after" and k == MANIFEST_WRITE or k == INDEX_WRITE:
        return Status.OK
    if k == MANIFEST_WRITE and mode == "torn":
        return Status.CORRUPT  # half a manifest: not valid JSON
    if k == 1 and mode == "before":
        return None  # nothing was written yet
    return Status.PARTIAL  # payload written, no manifest


def check_after_crash(url: str, tmp_path: Path, k: int, mode: str) -> None:
    storage = RunStorage(url, retry=RetryPolicy(attempts=2, initial_delay=0.001))
    statuses = {info.name: info for info in storage.list()}
    # The quick listing (names + run index) agrees with the full one after any crash.
    quick = {info.name: info.status for info in storage.list(check_files=False)}
    assert quick == {name: info.status for name, info in statuses.items()}
    want = expected_status(k, mode)
    assert statuses["ckpt-000001"].status is Status.OK
    if want is None:
        assert "ckpt-000002" not in statuses
    else:
        assert statuses["ckpt-000002"].status is want, statuses["ckpt-000002"]
    latest = storage.latest()
    assert latest is not None
    if want is Status.OK:
        assert latest.name == "ckpt-000002"
        assert storage.verify(latest) == []
        return
    assert (latest.name, latest.epoch, latest.step) == ("ckpt-000001", 1, 100)
    cache = storage.fetch(latest, tmp_path / "cache1")
    for rel, data in job.payload(1).items():
        assert (cache / rel).read_bytes() == data
    if want is not None:
        assert not statuses["ckpt-000002"].ok
        assert statuses["ckpt-000002"].problem  # says why it is not used

    # The same name commits cleanly over the leftovers and becomes the latest.
    again = storage.commit(job.stage(tmp_path / "again", 2), "ckpt-000002", Manifest(epoch=2, step=200))
    assert again.ok
    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000002"
    assert storage.verify(latest) == []
    cache = storage.fetch(latest, tmp_path / "cache2")
    for rel, data in job.payload(2).items():
        assert (cache / rel).read_bytes() == data
    assert [i.status for i in storage.list()] == [Status.OK, Status.OK]


def test_a_clean_commit_makes_exactly_the_writes_we_parametrize_over(
    run_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = RunStorage(run_url)
    log = job.wrap_writes(storage.fs, 0, "before", job.raise_fault, monkeypatch.setattr)
    storage.commit(job.stage(tmp_path / "s", 1), "ckpt-000001", Manifest(epoch=1))
    assert len(log) == N, log
    assert log[-2].endswith("ckpt-000001/manifest.json")  # the manifest commits, after every payload file
    assert "/index.json" in log[-1]  # then the run index
    assert sorted(line.split("ckpt-000001/")[1] for line in log[:-2]) == sorted(job.PAYLOAD)


@pytest.mark.parametrize(("k", "mode"), CASES, ids=[f"{m}-write{k}" for k, m in CASES])
def test_exception_at_any_write_leaves_previous_latest(
    run_url: str, tmp_path: Path, k: int, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = RunStorage(run_url)
    storage.commit(job.stage(tmp_path / "s1", 1), "ckpt-000001", Manifest(epoch=1, step=100))
    log = job.wrap_writes(storage.fs, k, mode, job.raise_fault, monkeypatch.setattr)
    if k == INDEX_WRITE:
        # The manifest landed: the commit stands, the index failure is only a warning.
        assert storage.commit(job.stage(tmp_path / "s2", 2), "ckpt-000002", Manifest(epoch=2, step=200)).ok
        monkeypatch.undo()
        assert [i.name for i in storage.list(check_files=False)] == ["ckpt-000001", "ckpt-000002"]
        return
    with pytest.raises(StorageError) as caught:
        storage.commit(job.stage(tmp_path / "s2", 2), "ckpt-000002", Manifest(epoch=2, step=200))
    assert isinstance(caught.value.__cause__, job.InjectedFault)
    assert len(log) == k
    monkeypatch.undo()
    check_after_crash(run_url, tmp_path, k, mode)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.parametrize(("k", "mode"), KILL_CASES, ids=[f"{m}-write{k}" for k, m in KILL_CASES])
def test_sigkill_at_any_write_leaves_previous_latest(
    where: str, k: int, mode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = str(tmp_path / "run") if where == "local" else request.getfixturevalue("gcs_bucket") + "/runs/exp1"
    env = dict(os.environ, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(JOB), url, str(tmp_path), str(k), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    assert "committed ckpt-000001" in done.stdout
    assert f"write {k}:" in done.stdout and f"write {k + 1}:" not in done.stdout, done.stdout
    check_after_crash(url, tmp_path, k, mode)


@pytest.mark.parametrize("k", range(1, N + 1))
def test_transient_error_at_any_write_is_retried(
    run_url: str, tmp_path: Path, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO once at write k (Drive's FUSE mount), even after the bytes landed: the commit succeeds."""
    storage = RunStorage(run_url, retry=RetryPolicy(attempts=3, initial_delay=0.001))
    fired = []

    def eio_once() -> None:
        if not fired:
            fired.append(True)
            raise OSError(5, "Input/output error")

    job.wrap_writes(storage.fs, k, "after", eio_once, monkeypatch.setattr)
    info = storage.commit(job.stage(tmp_path / "s", 1), "ckpt-000001", Manifest(epoch=1))
    assert fired and info.ok
    monkeypatch.undo()
    assert [(i.name, i.status) for i in storage.list()] == [("ckpt-000001", Status.OK)]
    assert storage.verify("ckpt-000001") == []


# ------------------------------------------------------------------- flipped byte


def flip_byte(storage: RunStorage, name: str, rel: str, offset: int = 100) -> None:
    path = f"{storage.root}/{name}/{rel}"
    data = bytearray(storage.fs.cat_file(path))
    data[offset] ^= 0x01
    storage.fs.pipe_file(path, bytes(data))  # same size, one bit differs


def test_flipped_byte_is_caught_by_the_checksum(run_url: str, backend: str, tmp_path: Path) -> None:
    storage = RunStorage(run_url)
    storage.commit(job.stage(tmp_path / "s1", 1), "ckpt-000001", Manifest(epoch=1))
    storage.commit(job.stage(tmp_path / "s2", 2), "ckpt-000002", Manifest(epoch=2))
    flip_byte(storage, "ckpt-000002", "model.keras")

    problems = storage.verify("ckpt-000002")
    assert len(problems) == 1 and "ckpt-000002/model.keras" in problems[0] and "crc32c" in problems[0]
    assert storage.verify("ckpt-000001") == []
    with pytest.raises(CorruptCheckpointError, match="model.keras"):
        storage.fetch("ckpt-000002", tmp_path / "cache")
    assert not (tmp_path / "cache" / "model.keras").exists()  # nothing damaged left in the cache

    listed = {info.name: info for info in storage.list()}
    latest = storage.latest()
    assert latest is not None
    if backend == "gcs":
        # The GCS listing carries each object's crc32c: the damage shows without reading a byte.
        assert listed["ckpt-000002"].status is Status.CORRUPT
        assert "model.keras crc32c" in listed["ckpt-000002"].problem
        assert latest.name == "ckpt-000001"
        assert [i.name for i in storage.newest_first()] == ["ckpt-000001"]
    else:
        # A local or memory listing has sizes only: same size, so only reading finds it.
        assert listed["ckpt-000002"].status is Status.OK
        assert latest.name == "ckpt-000002"


def test_damage_visible_at_list_time_falls_back_on_every_backend(run_url: str, tmp_path: Path) -> None:
    storage = RunStorage(run_url)
    storage.commit(job.stage(tmp_path / "s1", 1), "ckpt-000001", Manifest(epoch=1))
    storage.commit(job.stage(tmp_path / "s2", 2), "ckpt-000002", Manifest(epoch=2))
    path = f"{storage.root}/ckpt-000002/model.keras"
    storage.fs.pipe_file(path, storage.fs.cat_file(path)[:-1])  # one byte short

    listed = {info.name: info for info in storage.list()}
    assert listed["ckpt-000002"].status is Status.CORRUPT
    assert "model.keras has" in listed["ckpt-000002"].problem
    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000001"
    assert [i.name for i in storage.newest_first()] == ["ckpt-000001"]
