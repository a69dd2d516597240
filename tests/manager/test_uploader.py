"""Uploader: background commits on every backend, with plain files; no Keras."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gated_fs import GatedFS
from storage_helpers import staged_checkpoint

from resumable import RunStorage
from resumable.core.checksum import CHUNK_SIZE
from resumable.core.errors import StorageError
from resumable.core.manifest import Manifest
from resumable.manager.uploader import Uploader
from resumable.storage import PROGRESS_MIN_BYTES
from resumable.storage.retry import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.01)


def stage(root: Path, epoch: int, size: int = 1000) -> tuple[Path, str, Manifest]:
    files = {"model.keras": bytes([epoch % 256]) * size, "state.json": f'{{"epoch": {epoch}}}'.encode()}
    return staged_checkpoint(root, epoch, files)


def committed(storage: RunStorage) -> list[str]:
    return [c.name for c in storage.list() if c.ok]


def test_submit_returns_at_once_and_a_newer_job_replaces_the_waiting_one(
    run_url: str, tmp_path: Path
) -> None:
    storage = RunStorage(run_url, retry=FAST_RETRY)
    gate = threading.Event()
    storage.fs = GatedFS(storage.fs, gate)
    uploader = Uploader(storage, cache_dir=tmp_path / "committed")
    jobs = [stage(tmp_path, epoch) for epoch in (1, 2, 3)]

    started = time.monotonic()
    uploader.commit_later(*jobs[0])
    assert storage.fs.entered.wait(10)  # ckpt 1 is in flight, blocked in its upload
    uploader.commit_later(*jobs[1])  # waits
    uploader.commit_later(*jobs[2])  # replaces ckpt 2
    assert time.monotonic() - started < 5  # nothing waited for the upload (the gate is closed)
    assert uploader.pending == ["ckpt-000001", "ckpt-000003"]
    assert uploader.replaced == ["ckpt-000002"]
    assert not jobs[1][0].exists()  # the replaced job's staged copy is gone
    assert committed(storage) == []

    gate.set()
    assert uploader.wait(timeout=60)
    assert committed(storage) == ["ckpt-000001", "ckpt-000003"]
    assert uploader.committed == ["ckpt-000001", "ckpt-000003"]
    # committed staged copies are removed, but the newest is kept as a local copy
    assert not (tmp_path / "staging" / "ckpt-000001").exists()
    assert not (tmp_path / "staging" / "ckpt-000003").exists()
    assert sorted(p.name for p in (tmp_path / "committed").iterdir()) == ["ckpt-000003"]
    assert storage.verify("ckpt-000003") == []
    # the next save drops that copy first; the run folder keeps everything
    uploader.drop_cached()
    assert list((tmp_path / "committed").iterdir()) == []
    assert committed(storage) == ["ckpt-000001", "ckpt-000003"] and storage.verify("ckpt-000003") == []


def test_two_saves_before_the_upload_thread_runs_are_both_committed(run_url: str, tmp_path: Path) -> None:
    """The second save comes before the uploader's thread took the first (a loaded machine; a
    BackupAndRestore(double_checkpoint=True) fit lost its first backup so): the first is in
    flight, not waiting, and is never replaced. Only a third save replaces a waiting one."""
    storage = RunStorage(run_url, retry=FAST_RETRY)
    said: list[str] = []
    uploader = Uploader(storage, on_skipped=said.append)
    jobs = [stage(tmp_path, epoch) for epoch in (1, 2)]
    with uploader._worker.cond:  # the thread takes nothing while the lock is held: it has not run yet
        uploader.commit_later(*jobs[0])
        uploader.commit_later(*jobs[1])
        assert uploader.pending == ["ckpt-000001", "ckpt-000002"]
    assert uploader.wait(timeout=60)
    assert committed(storage) == ["ckpt-000001", "ckpt-000002"]
    assert uploader.replaced == [] and said == []


def test_errors_are_retried_then_warned_and_the_next_submit_tries_again(
    run_url: str, tmp_path: Path
) -> None:
    storage = RunStorage(run_url, retry=FAST_RETRY)
    storage.fs = GatedFS(storage.fs, failures=100)
    uploader = Uploader(storage)
    first = stage(tmp_path, 1)

    with pytest.warns(UserWarning, match="upload of ckpt-000001 failed.*Input/output error.*kept"):
        uploader.commit_later(*first)
        with pytest.raises(StorageError, match="Input/output error"):
            uploader.wait(timeout=30)
    assert len(storage.fs.puts) >= FAST_RETRY.attempts  # the storage layer retried with backoff
    assert first[0].is_dir()  # the local copy is kept
    assert uploader.pending == ["ckpt-000001"]
    assert committed(storage) == []

    storage.fs.failures = 0  # the network is back: the next save uploads both
    uploader.commit_later(*stage(tmp_path, 2))
    assert uploader.wait(timeout=30)
    assert committed(storage) == ["ckpt-000001", "ckpt-000002"]
    assert uploader.pending == []
    assert not first[0].exists()


def test_wait_retries_the_last_failed_checkpoint(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "run"), retry=FAST_RETRY)
    storage.fs = GatedFS(storage.fs, failures=FAST_RETRY.attempts)  # fails exactly one commit
    uploader = Uploader(storage)
    with pytest.warns(UserWarning, match="ckpt-000001"):
        uploader.commit_later(*stage(tmp_path, 1))
        while uploader.in_progress("ckpt-000001"):
            time.sleep(0.01)
    assert uploader.wait(timeout=30)  # tries again, and this time it lands
    assert committed(storage) == ["ckpt-000001"]


def test_a_newer_commit_supersedes_an_older_failure(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "run"), retry=FAST_RETRY)
    storage.fs = GatedFS(storage.fs, failures=2 * FAST_RETRY.attempts)  # ckpt 1 fails twice
    uploader = Uploader(storage)
    first = stage(tmp_path, 1)
    with pytest.warns(UserWarning, match="ckpt-000001"):
        uploader.commit_later(*first)
        with pytest.raises(StorageError):
            uploader.wait(timeout=30)
        uploader.commit_later(*stage(tmp_path, 2))  # retries ckpt 1 (fails again), then ckpt 2 lands
        assert uploader.wait(timeout=30)
    assert committed(storage) == ["ckpt-000002"]
    assert uploader.pending == [] and not first[0].exists()


def test_on_commit_runs_after_each_commit_before_the_next_upload(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "run"))
    seen: list[tuple[str, list[str], str]] = []

    def on_commit(info: Any) -> None:
        seen.append((info.name, committed(storage), threading.current_thread().name))

    uploader = Uploader(storage, on_commit=on_commit)
    uploader.commit_later(*stage(tmp_path, 1))
    uploader.wait()
    uploader.commit_later(*stage(tmp_path, 2))
    uploader.wait()
    assert seen == [
        ("ckpt-000001", ["ckpt-000001"], "resumable-uploader"),
        ("ckpt-000002", ["ckpt-000001", "ckpt-000002"], "resumable-uploader"),
    ]


def test_commit_now_is_synchronous_and_raises(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "run"), retry=FAST_RETRY)
    storage.fs = GatedFS(storage.fs, failures=100)
    uploader = Uploader(storage)
    job = stage(tmp_path, 1)
    with pytest.raises(StorageError, match="Input/output error"):
        uploader.commit_now(*job)
    assert job[0].is_dir()
    storage.fs.failures = 0
    assert uploader.commit_now(*job).name == "ckpt-000001"
    assert committed(storage) == ["ckpt-000001"] and not job[0].exists()
    assert uploader._thread is None  # no thread in synchronous mode


EXIT_SCRIPT = """
import sys, time
from pathlib import Path
from resumable import RunStorage
from resumable.core.manifest import Manifest
from resumable.manager.uploader import Uploader

class SlowFS:
    def __init__(self, fs): self._fs = fs
    def __getattr__(self, name): return getattr(self._fs, name)
    def open(self, path, mode="rb", **kwargs):
        if "w" in mode:
            time.sleep(1.0)
        return self._fs.open(path, mode, **kwargs)

root, url = Path(sys.argv[1]), sys.argv[2]
storage = RunStorage(url)
storage.list()  # the first request opens the HTTP session, as training's checks do
storage.fs = SlowFS(storage.fs)
staged = root / "staging" / "ckpt-000001"
staged.mkdir(parents=True)
(staged / "model.keras").write_bytes(b"x" * 1000)
Uploader(storage).commit_later(staged, "ckpt-000001", Manifest(epoch=1, step=1))
print("SUBMITTED", flush=True)
"""


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_interpreter_exit_waits_for_the_pending_upload(run_url: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(tmp_path), run_url], capture_output=True, text=True,
        timeout=60, env={**os.environ, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"},
    )
    assert result.returncode == 0, result.stderr
    assert "SUBMITTED" in result.stdout
    assert "finishing the upload of ckpt-000001" in result.stderr
    assert "failed" not in result.stderr
    assert committed(RunStorage(run_url)) == ["ckpt-000001"]


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_big_transfers_show_a_progress_bar(
    run_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = RunStorage(run_url)
    folder, name, manifest = stage(tmp_path, 1, size=PROGRESS_MIN_BYTES + 1)
    storage.commit(folder, name, manifest, progress=True)
    storage.fetch(name, tmp_path / "cache", progress=True)
    err = capsys.readouterr().err
    assert "resumable: upload model.keras" in err and "resumable: download model.keras" in err
    assert "B/s" in err  # throughput
    assert "state.json" not in err  # small files get no bar


def test_paused_holds_the_upload_in_flight_between_chunks(tmp_path: Path) -> None:
    """While the next checkpoint serializes, the upload waits; it goes on when the save is done."""
    storage = RunStorage(str(tmp_path / "run"), retry=FAST_RETRY)
    chunks: list[float] = []
    uploader: Uploader

    def commit(staged: Path, name: str, manifest: Manifest) -> Any:
        def between_chunks() -> None:
            chunks.append(time.monotonic())
            uploader.between_chunks()

        return storage.commit(staged, name, manifest, between_chunks=between_chunks)

    uploader = Uploader(storage, commit=commit)
    folder, name, manifest = stage(tmp_path, 1, size=3 * CHUNK_SIZE)  # three chunks
    with uploader.paused():
        uploader.commit_later(folder, name, manifest)
        time.sleep(0.5)
        assert uploader.in_progress(name) and len(chunks) == 1  # held before its first chunk
        assert committed(storage) == []
        # the caller's own commits never wait, paused or not (synchronous saves run in its thread)
        other = stage(tmp_path, 2, size=3 * CHUNK_SIZE)
        assert storage.commit(*other, between_chunks=uploader.between_chunks).ok
        released = time.monotonic()
    assert uploader.wait(30)
    assert committed(storage) == ["ckpt-000001", "ckpt-000002"]
    assert len(chunks) == 3 + 1  # three chunks of model.keras, one of state.json
    assert chunks[1] >= released  # the second chunk went only after the pause


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_verbose_callback_shows_upload_progress(where: str, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """An upload shows its progress; a local run's files are written into it, with nothing to upload."""
    import keras

    import resumable

    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")  # 4 MB of weights, 12 MB with Adam's slots
    x, y = np.zeros((8, 1024), "float32"), np.zeros((8, 1), "float32")
    url = str(tmp_path / "run") if where == "local" else f"memory://run-{tmp_path.name}"
    checkpoint = resumable.CheckpointCallback(url, staging_dir=tmp_path / "stage", verbose=1)
    model.fit(x, y, epochs=1, verbose=0, callbacks=[checkpoint])
    captured = capfd.readouterr()
    if where == "local":
        assert "upload model.keras" not in captured.err and f"saved {url}/ckpt-000001" in captured.out
    else:
        assert "resumable: upload model.keras" in captured.err and "B/s" in captured.err


def test_a_replaced_job_is_said_and_when_behind_wait_keeps_every_one(run_url: str, tmp_path: Path) -> None:
    """Uploads slower than saves: "skip" says which checkpoint was dropped (why, the first time);
    "wait" blocks the submit until the slot is free, and every checkpoint is committed."""
    for when_behind in ("skip", "wait"):
        storage = RunStorage(f"{run_url}/{when_behind}", retry=FAST_RETRY)
        gate = threading.Event()
        storage.fs = GatedFS(storage.fs, gate)
        said: list[str] = []
        uploader = Uploader(storage, when_behind=when_behind, on_skipped=said.append)
        jobs = [stage(tmp_path / when_behind, epoch) for epoch in (1, 2, 3, 4)]
        uploader.commit_later(*jobs[0])
        assert storage.fs.entered.wait(10)  # ckpt 1 in flight, held
        uploader.commit_later(*jobs[1])  # waits in the slot
        submitter = threading.Thread(target=lambda u=uploader, later=jobs[2:]: [
            u.commit_later(*j) for j in later])
        submitter.start()
        submitter.join(1.0)
        if when_behind == "wait":
            assert submitter.is_alive() and said == []  # training would wait here
        gate.set()
        submitter.join(30)
        assert not submitter.is_alive() and uploader.wait(timeout=60)
        if when_behind == "wait":
            assert committed(storage) == ["ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004"]
            assert said == [] and uploader.replaced == []
            continue
        assert committed(storage) == ["ckpt-000001", "ckpt-000004"] and uploader.replaced == [
            "ckpt-000002", "ckpt-000003"]
        assert said == [
            "resumable: epoch 2 (ckpt-000002) not uploaded: the upload of ckpt-000001 was still "
            "running when epoch 3 was saved, so the newer ckpt-000003 took its place; pass "
            "when_behind='wait' to keep every checkpoint (training then waits for the uploads)",
            "resumable: epoch 3 (ckpt-000003) not uploaded either: replaced by the newer ckpt-000004",
        ]
    with pytest.raises(ValueError, match="`when_behind`. Received: when_behind='never'"):
        Uploader(RunStorage(run_url), when_behind="never")
