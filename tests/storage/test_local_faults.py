"""Faults on the local and Google Drive code paths (tests/local_faults.py): nothing is lost.

Drive's FUSE mount reports a failed upload as EIO from fsync, a reconnect as ENOTCONN, a
full quota as ENOSPC; some mounts have no hard links or no locks, rename by deleting then
writing, or serve stale or short reads. Real commits, deletes, leases and fetches meet each
fault and must hold to four rules:

- never reported committed when not durable (a failed fsync rewrites, or fails the commit);
- a committed checkpoint is never lost or overwritten;
- an outage longer than the retry budget is one clear line (a StorageError), not a traceback;
- no stray temporary file is left that could count as a checkpoint (or fill the cache).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_faults import Crash, LocalFaults, inject
from storage_helpers import FILES, commit, names

from resumable import Manifest, RetryPolicy, RunStorage, Status, StorageError
from resumable.core.errors import LeaseHeldError, LeaseLostError, NoSpaceError
from resumable.core.manifest import MANIFEST_NAME
from resumable.manager.run_manager import RunManager
from resumable.storage import lease, lease_contest, this_machine
from resumable.storage.lease import LEASE_NAME, Lease, read_lease

RETRY = RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.002)


@pytest.fixture(autouse=True)
def _release_leases() -> Iterator[None]:
    yield
    for held in list(lease._held):
        held.release()


@pytest.fixture
def storage(tmp_path: Path) -> RunStorage:
    return RunStorage(str(tmp_path / "run"), retry=RETRY)


@pytest.fixture
def faults(storage: RunStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalFaults:
    return inject(monkeypatch, storage.root, tmp_path / "cache")


def files_of(storage: RunStorage) -> dict[str, bytes]:
    """Every file in the run folder and its bytes, read past the faults."""
    found = {}
    for top, _, files in os.walk(storage.root):
        for name in files:
            path = os.path.join(top, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, storage.root)] = f.read()
    return found


def no_strays(folder: str | Path) -> None:
    """No temporary file (``*.tmp``, ``*.part``, ``*.partial``) anywhere under ``folder``."""
    strays = [os.path.join(top, n) for top, _, files in os.walk(folder) for n in files
              if n.endswith((".tmp", ".part", ".partial"))]
    assert strays == []


def one_line(error: BaseException) -> str:
    assert isinstance(error, StorageError), repr(error)
    text = str(error)
    assert "\n" not in text and "Traceback" not in text
    return text


def kept(before: dict[str, bytes], after: dict[str, bytes], *checkpoints: str) -> None:
    """The files of ``checkpoints`` are all still there, with the bytes they had."""
    theirs = {rel: data for rel, data in before.items() if rel.split("/", 1)[0] in checkpoints}
    assert theirs and {rel: after.get(rel) for rel in theirs} == theirs


# ---------------------------------------------------------------------- durability of a commit


@pytest.mark.parametrize("what", ["manifest", "its folder entry"])
def test_a_failed_fsync_rewrites_the_manifest_before_reporting_a_commit(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path, what: str
) -> None:
    """After EIO from fsync the bytes may never reach the disk (and a second fsync may lie)."""
    faults.fail("fsync", path="ckpt-000001/manifest.json" if what == "manifest" else "run/ckpt-000001")
    info = commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    assert info.ok and faults.injected
    assert faults.count("unlink", "ckpt-000001/manifest.json") == 1  # removed, then written again
    assert faults.count("create", "ckpt-000001/manifest.json") == 2
    assert storage.get("ckpt-000001").ok and storage.verify("ckpt-000001") == []


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOTCONN])
def test_an_fsync_outage_past_the_retries_is_never_a_commit(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path, error: int
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    before = files_of(storage)
    faults.fail("fsync", path="ckpt-000002/manifest.json", errno=error, times=None)
    with pytest.raises(StorageError) as caught:
        commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    assert "ckpt-000002/manifest.json" in one_line(caught.value)
    assert faults.count("fsync", "ckpt-000002/manifest.json") == RETRY.attempts
    faults.heal()
    infos = {info.name: info for info in storage.list()}
    assert infos["ckpt-000002"].status is Status.PARTIAL  # its whole manifest was removed again
    assert storage.latest().name == "ckpt-000001"  # type: ignore[union-attr]
    kept(before, files_of(storage), "ckpt-000001")
    no_strays(storage.root)
    assert commit(storage, tmp_path / "again", "ckpt-000002", Manifest(epoch=2)).ok  # once the mount is back


def test_a_full_disk_at_the_manifest_fails_the_commit_and_says_so(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    faults.fail("fsync", path="ckpt-000002/manifest.json", errno=errno.ENOSPC)  # Drive: over quota
    with pytest.raises(NoSpaceError, match="no space left to commit this checkpoint") as caught:
        commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    one_line(caught.value)
    assert [(i.name, i.status) for i in storage.list()] == [("ckpt-000001", Status.OK),
                                                             ("ckpt-000002", Status.PARTIAL)]


def test_a_disk_filling_up_mid_file_keeps_the_older_checkpoints(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    before = files_of(storage)
    faults.fail("write", path="ckpt-000002/model.keras", errno=errno.ENOSPC)
    with pytest.raises(NoSpaceError) as caught:
        commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    one_line(caught.value)
    assert storage.latest().name == "ckpt-000001"  # type: ignore[union-attr]
    assert not os.path.exists(f"{storage.root}/ckpt-000002/{MANIFEST_NAME}")
    kept(before, files_of(storage), "ckpt-000001")


@pytest.mark.parametrize("op", ["open_write", "fsync", "write"])
def test_a_payload_file_that_fails_once_is_sent_again(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path, op: str
) -> None:
    faults.fail(op, path="ckpt-000001/model.keras", errno=errno.ENOTCONN)  # the mount reconnecting
    assert commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1)).ok
    assert faults.injected and storage.verify("ckpt-000001") == []


def test_a_short_read_back_of_the_manifest_is_not_a_commit(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-back after the write is what catches a write that was cut short silently."""
    original = storage.committer._write_manifest.__func__  # type: ignore[attr-defined]

    def write_then_read_short(self: object, name: str, data: bytes) -> None:
        path = f"{storage.root}/{name}/{MANIFEST_NAME}"
        real_read = storage._folder.read

        def read(p: str, *args: object) -> bytes | Exception:
            if p == path and os.path.exists(path):
                faults.short(path)
            return real_read(p, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(storage._folder, "read", read)
        try:
            original(self, name, data)
        finally:
            monkeypatch.setattr(storage._folder, "read", real_read)

    monkeypatch.setattr(type(storage.committer), "_write_manifest", write_then_read_short)
    with pytest.raises(StorageError, match="did not land intact") as caught:
        commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    one_line(caught.value)


# ---------------------------------------------------------------------- the run index


@pytest.mark.parametrize("op", ["fsync", "replace"])
def test_an_index_write_outage_leaves_the_commit_and_no_temporary_file(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path, op: str, caplog: pytest.LogCaptureFixture
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    faults.fail(op, path=".tmp" if op == "fsync" else "index.json", times=None)
    assert commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2)).ok  # committed: the index only warns
    assert "could not update the run index" in caplog.text
    no_strays(storage.root)
    faults.heal()
    assert names(storage.list(check_files=False)) == ["ckpt-000001", "ckpt-000002"]  # mended from the folders


def test_a_stale_read_of_the_index_loses_no_checkpoint(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    faults.stale(f"{storage.root}/index.json")  # another VM's Drive client, not caught up yet
    commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    commit(storage, tmp_path, "ckpt-000003", Manifest(epoch=3))
    faults.heal()
    assert names(storage.list(check_files=False)) == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]


def test_a_non_atomic_rename_killed_half_way_loses_the_index_only(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    faults.non_atomic_replace("index.json", crash=True)
    with pytest.raises(Crash):
        commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    faults.heal()
    assert not os.path.exists(f"{storage.root}/index.json")
    fresh = RunStorage(storage.url)  # the next process
    assert names(fresh.list(check_files=False)) == ["ckpt-000001", "ckpt-000002"]
    assert fresh.latest().name == "ckpt-000002"  # type: ignore[union-attr]


# ---------------------------------------------------------------------- deletes


def test_a_delete_outage_is_one_line_and_deletes_once_back(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    storage.truncate_before_delete = True
    for epoch in (1, 2):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    before = files_of(storage)
    faults.fail("unlink", path="ckpt-000001/manifest.json", times=None)
    with pytest.raises(StorageError) as caught:
        storage.delete("ckpt-000001")
    assert "ckpt-000001/manifest.json" in one_line(caught.value)
    kept(before, files_of(storage), "ckpt-000002")
    faults.heal()
    storage.delete("ckpt-000001")
    assert names(storage.list()) == ["ckpt-000002"] and storage.verify("ckpt-000002") == []


def test_a_delete_retried_after_its_unlink_landed_finishes(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    faults.fail("ftruncate", path="model.keras", errno=errno.EIO)  # Drive: the emptied copy failed to upload
    storage.truncate_before_delete = True
    storage.delete("ckpt-000001")
    assert storage.list() == [] and faults.injected
    assert not os.path.exists(f"{storage.root}/ckpt-000001")


# ---------------------------------------------------------------------- the writer lease


def test_a_mount_without_hard_links_or_locks_still_has_one_writer(
    storage: RunStorage, faults: LocalFaults
) -> None:
    faults.fail("link", errno=errno.EPERM, times=None)  # some FUSE mounts
    faults.fail("flock", errno=errno.ENOLCK, times=None)
    held = Lease(storage, timeout=600)
    held.acquire()
    held.renew()
    assert read_lease(storage) == held.info and faults.count("link") >= 1
    no_strays(storage.root)
    this_machine.HOST, saved = "another-host", this_machine.HOST
    try:
        with pytest.raises(LeaseHeldError):
            Lease(storage).acquire()  # 600 s to go stale: refused at once
    finally:
        this_machine.HOST = saved
    held.release()
    assert storage.run_files.read_run_file(LEASE_NAME) is None


@pytest.mark.parametrize("where", ["file", "folder entry"])
def test_a_lease_whose_fsync_failed_is_created_again(
    storage: RunStorage, faults: LocalFaults, where: str
) -> None:
    faults.fail("fsync", path=".tmp" if where == "file" else "/run")
    held = Lease(storage)
    held.acquire()
    assert faults.injected and read_lease(storage) == held.info
    no_strays(storage.root)


def test_a_lease_outage_is_one_line(storage: RunStorage, faults: LocalFaults) -> None:
    faults.fail("open_write", times=None)
    faults.fail("fsync", times=None)
    with pytest.raises(StorageError) as caught:
        Lease(storage).acquire()
    assert LEASE_NAME in one_line(caught.value)
    faults.heal()
    no_strays(storage.root)


def test_a_lease_being_written_is_never_taken_over(
    storage: RunStorage, faults: LocalFaults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hard links: the lease file exists, empty, before its bytes land. A contender that reads
    it then must wait, not take it over (two writers would both think they hold the run)."""
    faults.fail("link", errno=errno.EPERM, times=None)
    monkeypatch.setattr(lease_contest, "TORN_GRACE", 5.0)
    monkeypatch.setattr(lease_contest, "TORN_POLL", 0.02)
    holder = Lease(storage, timeout=2, renew_interval=0.1)
    outcome: list[BaseException | None] = []
    contender_waiting = threading.Event()

    def contend() -> None:
        try:
            Lease(storage).acquire()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            outcome.append(e)

    real_open = open

    def slow_create(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        f = real_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]
        if "x" in mode and str(file).endswith(LEASE_NAME) and not contender_waiting.is_set():
            contender_waiting.set()
            this_machine.HOST = "another-host"  # the contender is another machine
            thread = threading.Thread(target=contend)
            thread.start()
            time.sleep(0.3)  # it reads the empty file meanwhile
        return f

    monkeypatch.setattr(this_machine, "HOST", this_machine.HOST)
    monkeypatch.setattr("builtins.open", slow_create)
    holder.acquire()
    monkeypatch.setattr("builtins.open", real_open)
    holder.start_renewing()  # renewed while watched: the contender is refused
    deadline = time.monotonic() + 10
    while not outcome and time.monotonic() < deadline:
        time.sleep(0.05)
    assert outcome and isinstance(outcome[0], LeaseHeldError), outcome
    holder.renew()  # still ours
    assert read_lease(storage) == holder.info


def test_an_outage_through_several_renewals_is_one_warning_and_the_lease_stays_ours(
    storage: RunStorage, faults: LocalFaults, caplog: pytest.LogCaptureFixture
) -> None:
    """Drive's mount gone for a few renewals: one warning when it starts, the retries during it
    logged (info), one line when a renewal lands again; the lease was never given up."""
    caplog.set_level("INFO", logger="resumable")
    held = Lease(storage, timeout=60, renew_interval=0.1)
    held.acquire()
    outage = faults.fail("replace", LEASE_NAME, errno=errno.ENOTCONN, times=None)
    held.start_renewing()
    deadline = time.monotonic() + 30
    while outage.seen < 3 * RETRY.attempts and time.monotonic() < deadline:  # three renewals failed
        time.sleep(0.02)
    faults.heal()
    while "again, after" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.02)
    held.stop_renewing()
    lines = [r for r in caplog.records if "renew the writer lease" in r.getMessage()]
    assert [r.levelname for r in lines].count("WARNING") == 1 and lines[0].levelname == "WARNING", lines
    assert len(lines) >= 3 and all(r.levelname == "INFO" for r in lines[1:])
    again = [r.getMessage() for r in caplog.records if "again, after" in r.getMessage()]
    assert len(again) == 1 and "failed tries" in again[0], caplog.text
    assert read_lease(storage) == held.info  # still ours, renewed after the outage


def test_a_lease_that_stays_torn_is_taken_after_the_grace(
    storage: RunStorage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lease_contest, "TORN_GRACE", 0.3)
    monkeypatch.setattr(lease_contest, "TORN_POLL", 0.02)
    storage.run_files.create_run_file(LEASE_NAME, b"")  # its writer died between the create and the write
    started = time.monotonic()
    held = Lease(storage)
    held.acquire()
    assert 0.2 < time.monotonic() - started < 5
    assert read_lease(storage) == held.info and "not a readable lease" in caplog.text


def test_a_renewal_killed_half_way_through_a_non_atomic_rename(
    storage: RunStorage, faults: LocalFaults
) -> None:
    held = Lease(storage, timeout=600)
    held.acquire()
    faults.non_atomic_replace(LEASE_NAME, crash=True)
    with pytest.raises(Crash):
        held.renew()  # the process dies with lease.json deleted and not yet written
    faults.heal()
    lease._held.discard(held)
    no_strays(storage.root)
    successor = Lease(storage)
    successor.acquire()
    assert read_lease(storage) == successor.info


def test_a_contender_in_the_gap_of_a_non_atomic_rename_leaves_one_writer(
    storage: RunStorage, faults: LocalFaults
) -> None:
    held = Lease(storage, timeout=600)
    held.acquire()
    contender: list[Lease] = []

    def in_the_gap(src: str, dst: str) -> None:
        if not contender:  # lease.json is gone for a moment: another process creates its own
            contender.append(Lease(storage, timeout=600))
            contender[0].acquire()

    faults.non_atomic_replace(LEASE_NAME, between=in_the_gap)
    held.renew()  # its rename lands over the contender's lease
    faults.heal()
    assert read_lease(storage) == held.info
    with pytest.raises(LeaseLostError):
        contender[0].renew()  # the contender finds out before it writes anything
    held.renew()


def test_stale_reads_of_its_own_lease_do_not_lose_it(storage: RunStorage, faults: LocalFaults) -> None:
    held = Lease(storage, timeout=600)
    held.acquire()
    held.renew()
    faults.stale(f"{storage.root}/{LEASE_NAME}")  # reads serve the lease as it was before
    held.renew()
    held.renew()
    faults.heal()
    assert read_lease(storage) == held.info


# ---------------------------------------------------------------------- fetching into the cache


def manager_of(storage: RunStorage, tmp_path: Path) -> RunManager:
    manager = RunManager(storage.url, staging_dir=tmp_path / "cache")
    manager.storage.retry = RETRY
    return manager


def test_a_full_cache_disk_names_the_cache_and_leaves_no_part_file(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    cache = tmp_path / "cache" / "ckpt-000001"  # resume() loads local runs in place; a bucket's go here
    faults.fail("write", path="model.keras.part", errno=errno.ENOSPC, times=None)
    with pytest.raises(NoSpaceError) as caught:
        storage.fetch("ckpt-000001", cache)
    message = one_line(caught.value)
    assert message.startswith(str(cache)), message
    assert "free" in message and "needed" in message and "staging_dir=" in message
    assert storage.url + "/" not in message  # the run folder is fine: not blamed
    no_strays(tmp_path / "cache")


def test_an_interrupted_download_leaves_no_part_file(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    faults.fail("write", path="model.keras.part", exception=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        storage.fetch("ckpt-000001", tmp_path / "cache" / "ckpt-000001")
    no_strays(tmp_path / "cache")
    faults.heal()
    local = storage.fetch("ckpt-000001", tmp_path / "cache" / "ckpt-000001")
    assert (local / "model.keras").read_bytes() == FILES["model.keras"]


def test_a_short_read_while_resuming_falls_back_to_an_older_checkpoint(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    for epoch in (1, 2):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    faults.short(f"{storage.root}/ckpt-000002/model.keras")
    warned: list[str] = []
    found = manager_of(storage, tmp_path).fetch_newest(warn=warned.append)
    assert found is not None and found[0].name == "ckpt-000001"
    assert warned and "ckpt-000002/model.keras" in warned[0]
    no_strays(tmp_path / "cache")
    faults.heal()
    assert storage.verify("ckpt-000002") == []  # the stored copy was fine all along


def test_a_read_outage_while_fetching_is_one_line(
    storage: RunStorage, faults: LocalFaults, tmp_path: Path
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    info = storage.get("ckpt-000001")
    faults.fail("open_read", path="model.keras", times=None)
    with pytest.raises(StorageError) as caught:
        storage.fetch(info, tmp_path / "cache" / "ckpt-000001")
    assert "ckpt-000001/model.keras" in one_line(caught.value)
    assert len(faults.injected) == RETRY.attempts  # retried, then given up
    no_strays(tmp_path / "cache")
    with pytest.raises(StorageError) as caught:
        storage.verify(info)
    one_line(caught.value)
    faults.heal()
    assert storage.verify(info) == []
