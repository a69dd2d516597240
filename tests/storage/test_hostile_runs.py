"""Never outside the run folder: links and hard links in a local run folder (storage/local_files.py).

A run folder may hold a symbolic link to a file or a folder elsewhere, a whole checkpoint
folder that is a link, or files that share their data with another name (a ``cp -al`` backup
of the run, a hard link made by hand). Whatever resumable does with the run (list, verify,
fetch, resume, prune, delete with and without truncating first, commit again), not one byte
outside the run folder changes: every file outside is hashed before and after.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from storage_helpers import FILES, commit, names

from resumable import CorruptCheckpointError, Manifest, RetryPolicy, RunStorage, Status
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager
from resumable.storage import local_files
from resumable.storage.local_files import LINK_PROBLEM, LinkInRunError

FAST = RetryPolicy(attempts=2, initial_delay=0.001, max_delay=0.002)


def tree(folder: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``folder``, links not followed: a file's size and SHA-256, a link's target."""
    found: dict[str, tuple[object, ...]] = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[rel] = ("folder",)
            else:
                with open(path, "rb") as f:
                    data = f.read()
                found[rel] = ("file", len(data), hashlib.sha256(data).hexdigest())
    return found


def links_in(folder: Path) -> list[str]:
    return [os.path.relpath(os.path.join(top, n), folder) for top, dirs, files in os.walk(folder)
            for n in dirs + files if os.path.islink(os.path.join(top, n))]


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[RunStorage, Path, Path]:
    """A local run of four checkpoints made hostile, the folder outside it, and a `cp -al` backup."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "model.keras").write_bytes(FILES["model.keras"])  # the right bytes: it would check out
    (outside / "dir" / "vocab.txt").write_bytes(FILES["assets/vocab.txt"])
    (outside / "hard.bin").write_bytes(b"shared with the run by a hard link")
    elsewhere = RunStorage(str(outside / "other-run"))
    commit(elsewhere, tmp_path / "other", "ckpt-000007", Manifest(epoch=7))  # a good checkpoint, elsewhere

    storage = RunStorage(str(tmp_path / "run"), retry=FAST)
    for epoch in (1, 2, 3, 4):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    run = Path(storage.root)
    (run / "ckpt-000001" / "model.keras").unlink()
    (run / "ckpt-000001" / "model.keras").symlink_to(outside / "model.keras")
    for rel in ("assets/vocab.txt", "assets"):
        os.remove(run / "ckpt-000002" / rel) if rel != "assets" else os.rmdir(run / "ckpt-000002" / rel)
    (run / "ckpt-000002" / "assets").symlink_to(outside / "dir")
    os.link(outside / "hard.bin", run / "ckpt-000003" / "extra.bin")
    (run / "ckpt-000007").symlink_to(outside / "other-run" / "ckpt-000007")
    backup = tmp_path / "backup"
    subprocess.run(["cp", "-al", str(run), str(backup)], check=True)  # every file of the run: 2 names
    return storage, outside, backup


@pytest.mark.parametrize("truncate", [False, True], ids=["delete", "truncate-then-delete"])
def test_nothing_outside_the_run_changes(hostile: tuple[RunStorage, Path, Path], tmp_path: Path,
                                         truncate: bool) -> None:
    storage, outside, backup = hostile
    storage.truncate_before_delete = truncate
    before = (tree(outside), tree(backup))

    # Reading: links are reported, never followed
    infos = {info.name: info for info in storage.list()}
    assert sorted(infos) == ["ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004"]  # not the link
    assert infos["ckpt-000001"].status is Status.CORRUPT and LINK_PROBLEM in infos["ckpt-000001"].problem
    assert infos["ckpt-000002"].status is Status.CORRUPT
    assert infos["ckpt-000003"].ok and infos["ckpt-000004"].ok
    assert names(storage.list(check_files=False)) == sorted(infos)
    linked = storage.get("ckpt-000007")
    assert linked.status is Status.CORRUPT and LINK_PROBLEM in linked.problem
    assert storage.verify("ckpt-000001") == [f"{storage.url}/ckpt-000001/model.keras: {LINK_PROBLEM}"]
    quick = {info.name: info for info in storage.list(check_files=False)}  # the index vouches for all
    assert storage.verify(quick["ckpt-000002"]) == [
        f"{storage.url}/ckpt-000002/assets/vocab.txt: {LINK_PROBLEM}"]
    for name in ("ckpt-000001", "ckpt-000002"):
        with pytest.raises(CorruptCheckpointError, match="symbolic link|ckpt-00000"):
            storage.fetch(quick[name], tmp_path / "cache" / name)
    manager = RunManager(storage.url, staging_dir=tmp_path / "staging")
    manager.storage.retry = FAST
    manager.storage.truncate_before_delete = truncate
    found = manager.fetch_newest(warn=lambda line: None)
    assert found is not None and found[0].name == "ckpt-000004"

    # Writing: commit over the linked name, prune, delete everything
    commit(storage, tmp_path / "again", "ckpt-000007", Manifest(epoch=7))
    assert not (Path(storage.root) / "ckpt-000007").is_symlink() and storage.get("ckpt-000007").ok
    manager.writer.acquire()
    try:
        doomed = manager.plan_pruning(Retention(keep_last=1)).doomed
        assert manager.writer.prune(doomed) == ["ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004"]
    finally:
        manager.release()
    for info in storage.list():
        storage.delete(info)
    assert storage.list() == [] and links_in(Path(storage.root)) == []

    assert (tree(outside), tree(backup)) == before


def test_a_checkpoint_folder_that_is_a_link_is_unlinked_not_followed(
    hostile: tuple[RunStorage, Path, Path]
) -> None:
    storage, outside, _ = hostile
    before = tree(outside)
    assert storage.latest() is not None and storage.latest().name == "ckpt-000004"  # type: ignore[union-attr]
    storage.truncate_before_delete = True
    storage.delete("ckpt-000007")
    assert not os.path.lexists(f"{storage.root}/ckpt-000007")
    assert tree(outside) == before


def test_a_run_folder_that_is_a_link_is_the_users_choice(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "real")
    storage = RunStorage(str(tmp_path / "run"), truncate_before_delete=True)
    for epoch in (1, 2):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    assert names(storage.list()) == ["ckpt-000001", "ckpt-000002"]
    assert storage.verify("ckpt-000002") == []
    fetched = storage.fetch("ckpt-000002", tmp_path / "cache")
    assert (fetched / "model.keras").read_bytes() == FILES["model.keras"]
    storage.delete("ckpt-000001")
    assert sorted(os.listdir(tmp_path / "real")) == ["ckpt-000002", "index.json"]


def test_a_link_planted_at_a_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me")
    storage = RunStorage(str(tmp_path / "run"))
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    os.symlink(outside, f"{storage.root}/index.json.{os.getpid()}.tmp")
    commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))  # rewrites the index through that name
    assert outside.read_bytes() == b"keep me"
    assert names(storage.list(check_files=False)) == ["ckpt-000001", "ckpt-000002"]


# ---------------------------------------------------------------------- local_files, directly


@pytest.fixture
def run(tmp_path: Path) -> Path:
    (tmp_path / "run" / "ckpt" / "sub").mkdir(parents=True)
    (tmp_path / "run" / "ckpt" / "own.bin").write_bytes(b"own")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "file.bin").write_bytes(b"outside")
    return tmp_path / "run"


def test_open_inside_refuses_links_below_the_root(run: Path, tmp_path: Path) -> None:
    root = str(run)
    (run / "ckpt" / "file-link").symlink_to(tmp_path / "elsewhere" / "file.bin")
    (run / "ckpt" / "dir-link").symlink_to(tmp_path / "elsewhere")
    assert local_files.read_inside(root, f"{root}/ckpt/own.bin") == b"own"
    for path in ("ckpt/file-link", "ckpt/dir-link/file.bin"):
        with pytest.raises(LinkInRunError, match="symbolic link, never followed"):
            local_files.open_inside(root, f"{root}/{path}")
        assert local_files.link_below(root, f"{root}/{path}")
    with pytest.raises(LinkInRunError):
        local_files.open_inside(root, f"{root}/ckpt/../../elsewhere/file.bin")
    with pytest.raises(FileNotFoundError):
        local_files.open_inside(root, f"{root}/ckpt/missing")
    assert not local_files.link_below(root, f"{root}/ckpt/own.bin")
    (tmp_path / "root-link").symlink_to(run)  # the root itself may be a link
    linked_root = str(tmp_path / "root-link")
    assert local_files.read_inside(linked_root, f"{linked_root}/ckpt/own.bin") == b"own"


def test_remove_inside_unlinks_links_and_never_empties_a_shared_file(run: Path, tmp_path: Path) -> None:
    root, outside = str(run), tmp_path / "elsewhere" / "file.bin"
    (run / "ckpt" / "link").symlink_to(outside)
    os.link(outside, run / "ckpt" / "hard")
    local_files.remove_inside(root, f"{root}/ckpt/link", truncate=True)
    local_files.remove_inside(root, f"{root}/ckpt/hard", truncate=True)
    assert outside.read_bytes() == b"outside" and os.stat(outside).st_nlink == 1
    assert sorted(os.listdir(run / "ckpt")) == ["own.bin", "sub"]
    with open(run / "ckpt" / "own.bin", "rb") as still_open:  # a file with one name is emptied first
        local_files.remove_inside(root, f"{root}/ckpt/own.bin", truncate=True)
        assert os.fstat(still_open.fileno()).st_size == 0
    local_files.remove_inside(root, f"{root}/ckpt/own.bin", truncate=True)  # gone already: fine
    os.mkfifo(run / "ckpt" / "fifo")  # no reader: opening it must not block
    local_files.empty_inside(root, f"{root}/ckpt/fifo")
    local_files.remove_inside(root, f"{root}/ckpt/fifo", truncate=True)
    assert not (run / "ckpt" / "fifo").exists()


def test_clear_for_write_gives_a_new_file_never_a_shared_one(run: Path, tmp_path: Path) -> None:
    root, outside = str(run), tmp_path / "elsewhere" / "file.bin"
    (run / "ckpt" / "link").symlink_to(outside)
    os.link(outside, run / "ckpt" / "hard")
    for name in ("link", "hard"):
        local_files.clear_for_write(root, f"{root}/ckpt/{name}")
        (run / "ckpt" / name).write_bytes(b"new")
    assert outside.read_bytes() == b"outside"
    assert local_files.is_plain_file(root, f"{root}/ckpt/hard")
    local_files.clear_for_write(root, f"{root}/new/deeper/file")  # makes the folders
    assert (run / "new" / "deeper").is_dir()
    (run / "ckpt" / "sub-link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LinkInRunError):
        local_files.clear_for_write(root, f"{root}/ckpt/sub-link/file.bin")
    with pytest.raises(LinkInRunError):
        local_files.make_parents_inside(root, f"{root}/ckpt/sub-link/x/y")
    assert sorted(os.listdir(tmp_path / "elsewhere")) == ["file.bin"]


def test_remove_folder_inside_unlinks_a_linked_folder(run: Path, tmp_path: Path) -> None:
    root = str(run)
    (run / "linked").symlink_to(tmp_path / "elsewhere")
    (run / "ckpt" / "sub" / "inner-link").symlink_to(tmp_path / "elsewhere")
    local_files.remove_folder_inside(root, f"{root}/linked")
    local_files.remove_folder_inside(root, f"{root}/ckpt")
    local_files.remove_folder_inside(root, f"{root}/ckpt")  # gone already: fine
    assert os.listdir(run) == [] and (tmp_path / "elsewhere" / "file.bin").read_bytes() == b"outside"


def test_is_plain_file(run: Path, tmp_path: Path) -> None:
    root = str(run)
    os.link(run / "ckpt" / "own.bin", run / "ckpt" / "second-name")
    (run / "ckpt" / "link").symlink_to(tmp_path / "elsewhere" / "file.bin")
    assert not local_files.is_plain_file(root, f"{root}/ckpt/own.bin")  # two names now
    assert not local_files.is_plain_file(root, f"{root}/ckpt/link")
    assert not local_files.is_plain_file(root, f"{root}/ckpt/sub")
    os.unlink(run / "ckpt" / "second-name")
    assert local_files.is_plain_file(root, f"{root}/ckpt/own.bin")


def test_create_whole_leaves_nothing_behind_when_it_fails(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "lease.json")
    real_fsync = os.fsync
    calls = []

    def fsync(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        if calls[-1] == str(tmp_path):  # the folder entry: a mount's failed upload
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        local_files.create_whole(path, b"data")
    assert os.listdir(tmp_path) == []  # neither the name (not durable) nor the temporary file
    monkeypatch.setattr(os, "fsync", real_fsync)
    local_files.create_whole(path, b"data")
    with pytest.raises(FileExistsError):
        local_files.create_whole(path, b"other")
    assert os.listdir(tmp_path) == ["lease.json"]
