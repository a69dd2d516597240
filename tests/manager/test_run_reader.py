"""RunManager as a reader and a writer: a resume that only reads builds no Lease, no Uploader,
starts no thread and writes nothing to the run folder; the first write builds the writer, and
fences the storage before writing."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from storage_helpers import commit, names, put_raw
from writer_traces import built, new_threads, run_folder

from resumable import Manifest, RunStorage
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager
from resumable.manager.uploader import Uploader
from resumable.storage.lease import Lease, read_lease


@pytest.fixture
def two_checkpoints(run_url: str, backend: str, tmp_path: Path) -> RunStorage:
    """A run folder with checkpoints 1 and 2, 2 damaged (same size, other bytes), committed
    without a manager: no lease, no thread in this process."""
    storage = RunStorage(run_url)
    for epoch in (1, 2):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 10),
               {"model.keras": bytes([epoch]) * 100})
    put_raw(storage, b"\0" * 100, "ckpt-000002", "model.keras")
    return storage


def test_a_resume_that_only_reads_builds_no_writer(two_checkpoints: RunStorage, backend: str,
                                                   tmp_path: Path) -> None:
    storage = two_checkpoints
    before, listing = set(threading.enumerate()), run_folder(storage)
    with built(Lease, Uploader) as writers:
        manager = RunManager(storage.url, staging_dir=tmp_path / "s", retention=None)
        assert manager.blocking_writer() is None
        problems: list[str] = []
        found = manager.fetch_newest(warn=problems.append)
        assert found is not None
        info, local = found
        assert info.name == "ckpt-000001" and (local / "model.keras").read_bytes() == bytes([1]) * 100
        manager.resumed_from(info, manager.damaged)
        manager.keep_only_cached(info.name)
        assert manager.check_continues(info.name, step=10) is None
        assert manager.newest_good() == info and manager.last_checkpoint == info
        assert names(manager.plan_pruning(Retention(keep_last=5)).doomed) == []
        # what run.fit's ends and the notebook's hooks call when nothing was written: nothing to do
        assert manager.wait() is True and manager.pending == [] and manager.job is None
        manager.check_lease()
        manager.finish(quiet=True)
        manager.release()
        assert repr(manager) == f"RunManager({storage.url!r}, lease held=False)"
        assert manager.writes_in_place == (backend == "local")
    assert writers == {}
    assert new_threads(before) == set()
    assert manager.storage.fence is None  # nothing fenced: nothing written
    assert read_lease(storage) is None
    assert run_folder(storage) == listing  # not a byte, not a timestamp changed


def test_the_first_write_builds_the_writer_and_fences_the_storage_first(two_checkpoints: RunStorage,
                                                                       backend: str, tmp_path: Path) -> None:
    storage = two_checkpoints
    manager = RunManager(storage.url, staging_dir=tmp_path / "s", async_upload=False)
    found = manager.fetch_newest(warn=lambda line: None)
    assert found is not None
    manager.resumed_from(found[0], manager.damaged)
    assert manager.storage.fence is None and read_lease(storage) is None

    committed: list[str] = []
    manager.listener = SimpleNamespace(committed=lambda info: committed.append(info.name),  # set before
                                       skipped=print)  # the writer exists
    manager.retention = Retention(keep_last=1)  # so is this: the writer reads it when it prunes
    with built(Lease, Uploader) as writers:
        manager.writer.acquire()
    assert writers == {"Lease": 1, "Uploader": 1}  # the writer, built at the first call that writes
    assert manager.storage.fence == manager.writer.lease.fence  # fenced before the first write
    holder = read_lease(storage)
    assert holder is not None and holder.mine() and manager.writer.lease.held
    assert "lease held=True" in repr(manager)
    folder = manager.writer.stage("ckpt-000003")
    with manager.writer.uploader.paused():
        folder.mkdir(parents=True)
        (folder / "model.keras").write_bytes(b"\3" * 100)
    manager.writer.submit(folder, "ckpt-000003", Manifest(epoch=3, step=30))
    assert manager.wait() is True
    manager.release()
    assert committed == ["ckpt-000003"]
    assert manager.last_checkpoint is not None and manager.last_checkpoint.name == "ckpt-000003"
    assert "ckpt-000003" in names(c for c in storage.list() if c.ok)
    assert "ckpt-000001" not in names(storage.list())  # retention set before the writer was built
    assert read_lease(storage) is None and not manager.writer.lease.held


# Not on gs://: its listings compare CRC32Cs, so a damaged checkpoint is passed over there, not found damaged.
@pytest.mark.parametrize("backend", ["local", "memory"], indirect=True)
def test_a_resume_replaces_the_damaged_checkpoint_it_found(two_checkpoints: RunStorage,
                                                          tmp_path: Path) -> None:
    storage = two_checkpoints
    manager = RunManager(storage.url, staging_dir=tmp_path / "s", async_upload=False)
    found = manager.fetch_newest(warn=lambda line: None)
    assert found is not None and manager.damaged == {"ckpt-000002"}
    manager.damaged.add("ckpt-000001")  # a copy: the reader's set changes only through its methods
    assert manager.damaged == {"ckpt-000002"}
    manager.resumed_from(found[0], manager.damaged)
    manager.writer.acquire()
    folder = manager.writer.stage("ckpt-000002")
    folder.mkdir(parents=True)
    (folder / "model.keras").write_bytes(b"\2" * 100)
    manager.writer.submit(folder, "ckpt-000002", Manifest(epoch=2, step=20))
    manager.release()
    assert manager.damaged == set()
    assert storage.verify("ckpt-000002") == []


@pytest.mark.parametrize(("argument", "value"), [("lease_timeout", 0), ("when_behind", "never")])
def test_a_bad_writer_argument_fails_at_once_though_the_writer_comes_later(tmp_path: Path, argument: str,
                                                                          value: object) -> None:
    with pytest.raises(ValueError, match=f"Invalid value for argument `{argument}`"):
        RunManager(str(tmp_path / "run"), **{argument: value})  # type: ignore[arg-type]
