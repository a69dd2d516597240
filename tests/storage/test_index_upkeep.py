"""The run index kept in step with the checkpoints (storage/index_upkeep.py): mended, never a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import commit, names, put_raw, raw, summary

from resumable import Manifest, RunStorage
from resumable.storage import run_index

OLD_INDEX = b'{"format":"resumable.index","format_version":1,"checkpoints":{}}'
# version 2 held one object per checkpoint, rows where version 3 holds columns
V2_INDEX = (b'{"format":"resumable.index","format_version":2,"checkpoints":{"ckpt-000001":{"epoch":1,'
            b'"step":0,"batch":0,"created":"","metrics":{},"files":{},"manifest_size":100}}}')


@pytest.mark.parametrize("old_index", [None, OLD_INDEX, V2_INDEX])
def test_the_next_commit_mends_an_index_that_misses_checkpoints(
    storage: RunStorage, tmp_path: Path, fs_calls: Any, old_index: bytes | None
) -> None:
    """A run from before the index, or with another version's index, is indexed whole again."""
    for epoch in range(1, 13):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch, metrics={"loss": 1 / epoch}))
    if old_index is None:
        storage.fs.rm_file(f"{storage.root}/index.json")
    else:
        put_raw(storage, old_index, "index.json")
    storage.fs.rm(f"{storage.root}/ckpt-000002", recursive=True)  # deleted by hand
    put_raw(storage, b"x", "ckpt-000013", "model.keras")  # an interrupted commit
    assert all(i.checked for i in storage.list(check_files=False))  # nothing usable indexed: slow path

    commit(storage, tmp_path, "ckpt-000014", Manifest(epoch=14, metrics={"loss": 0.01}))
    assert json.loads(raw(storage, "index.json"))["format_version"] == run_index.INDEX_VERSION
    indexed = run_index.decode(raw(storage, "index.json"))
    # not 2 (gone), not 13 (partial)
    assert sorted(indexed) == [f"ckpt-{e:06d}" for e in (1, *range(3, 13), 14)]
    calls = fs_calls(storage)
    quick = storage.list(check_files=False)
    assert [i.name for i in quick if i.checked] == ["ckpt-000013"]  # read from its own folder
    assert calls.get("http", 0) <= 4 if storage.is_gcs else calls["ls"] <= 2  # two requests, plus that folder
    assert summary(quick) == summary(storage.list())


def test_only_commits_that_may_find_the_index_incomplete_list_the_folder_to_mend_it(
    storage: RunStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage's first commit mends; later ones keep the index whole and skip that listing."""
    mends: list[str] = []
    upkeep = storage._index_upkeep
    original = upkeep.mend

    def counting(rows: dict[str, Any], keep: set[str]) -> None:
        mends.append(next(iter(keep)))
        original(rows, keep)

    monkeypatch.setattr(upkeep, "mend", counting)
    for epoch in (1, 2, 3):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    assert mends == ["ckpt-000001"]

    storage.fs.rm_file(f"{storage.root}/index.json")  # lost under a running process: mended again
    commit(storage, tmp_path, "ckpt-000004", Manifest(epoch=4))
    assert mends == ["ckpt-000001", "ckpt-000004"]
    assert indexed(storage) == [f"ckpt-{e:06d}" for e in (1, 2, 3, 4)]

    # a crash between a manifest and the index (here: ckpt-000004's entry taken out by hand)
    entries = run_index.decode(raw(storage, "index.json"))
    del entries["ckpt-000004"]
    put_raw(storage, run_index.encode(entries), "index.json")
    commit(storage, tmp_path, "ckpt-000005", Manifest(epoch=5))  # this storage: trusts its index
    assert "ckpt-000004" not in indexed(storage)
    assert summary(storage.list(check_files=False)) == summary(storage.list())  # listing checks that folder
    commit(RunStorage(storage.url), tmp_path, "ckpt-000006", Manifest(epoch=6))  # another process: mends
    assert indexed(storage) == [f"ckpt-{e:06d}" for e in range(1, 7)]


def indexed(storage: RunStorage) -> list[str]:
    return sorted(run_index.decode(raw(storage, "index.json")))


def test_the_index_never_shows_up_as_a_checkpoint(storage: RunStorage, tmp_path: Path) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    assert raw(storage, "index.json").startswith(b'{"format":"resumable.index"')
    assert names(storage.list()) == names(storage.list(check_files=False)) == ["ckpt-000001"]


def test_the_next_writer_removes_the_index_copies_killed_writers_left(tmp_path: Path) -> None:
    """A writer killed between writing ``index.json.<pid>.tmp`` and renaming it: the next writer
    removes that copy when it takes the lease; a live process' copy, other names, links and
    anything outside the run folder stay."""
    import os
    import subprocess
    import sys

    from resumable.manager.run_manager import RunManager

    url = tmp_path / "run"
    commit(RunStorage(str(url)), tmp_path, "ckpt-000001", Manifest(epoch=1, step=10))
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    alive = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        outside = tmp_path / f"index.json.{gone}.tmp"
        kept = {f"index.json.{alive.pid}.tmp": b"live", f"lease.json.{gone}.tmp": b"other name",
                f"index.json.{gone}.tmp.bak": b"other name", f"ckpt-000001/index.json.{gone}.tmp": b"deeper"}
        for name, data in {**kept, f"index.json.{gone}.tmp": b"{half"}.items():
            (url / name).write_bytes(data)
        outside.write_bytes(b"outside")
        link = url / "index.json.999999999.tmp"  # a link at that name (of no process): not followed
        os.symlink(outside, link)
        manager = RunManager(str(url))
        manager.writer.acquire()
        manager.release()
        assert not (url / f"index.json.{gone}.tmp").exists()
        assert {name: (url / name).read_bytes() for name in kept} == kept
        assert link.is_symlink() and outside.read_bytes() == b"outside"
        assert names(RunStorage(str(url)).list()) == ["ckpt-000001"]
    finally:
        alive.kill()
        alive.wait()
