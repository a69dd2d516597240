"""A writer whose lease was taken over writes nothing more, even before its renewal notices.

The takeovers here are real: a second `Lease` on the same run folder takes it with
``takeover=True``. Only their timing is arranged, by running them from inside an upload.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from resumable import RunStorage
from resumable.core.checksum import CHUNK_SIZE
from resumable.core.errors import LeaseLostError
from resumable.core.manifest import MANIFEST_NAME, Manifest
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager
from resumable.storage.lease import Lease


def stage(manager: RunManager, epoch: int, size: int = 100) -> tuple[Path, str]:
    name = manager.storage.template.format(epoch, epoch * 10, {}, mid_epoch=False)
    folder = manager.writer.stage(name)
    folder.mkdir(parents=True)
    (folder / "model.keras").write_bytes(bytes([epoch]) * size)
    return folder, name


def good(storage: RunStorage) -> list[str]:
    return [c.name for c in storage.list() if c.ok]


def manifest_exists(storage: RunStorage, name: str) -> bool:
    return bool(storage.fs.exists(f"{storage.root}/{name}/{MANIFEST_NAME}"))


def test_a_takeover_during_the_upload_stops_the_manifest(run_url: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    manager = RunManager(run_url, staging_dir=tmp_path / "s")
    manager.writer.acquire()
    folder, name = stage(manager, 1, size=2 * CHUNK_SIZE + 1)
    thief = Lease(RunStorage(run_url))

    def take_over_once() -> None:  # the other writer takes the run while this one uploads
        if not thief.held:
            thief.acquire(takeover=True)

    monkeypatch.setattr(manager.writer.uploader, "between_chunks", take_over_once)
    manager.writer.submit(folder, name, Manifest(epoch=1, step=10))
    lost = pytest.raises(LeaseLostError, match="lost its writer lease")
    with caplog.at_level(logging.INFO, logger="resumable"), lost:
        manager.wait()
    assert not manifest_exists(manager.storage, name)
    assert good(manager.storage) == []
    lines = [r.getMessage() for r in caplog.records if "not committed" in r.getMessage()]
    assert len(lines) == 1 and name in lines[0]
    thief.release()


def test_a_takeover_seen_by_the_renewal_abandons_the_upload_at_the_next_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = RunManager(str(tmp_path / "run"), staging_dir=tmp_path / "s", async_upload=False)
    manager.writer.acquire()
    folder, name = stage(manager, 1, size=3 * CHUNK_SIZE)
    chunks = []

    def renewal_notices_a_takeover() -> None:
        chunks.append(1)
        if len(chunks) == 1:
            Lease(manager.storage).acquire(takeover=True)
            with pytest.raises(LeaseLostError):
                manager.writer.lease.renew()  # what the renewal thread does every renew_interval

    monkeypatch.setattr(manager.writer.uploader, "between_chunks", renewal_notices_a_takeover)
    with pytest.raises(LeaseLostError):
        manager.writer.submit(folder, name, Manifest(epoch=1, step=10))
    assert chunks == [1]  # the second chunk was never sent
    assert not manifest_exists(manager.storage, name)


def test_deletes_check_the_lease_afresh(run_url: str, tmp_path: Path) -> None:
    manager = RunManager(run_url, staging_dir=tmp_path / "s", async_upload=False)
    manager.writer.acquire()
    for epoch in (1, 2, 3):
        folder, name = stage(manager, epoch)
        manager.writer.submit(folder, name, Manifest(epoch=epoch, step=epoch * 10))
    plan = manager.plan_pruning(Retention(keep_last=1))
    assert [c.name for c in plan.doomed] == ["ckpt-000001", "ckpt-000002"]
    other = Lease(RunStorage(run_url))
    other.acquire(takeover=True)  # the renewal thread has not run since: only a fresh read can tell
    assert manager.writer.lease.held and manager.writer.lease.lost is None
    with pytest.raises(LeaseLostError):
        manager.writer.prune(plan.doomed)
    with pytest.raises(LeaseLostError):
        manager.storage.delete("ckpt-000001")
    assert good(manager.storage) == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    other.release()


def test_retention_after_a_silent_takeover_deletes_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    manager = RunManager(url, staging_dir=tmp_path / "s", async_upload=False)
    manager.writer.acquire()
    for epoch in (1, 2):
        folder, name = stage(manager, epoch)
        manager.writer.submit(folder, name, Manifest(epoch=epoch, step=epoch * 10))
    Lease(RunStorage(url)).acquire(takeover=True)
    manager.retention = Retention(keep_last=1)
    manager.writer.apply_retention()  # the deletes find the lease gone: nothing is deleted, nothing raises
    assert good(manager.storage) == ["ckpt-000001", "ckpt-000002"]
    assert manager.writer.lease.lost is not None


def commit(manager: RunManager, epoch: int) -> str:
    folder, name = stage(manager, epoch)
    manager.writer.submit(folder, name, Manifest(epoch=epoch, step=epoch * 10))
    manager.wait()
    return name


def test_deleting_every_checkpoint_takes_the_index_and_an_emptied_local_folder(run_url: str,
                                                                                 tmp_path: Path) -> None:
    manager = RunManager(run_url, staging_dir=tmp_path / "s")
    manager.writer.acquire()
    commit(manager, 1)
    commit(manager, 2)
    storage = manager.storage
    assert storage.fs.exists(f"{storage.root}/index.json") and manager.last_checkpoint is not None
    manager.release()  # as BackupAndRestore at the end of fit: the lease first, then the backups
    manager.writer.delete_every_checkpoint()
    assert storage.list() == [] and manager.last_checkpoint is None
    assert not storage.fs.exists(f"{storage.root}/index.json")
    if storage.is_local:
        assert not Path(storage.root).exists()


def test_after_a_takeover_the_index_is_not_deleted_either(run_url: str, tmp_path: Path) -> None:
    manager = RunManager(run_url, staging_dir=tmp_path / "s")
    manager.writer.acquire()
    name = commit(manager, 1)
    storage = manager.storage
    storage.delete(name)  # no checkpoint left, the index still there: only its delete is tried
    thief = Lease(RunStorage(run_url))
    thief.acquire(takeover=True)
    try:
        with pytest.raises(LeaseLostError, match="lost its writer lease"):
            manager.writer.delete_every_checkpoint()
        assert storage.fs.exists(f"{storage.root}/index.json")
    finally:
        thief.release()
