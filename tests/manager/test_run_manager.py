"""RunManager: the writer's and readers' view of a run folder, with plain files; no Keras."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from resumable import RunStorage
from resumable.core.errors import CheckpointExistsError, LeaseHeldError, LeaseLostError
from resumable.core.manifest import Manifest
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager, default_staging_dir
from resumable.manager.run_writer import PRIVATE_WRITE
from resumable.storage.lease import Lease


def save(manager: RunManager, epoch: int, size: int = 100, metrics: dict[str, float] | None = None) -> None:
    """What the Keras callback does for one checkpoint, with plain files."""
    name = manager.storage.template.format(epoch, epoch * 10, {}, mid_epoch=False)
    folder = manager.writer.stage(name)
    with manager.writer.uploader.paused():
        folder.mkdir(parents=True)
        (folder / "model.keras").write_bytes(bytes([epoch]) * size)
    manager.writer.submit(folder, name, Manifest(epoch=epoch, step=epoch * 10, metrics=metrics or {}))


def names(storage: RunStorage) -> list[str]:
    return [c.name for c in storage.list() if c.ok]


@pytest.mark.parametrize("async_upload", [True, False])
def test_commits_and_applies_retention_after_each_commit(run_url: str, tmp_path: Path,
                                                         async_upload: bool) -> None:
    manager = RunManager(run_url, staging_dir=tmp_path / "staging", retention=Retention(keep_last=2),
                         async_upload=async_upload)
    committed = []
    manager.listener = SimpleNamespace(committed=lambda info: committed.append(info.name), skipped=print)
    manager.writer.acquire()
    for epoch in (1, 2, 3, 4):
        save(manager, epoch)
        manager.wait()  # one at a time: a newer save would replace a waiting one
    manager.release()
    assert names(manager.storage) == ["ckpt-000003", "ckpt-000004"]
    assert committed == ["ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004"]
    assert manager.last_checkpoint is not None and manager.last_checkpoint.name == "ckpt-000004"
    assert not manager.writer.lease.held


def test_retention_never_deletes_the_checkpoint_just_committed(run_url: str, tmp_path: Path) -> None:
    # best by val_loss is epoch 1; keep_last=1 keeps epoch 3; the one committed is protected too
    manager = RunManager(run_url, staging_dir=tmp_path / "s", async_upload=False,
                         retention=Retention(keep_last=1, keep_best=1, monitor="val_loss", mode="min"))
    manager.writer.acquire()
    for epoch, loss in ((1, 0.1), (2, 0.5), (3, 0.9)):
        save(manager, epoch, metrics={"val_loss": loss})
    manager.release()
    assert names(manager.storage) == ["ckpt-000001", "ckpt-000003"]
    plan = manager.plan_pruning(Retention(keep_last=1), protect=["ckpt-000001"])
    assert [d.keep for d in plan.decisions] == [True, True]
    assert "in use" in plan.decisions[0].reasons


def test_the_cli_prune_and_retention_share_one_plan_and_one_delete(run_url: str, tmp_path: Path) -> None:
    manager = RunManager(run_url, staging_dir=tmp_path / "s", async_upload=False)
    manager.writer.acquire()
    for epoch in (1, 2, 3):
        save(manager, epoch, size=1000)
    manager.release()

    pruner = RunManager(run_url, staging_dir=tmp_path / "other")
    plan = pruner.plan_pruning(Retention(keep_last=1))
    assert [c.name for c in plan.doomed] == ["ckpt-000001", "ckpt-000002"]
    assert plan.freed == sum(c.size for c in plan.doomed) > 2000
    with pruner.writer.writing() as other_writer:
        assert other_writer is None and pruner.writer.lease.held
        deleted = pruner.writer.prune(plan.doomed)
    assert deleted == ["ckpt-000001", "ckpt-000002"]
    assert names(pruner.storage) == ["ckpt-000003"]
    assert not pruner.writer.lease.held


def test_writing_refuses_while_another_process_writes_unless_forced(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    first = RunManager(url, staging_dir=tmp_path / "first", async_upload=False)
    first.writer.acquire()
    save(first, 1)
    first.release()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from resumable import RunStorage; "
         "from resumable.storage.lease import Lease; Lease(RunStorage(sys.argv[1])).acquire(); "
         "print('held', flush=True); time.sleep(60)", url],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        manager = RunManager(url, staging_dir=tmp_path / "s")
        with pytest.raises(LeaseHeldError), manager.writer.writing():
            pass
        with manager.writer.writing(force=True) as other_writer:
            assert other_writer is not None and other_writer.pid == holder.pid
            assert not manager.writer.lease.held  # forced: the other writer keeps its lease
            manager.storage.delete("ckpt-000001")  # not fenced: the user forced it
        assert names(manager.storage) == []
        assert manager.blocking_writer() is not None
        assert RunManager(url, takeover=True).blocking_writer() is None
    finally:
        holder.kill()
        holder.wait()


def test_a_writer_whose_lease_was_taken_over_deletes_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    manager = RunManager(url, staging_dir=tmp_path / "s", async_upload=False)
    manager.writer.acquire()
    for epoch in (1, 2):
        save(manager, epoch)
    Lease(manager.storage).acquire(takeover=True)  # another writer takes the run over
    with pytest.raises(LeaseLostError):
        manager.writer.lease.renew()
    plan = manager.plan_pruning(Retention(keep_last=1))
    assert [c.name for c in plan.doomed] == ["ckpt-000001"]
    with pytest.raises(LeaseLostError):
        manager.writer.prune(plan.doomed)
    manager.retention = Retention(keep_last=1)
    manager.writer.apply_retention()  # a warning-free no-op after a takeover
    assert names(manager.storage) == ["ckpt-000001", "ckpt-000002"]
    with pytest.raises(LeaseLostError):
        manager.writer.stage("ckpt-000003")


def test_fetch_newest_falls_back_past_a_damaged_checkpoint_and_remembers_it(run_url: str, backend: str,
                                                                           tmp_path: Path) -> None:
    writer = RunManager(run_url, staging_dir=tmp_path / "w", async_upload=False)
    writer.writer.acquire()
    for epoch in (1, 2):
        save(writer, epoch)
    writer.release()
    storage = writer.storage
    storage.fs.pipe_file(f"{storage.root}/ckpt-000002/model.keras", b"\0" * 100)  # same size, other bytes

    reader = RunManager(run_url, staging_dir=tmp_path / "r")
    problems: list[str] = []
    found = reader.fetch_newest(warn=problems.append)
    assert found is not None
    info, local = found
    assert info.name == "ckpt-000001" and (local / "model.keras").read_bytes() == bytes([1]) * 100
    if backend == "gcs":  # the listing's CRC32C already tells: skipped without a download
        assert reader.damaged == set() and problems == []
    else:  # found when its download is checked: the next commit of that name may replace it
        assert reader.damaged == {"ckpt-000002"} and "ckpt-000002" in problems[0]
    assert reader.newest_good() is not None and reader.newest_good().name == "ckpt-000001"  # type: ignore[union-attr]
    if backend == "local":  # loaded where it is, once checked: no copy in a cache
        assert local == Path(storage.root) / "ckpt-000001" and not reader.cache_root.exists()
    else:
        reader.keep_only_cached(info.name)
        assert [p.name for p in reader.cache_root.iterdir()] == ["ckpt-000001"]


def test_a_new_run_into_a_folder_holding_one_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    first = RunManager(url, staging_dir=tmp_path / "a", async_upload=False)
    first.writer.acquire()
    save(first, 1)
    first.release()
    second = RunManager(url, staging_dir=tmp_path / "b")
    with pytest.raises(CheckpointExistsError, match="already holds a run"):
        second.check_continues(None, step=0)
    assert second.check_continues(None, step=10) == 1  # the model was restored from it by hand
    assert second.check_continues("ckpt-000001", step=10) is None  # resumed from it


def test_staging_folders_are_per_run_and_per_process() -> None:
    assert default_staging_dir("gs://b/run") != default_staging_dir("gs://b/other")
    assert default_staging_dir("gs://b/run", 1).name == default_staging_dir("gs://b/run").name + "-p1"


def test_the_manager_imports_no_keras() -> None:
    code = ("import sys, resumable.manager.run_manager; "
            "print('keras' in sys.modules, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_next_writer_removes_the_private_write_folders_a_killed_one_left(tmp_path: Path) -> None:
    """A save written in a thread of its own (#54) goes to ``<name>.writing-*`` first; a SIGKILL
    leaves it. The process that takes the lease next removes it, never one refused the lease."""
    staging = tmp_path / "staging"
    left = staging / "staging" / f"ckpt-000003{PRIVATE_WRITE}k2x9"
    left.mkdir(parents=True)
    (left / "model.weights.h5").write_bytes(b"x" * 1000)
    staged = staging / "staging" / "ckpt-000004"  # not a private write: the writer's own staging
    staged.mkdir()
    holder = RunManager(str(tmp_path / "run"), staging_dir=staging, async_upload=False)
    holder.writer.acquire()
    try:
        assert not left.exists() and staged.exists()
        in_flight = staging / "staging" / f"ckpt-000005{PRIVATE_WRITE}a1b2"
        in_flight.mkdir()
        code = ("import sys; from resumable.core.errors import LeaseHeldError; "
                "from resumable.manager.run_manager import RunManager; "
                "m = RunManager(sys.argv[1], staging_dir=sys.argv[2], async_upload=False)\n"
                "try: m.writer.acquire()\nexcept LeaseHeldError: print('refused')")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run"), str(staging)],
                             capture_output=True, text=True, check=True).stdout
        assert out.split() == ["refused"]
        assert in_flight.exists()  # the holder's save in flight is left alone
    finally:
        holder.release()
