"""The commit protocol (storage/commit.py): create-only commits, leftovers, deletes, manifest races."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import FILES, commit, names, put_raw, raw, stage

from resumable import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    Manifest,
    ResumableError,
    RetryPolicy,
    RunStorage,
    Status,
)
from resumable.core.manifest import MANIFEST_NAME

# ----------------------------------------------------------------- commit


def test_commit_is_create_only(storage: RunStorage, tmp_path: Path) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    before = {rel: raw(storage, "ckpt-000001", rel) for rel in [*FILES, MANIFEST_NAME]}
    other = {rel: data + b"!" for rel, data in FILES.items()}
    with pytest.raises(CheckpointExistsError, match="ckpt-000001 is already committed"):
        commit(storage, tmp_path / "again", "ckpt-000001", Manifest(epoch=9), other)
    assert {rel: raw(storage, "ckpt-000001", rel) for rel in before} == before
    assert storage.verify("ckpt-000001") == []


def test_commit_of_a_checkpoint_from_a_newer_version_is_refused(storage: RunStorage, tmp_path: Path) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    doc = json.loads(raw(storage, "ckpt-000001", MANIFEST_NAME))
    doc["format_version"] = 99
    newer = json.dumps(doc).encode()
    put_raw(storage, newer, "ckpt-000001", MANIFEST_NAME)
    with pytest.raises(CheckpointExistsError):
        commit(storage, tmp_path / "again", "ckpt-000001", Manifest(epoch=1))
    assert raw(storage, "ckpt-000001", MANIFEST_NAME) == newer


@pytest.mark.parametrize("leftover", ["no manifest", "torn manifest"])
def test_leftovers_of_an_interrupted_commit_are_replaced(
    storage: RunStorage, tmp_path: Path, leftover: str
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    put_raw(storage, b"half a model", "ckpt-000002", "model.keras")
    put_raw(storage, b"stale", "ckpt-000002", "old", "stale.bin")
    if leftover == "torn manifest":
        put_raw(storage, b'{"format": "resumable.checkpoint", "format_ver', "ckpt-000002", MANIFEST_NAME)
    status = Status.PARTIAL if leftover == "no manifest" else Status.CORRUPT
    assert [(i.name, i.status) for i in storage.list()] == [
        ("ckpt-000001", Status.OK),
        ("ckpt-000002", status),
    ]
    assert names(storage.newest_first()) == ["ckpt-000001"]

    info = commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    assert info.ok
    got = storage.get("ckpt-000002")
    assert got.ok and set(got.listed) == {*FILES, MANIFEST_NAME}  # the stale file is gone
    assert raw(storage, "ckpt-000002", "model.keras") == FILES["model.keras"]
    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000002"


def test_commit_needs_files(storage: RunStorage, tmp_path: Path) -> None:
    with pytest.raises(ResumableError, match="no such folder"):
        storage.commit(tmp_path / "missing", "ckpt-000001", Manifest(epoch=1))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResumableError, match="no files"):
        storage.commit(tmp_path / "empty", "ckpt-000001", Manifest(epoch=1))
    with pytest.raises(ResumableError, match="invalid checkpoint name"):
        storage.commit(stage(tmp_path / "s"), "a/b", Manifest(epoch=1))
    assert storage.list() == []


def test_a_manifest_in_the_source_folder_is_not_copied(storage: RunStorage, tmp_path: Path) -> None:
    source = stage(tmp_path / "s")
    (source / MANIFEST_NAME).write_text("not ours")
    info = storage.commit(source, "ckpt-000001", Manifest(epoch=1))
    assert info.manifest is not None and MANIFEST_NAME not in info.manifest.files
    assert storage.verify("ckpt-000001") == []



# ----------------------------------------------------------------- delete


def test_delete(storage: RunStorage, tmp_path: Path) -> None:
    for epoch in (1, 2, 3):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    storage.delete("ckpt-000002")
    storage.delete(storage.get("ckpt-000003"))
    assert names(storage.list()) == ["ckpt-000001"]
    with pytest.raises(CheckpointNotFoundError):
        storage.get("ckpt-000002")
    assert storage.fs.find(f"{storage.root}/ckpt-000002") == []
    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000001"
    with pytest.raises(ResumableError, match="invalid checkpoint name"):
        storage.delete("..")


def test_delete_removes_the_manifest_first(
    storage: RunStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    removed: list[str] = []
    original = storage.fs.rm_file
    monkeypatch.setattr(storage.fs, "rm_file", lambda p: (removed.append(p.rsplit("/", 1)[-1]), original(p)))
    storage.delete("ckpt-000001")
    assert removed[0] == MANIFEST_NAME and sorted(removed[1:]) == sorted(p.rsplit("/", 1)[-1] for p in FILES)


def test_delete_updates_the_index_before_removing_the_manifest(
    storage: RunStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for epoch in (1, 2):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    events: list[str] = []
    folder = storage._folder  # the RunFolder every part of the storage writes through
    original_rm = storage.fs.rm_file
    original_replace = folder.replace_file
    monkeypatch.setattr(storage.fs, "rm_file", lambda p: (
        events.append(p.rsplit("/", 1)[-1]), original_rm(p)))
    monkeypatch.setattr(folder, "replace_file", lambda p, d: (
        events.append("index"), original_replace(p, d)))
    storage.delete("ckpt-000001")
    assert events[:2] == ["index", MANIFEST_NAME]
    assert names(storage.list(check_files=False)) == ["ckpt-000002"]

    def broken(path: str, data: bytes) -> None:
        raise OSError(errno.EIO, "Input/output error")

    # An index that cannot be updated would vouch for a folder without a manifest: nothing is deleted.
    monkeypatch.setattr(folder, "replace_file", broken)
    monkeypatch.setattr(storage, "retry", RetryPolicy(attempts=1))
    with pytest.raises(ResumableError, match="index.json"):
        storage.delete("ckpt-000002")
    assert [(i.name, i.ok) for i in storage.list()] == [("ckpt-000002", True)]


def test_delete_truncates_first_when_asked(
    run_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = RunStorage(run_url, truncate_before_delete=True)
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    sizes_at_removal: dict[str, int] = {}
    original = storage.fs.rm_file

    def rm_file(path: str) -> None:
        storage.fs.invalidate_cache(path)
        sizes_at_removal[path.rsplit("ckpt-000001/", 1)[-1]] = int(storage.fs.info(path)["size"])
        original(path)

    monkeypatch.setattr(storage.fs, "rm_file", rm_file)
    storage.delete("ckpt-000001")
    assert sizes_at_removal == dict.fromkeys([*FILES, MANIFEST_NAME], 0)
    assert names(storage.list()) == ["ckpt-000002"]
    assert storage.verify("ckpt-000002") == []



# ----------------------------------------------------------------- manifest write races


def test_a_retried_manifest_write_that_had_landed_succeeds(
    storage: RunStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transient error after the manifest landed (a GCS 503, Drive's EIO): the retry finds our own."""
    name = "open" if storage.is_local else "pipe_file"
    original = getattr(storage.fs, name)
    failed: list[bool] = []

    def write_then_fail(path: str, *args: Any, **kwargs: Any) -> Any:
        result = original(path, *args, **kwargs)
        if path.endswith(MANIFEST_NAME) and not failed:
            failed.append(True)
            if name == "open":
                return _FailOnClose(result)
            raise OSError(5, "Input/output error")
        return result

    monkeypatch.setattr(storage.fs, name, write_then_fail)
    info = commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    assert failed and info.ok
    assert storage.get("ckpt-000001").ok


class _FailOnClose:
    def __init__(self, f: Any) -> None:
        self.f = f

    def __enter__(self) -> _FailOnClose:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()
        raise OSError(5, "Input/output error")

    def write(self, data: bytes) -> int:
        return int(self.f.write(data))


def test_a_manifest_written_by_another_process_meanwhile_wins(
    storage: RunStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "open" if storage.is_local else "pipe_file"
    original = getattr(storage.fs, name)
    theirs = Manifest(epoch=7, files={}).to_json()

    def race(path: str, *args: Any, **kwargs: Any) -> Any:
        if path.endswith(MANIFEST_NAME) and not raced:
            raced.append(path)
            storage.fs.pipe_file(path, theirs)  # the other writer was faster
        return original(path, *args, **kwargs)

    raced: list[str] = []

    monkeypatch.setattr(storage.fs, name, race)
    with pytest.raises(CheckpointExistsError, match="another process"):
        commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    assert raw(storage, "ckpt-000001", MANIFEST_NAME) == theirs
