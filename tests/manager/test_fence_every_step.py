"""The lease changes between any two steps of a save: no manifest write and no delete follows.

A save here is everything a training save does to the run folder: clearing the leftovers of an
interrupted save of the same name, the uploads, the manifest, the index, retention's deletes.
Each storage call of it is a step (`Steps` records them on the run folder's filesystem, a
memory:// one: every step goes through it). The save is run once to count its steps, then once
per step with the lease changed right after that step: taken over by another writer, or
lease.json deleted. What must hold: once the lease changed, the writer writes no manifest and
deletes nothing (each of those reads the lease afresh first: `Lease.fence`), and the run holds
committed checkpoints or a clean partial, never a corrupt one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resumable import RunStorage
from resumable.core.errors import LeaseLostError
from resumable.core.manifest import MANIFEST_NAME, Manifest
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager
from resumable.storage.lease import LEASE_NAME, Lease

WRITES = {"pipe_file": "write", "rm_file": "delete", "rm": "delete", "_rm": "delete", "touch": "write",
          "mv": "write", "copy": "write"}
READS = ("cat_file", "info", "ls", "find", "exists", "isfile", "isdir", "listdir")


class Steps:
    """Wraps a filesystem: records each call as ``(kind, path)`` and runs ``after_step`` after
    each one that is not the lease's (``kind``: write, delete, read, open-for-write)."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self.log: list[tuple[str, str]] = []
        self.after_step: Callable[[int], None] = lambda n: None
        self.count = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._fs, name)
        if name not in WRITES and name not in READS:
            return target

        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            result = target(path, *args, **kwargs)
            self._step(WRITES.get(name, "read"), str(path))
            return result
        return call

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        f = self._fs.open(path, mode, **kwargs)
        if "w" in mode or "x" in mode:  # its bytes land at close: recorded then
            close = f.close

            def closed() -> None:
                close()
                self._step("write", str(path))
            f.close = closed
        return f

    def _step(self, kind: str, path: str) -> None:
        self.log.append((kind, path))
        if not path.endswith(LEASE_NAME):
            self.count += 1
            self.after_step(self.count)


def save(tmp_path: Path, change: Callable[[str], None] | None, at: int) -> tuple[RunManager, Steps, int]:
    """One checkpoint committed, a partial of the next left over; then the next is saved with
    retention keep_last=1, the lease changed by ``change`` after step ``at``. Returns the
    manager, the steps, and the log's length when the lease changed (-1: it did not)."""
    url = f"memory://fence-{uuid.uuid4().hex[:10]}"
    manager = RunManager(url, staging_dir=tmp_path / f"s-{at}", async_upload=False)
    manager.writer.acquire()
    commit(manager, 1)
    manager.storage.fs.pipe_file(f"{manager.storage.root}/ckpt-000002/model.keras", b"half")  # a partial
    manager.retention = Retention(keep_last=1)
    steps = Steps(manager.storage.fs)
    manager.storage.fs = steps
    changed_at = -1

    def after(n: int) -> None:
        nonlocal changed_at
        if n == at and change is not None:
            change(url)
            changed_at = len(steps.log)

    steps.after_step = after
    with contextlib.suppress(LeaseLostError):  # or none: retention's deletes stop without raising
        commit(manager, 2)
    return manager, steps, changed_at


def commit(manager: RunManager, epoch: int) -> None:
    name = f"ckpt-{epoch:06d}"
    folder = manager.writer.stage(name)
    folder.mkdir(parents=True)
    (folder / "model.keras").write_bytes(bytes([epoch]) * 1000)
    (folder / "state.json").write_bytes(b'{"epoch": %d}' % epoch)
    manager.writer.submit(folder, name, Manifest(epoch=epoch, step=epoch * 10))


def taken_over(url: str) -> None:
    Lease(RunStorage(url)).acquire(takeover=True)


def lease_deleted(url: str) -> None:
    storage = RunStorage(url)
    storage.fs.rm_file(f"{storage.root}/{LEASE_NAME}")


def test_the_save_has_the_steps_this_test_changes_the_lease_between(tmp_path: Path) -> None:
    manager, steps, _ = save(tmp_path, None, 0)
    kinds = [(kind, path.rsplit("/", 2)[-2:]) for kind, path in steps.log]
    assert ("delete", ["ckpt-000002", "model.keras"]) in kinds  # the partial cleared
    assert ("write", ["ckpt-000002", MANIFEST_NAME]) in kinds
    assert ("delete", ["ckpt-000001", MANIFEST_NAME]) in kinds  # retention
    assert [c.name for c in manager.storage.list() if c.ok] == ["ckpt-000002"]
    assert steps.count >= 10


@pytest.mark.parametrize("change", [taken_over, lease_deleted], ids=["taken-over", "lease-deleted"])
def test_no_manifest_write_and_no_delete_after_the_lease_changed(tmp_path: Path,
                                                                 change: Callable[[str], None]) -> None:
    _, steps, _ = save(tmp_path / "count", None, 0)
    for at in range(1, steps.count + 1):
        manager, steps_at, changed_at = save(tmp_path, change, at)
        if changed_at < 0:
            continue  # this save had fewer steps
        after = steps_at.log[changed_at:]
        forbidden = [(kind, path) for kind, path in after if not path.endswith(LEASE_NAME) and (
            kind == "delete" or path.endswith(MANIFEST_NAME) and kind == "write")]
        assert forbidden == [], f"after step {at}: {forbidden}"
        statuses = {c.name: c.status.value for c in RunStorage(manager.storage.url).list()}
        assert "corrupt" not in statuses.values(), f"after step {at}: {statuses}"
        assert statuses.get("ckpt-000001") == "ok" or statuses.get("ckpt-000002") == "ok"


def test_a_commit_after_the_lease_was_given_back_takes_it_again_first(tmp_path: Path) -> None:
    """The end of a fit whose last upload failed: the lease goes back, then the exception path
    retries the upload (Run.fit's `_finish_uploads`). Before #51 it wrote the manifest and
    retention's deletes with no lease at all; now it takes the lease again, reads it right
    before the manifest, gives it back after, and retention (a writer without the lease) waits."""
    manager, steps, _ = save(tmp_path, None, 0)
    manager.release()
    before = len(steps.log)
    commit(manager, 3)
    log = steps.log[before:]
    manifest = log.index(("write", f"{manager.storage.root}/ckpt-000003/{MANIFEST_NAME}"))
    lease = f"{manager.storage.root}/{LEASE_NAME}"
    assert ("write", lease) in log[:manifest]  # taken again
    assert log[manifest - 1] == ("read", lease)  # and read afresh right before the manifest
    assert [path for kind, path in log[manifest:] if kind == "delete"] == [lease]  # retention waits
    assert not manager.writer.lease.held and not manager.storage.fs.exists(lease)  # given back again
    assert [c.name for c in manager.storage.list() if c.ok] == ["ckpt-000002", "ckpt-000003"]
