"""A checkpoint's big files (weights in shards) move several at a time (storage/transfers.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import stage

from resumable import Manifest, ResumableError, RunStorage, Status
from resumable.core.manifest import MANIFEST_NAME
from resumable.storage import transfers
from resumable.storage.transfers import FILES_AT_ONCE, Transfers

KIB = 1024
SHARDS = {f"model_{i:05d}.weights.h5": os.urandom(40 * KIB + i) for i in range(7)}
SMALL = {"state.json": b"{}", "model.weights.json": b'{"weight_map": {}}'}


@pytest.fixture(autouse=True)
def _small_big_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of 32 KiB count as big here (4 MiB in use): the shards above move together."""
    monkeypatch.setattr(transfers, "TOGETHER_MIN_BYTES", 32 * KIB)


def stage_all(folder: Path) -> Path:
    return stage(folder, {**SHARDS, **SMALL})


class InFlight:
    """Counts the calls of one method running at the same time; each takes a little while."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.now = 0
        self.most = 0
        self.threads: set[str] = set()
        self.rels: list[str] = []
        self._lock = threading.Lock()
        original = getattr(Transfers, name)

        def counted(transfers_: Transfers, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.now += 1
                self.most = max(self.most, self.now)
                self.threads.add(threading.current_thread().name)
                self.rels.append(args[1] if name == "_fetch_file" else args[2])
            try:
                time.sleep(0.05)  # long enough for the others to start
                return original(transfers_, *args, **kwargs)
            finally:
                with self._lock:
                    self.now -= 1

        monkeypatch.setattr(Transfers, name, counted)


def test_shards_go_up_several_at_a_time(storage: RunStorage, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    uploads = InFlight(monkeypatch, "upload")
    info = storage.commit(stage_all(tmp_path / "staged"), "ckpt-000001", Manifest(epoch=1), progress=False)
    assert 1 < uploads.most <= FILES_AT_ONCE
    assert any(name.startswith("resumable-files") for name in uploads.threads)
    assert sorted(uploads.rels) == sorted({**SHARDS, **SMALL})  # each file once
    assert info.manifest is not None and set(info.manifest.files) == {*SHARDS, *SMALL}
    assert storage.verify("ckpt-000001") == []


def test_files_named_last_come_down_last_in_that_order_each_announced(storage: RunStorage,
                                                                     tmp_path: Path) -> None:
    """What a loader reading shards as they land relies on (manager/arrival.py)."""
    storage.commit(stage_all(tmp_path / "staged"), "ckpt-000001", Manifest(epoch=1), progress=False)
    last = sorted(SHARDS, reverse=True)  # any order the caller asks for
    landed: list[tuple[str, bool]] = []
    target = tmp_path / "cache"

    def announce(rel: str) -> None:
        landed.append((rel, (target / rel).read_bytes() == {**SHARDS, **SMALL}[rel]))

    fetched = storage.fetch("ckpt-000001", target, progress=False, landed=announce, last=last)
    names = [rel for rel, _ in landed]
    assert set(names[:len(SMALL)]) == set(SMALL) and names[len(SMALL):] == last
    assert all(whole for _, whole in landed)  # announced once in place, whole
    assert not list(fetched.glob("*.part"))


def test_one_failed_shard_stops_the_others_and_commits_nothing(storage: RunStorage, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    original = Transfers.upload
    started: list[str] = []

    def upload(self: Transfers, local: Path, name: str, rel: str, **kwargs: Any) -> Any:
        started.append(rel)
        if rel == "model_00001.weights.h5":
            raise ResumableError(f"{rel}: refused by the test")
        time.sleep(0.05)
        return original(self, local, name, rel, **kwargs)

    monkeypatch.setattr(Transfers, "upload", upload)
    with pytest.raises(ResumableError, match="model_00001.weights.h5: refused by the test"):
        storage.commit(stage_all(tmp_path / "staged"), "ckpt-000001", Manifest(epoch=1), progress=False)
    assert len([rel for rel in started if rel in SHARDS]) < len(SHARDS)  # those not started never were
    (info,) = storage.list()
    assert info.status is Status.PARTIAL and MANIFEST_NAME not in info.listed


def test_a_failure_elsewhere_stops_an_upload_at_its_next_chunk(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The others are told through the chunk hook: they end before sending their next chunk."""
    monkeypatch.setattr(transfers, "CHUNK_SIZE", 4 * KIB)
    storage = RunStorage(str(tmp_path / "run"))
    chunks: list[str] = []
    failing = threading.Event()

    def between_chunks() -> None:
        chunks.append(threading.current_thread().name)
        if len(chunks) == 3:
            failing.set()
            raise ResumableError("the lease was lost (by the test)")
        time.sleep(0.01)

    with pytest.raises(ResumableError, match="lease was lost"):
        storage.commit(stage_all(tmp_path / "staged"), "ckpt-000001", Manifest(epoch=1), progress=False,
                       between_chunks=between_chunks)
    # 7 shards of 10 or 11 chunks: without the stop, about 75 chunks would have been asked for
    assert failing.is_set() and len(chunks) < 3 + 2 * FILES_AT_ONCE
    (info,) = storage.list()
    assert info.status is Status.PARTIAL


def test_one_progress_line_for_the_files_moved_together(storage: RunStorage, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(transfers, "PROGRESS_MIN_BYTES", 1)
    storage.commit(stage_all(tmp_path / "staged"), "ckpt-000001", Manifest(epoch=1), progress=True)
    storage.fetch("ckpt-000001", tmp_path / "cache", progress=True)
    lines = capsys.readouterr().err.splitlines()
    total = sum(len(data) for data in SHARDS.values())
    together = [line for line in lines if "(7 files)" in line]
    assert [line.split(":")[1].strip() for line in together] == ["upload ckpt-000001 (7 files)",
                                                                 "download ckpt-000001 (7 files)"]
    assert all(f"{total / KIB:.1f} KB in " in line for line in together), together
    assert not any("model_0000" in line for line in lines)  # no line per shard
