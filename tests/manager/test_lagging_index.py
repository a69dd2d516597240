"""A run whose index knows only its first checkpoints (a crash, a copy): resume, list and prune.

Real storage on every backend. The cost is checked by what is read, never by timing: the
manifests each path opens are recorded through the run folder's own filesystem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import commit, put_raw, raw

from resumable.cli.app import main as cli_main
from resumable.core.checksum import crc32c_of_bytes
from resumable.core.manifest import MANIFEST_NAME, FileEntry, Manifest
from resumable.manager.run_manager import RunManager
from resumable.storage import RunStorage, run_index
from resumable.storage.folder import RunFolder

COUNT = 12  # checkpoints in the run
INDEXED = 3  # of them in its index


def name_of(epoch: int) -> str:
    return f"ckpt-{epoch:06d}"


def lagging_run(url: str, tmp_path: Path) -> RunStorage:
    """COUNT committed checkpoints; the index knows the first INDEXED (the others came without it)."""
    storage = RunStorage(url)
    for epoch in range(1, COUNT + 1):
        payload = bytes([epoch]) * 64
        manifest = Manifest(epoch=epoch, step=epoch * 10, metrics={"val_loss": 1 / epoch},
                            state={"monitor": "val_loss", "mode": "min"})
        if epoch <= INDEXED:  # the writer's own path: files, manifest, index
            commit(storage, tmp_path, name_of(epoch), manifest, {"model.weights.h5": payload})
            continue
        put_raw(storage, payload, name_of(epoch), "model.weights.h5")  # as a copy or a crash leaves them
        files = {"model.weights.h5": FileEntry(len(payload), crc32c_of_bytes(payload))}
        put_raw(storage, Manifest(epoch=epoch, step=epoch * 10, files=files, metrics=manifest.metrics,
                                  state=manifest.state).to_json(), name_of(epoch), MANIFEST_NAME)
    assert sorted(indexed(storage)) == [name_of(e) for e in range(1, INDEXED + 1)]
    return storage


def indexed(storage: RunStorage) -> dict[str, Any]:
    return run_index.decode(raw(storage, run_index.INDEX_NAME))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The manifests a storage object reads: every read goes through its filesystem's cat_file."""

    def install(storage: RunStorage) -> list[str]:
        seen: list[str] = []
        original = storage.fs.cat_file

        def cat_file(path: str, *args: Any, **kwargs: Any) -> Any:
            if str(path).endswith(MANIFEST_NAME):
                seen.append(str(path).rstrip("/").split("/")[-2])
            return original(path, *args, **kwargs)

        monkeypatch.setattr(storage.fs, "cat_file", cat_file)
        return seen

    return install


@pytest.fixture
def index_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each write of a run index, by any storage object (the one way the index is written)."""
    writes: list[str] = []
    original = RunFolder.replace_file

    def replace_file(self: RunFolder, path: str, data: bytes) -> None:
        if path.endswith(run_index.INDEX_NAME):
            writes.append(self.url)
        original(self, path, data)

    monkeypatch.setattr(RunFolder, "replace_file", replace_file)
    return writes


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths listed recursively (every file below them), by any storage object."""
    listed: list[str] = []
    original = RunFolder.list_files

    def list_files(self: RunFolder, path: str | None = None) -> Any:
        listed.append(path or self.root)
        return original(self, path)

    monkeypatch.setattr(RunFolder, "list_files", list_files)
    return listed


def test_resume_takes_the_newest_and_reads_no_older_manifest(
    run_url: str, tmp_path: Path, reads: Any, index_writes: list[str], listings: list[str]
) -> None:
    lagging_run(run_url, tmp_path)
    index_writes.clear()  # those of the first commits
    listings.clear()
    manager = RunManager(run_url, staging_dir=tmp_path / "staging")
    seen = reads(manager.storage)
    found = manager.arriving_newest(warn=pytest.fail)
    assert found is not None
    with found[1] as arrival:
        arrival.result()
    assert found[0].name == name_of(COUNT)
    assert seen == [name_of(COUNT)]  # never every manifest: the older ones are not even opened
    assert listings == [f"{manager.storage.root}/{name_of(COUNT)}"]  # nor their folders listed
    assert index_writes == []  # a reader never writes the index


def test_a_damaged_newest_falls_back_to_the_next_older_and_reads_no_further(
    run_url: str, tmp_path: Path, reads: Any, index_writes: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    storage = lagging_run(run_url, tmp_path)
    put_raw(storage, b"\x00" * 64, name_of(COUNT), "model.weights.h5")  # same size, other bytes
    put_raw(storage, b"half", name_of(COUNT + 1), "model.weights.h5")  # a newer save, cut short
    index_writes.clear()
    manager = RunManager(run_url, staging_dir=tmp_path / "staging")
    seen = reads(manager.storage)
    problems: list[str] = []
    found = manager.arriving_newest(warn=problems.append)
    assert found is not None
    with found[1] as arrival:
        arrival.result()
    assert found[0].name == name_of(COUNT - 1)
    # found by its fetch (locally), or from the listing's CRC32Cs (GCS): said either way, once
    said = problems + [r.getMessage() for r in caplog.records if name_of(COUNT) + ":" in r.getMessage()]
    assert len(said) == 1 and "crc32c" in said[0].lower()
    assert seen == [name_of(COUNT), name_of(COUNT - 1)]
    assert index_writes == []


def test_a_walk_past_many_damaged_ones_still_finds_the_good_one(run_url: str, tmp_path: Path) -> None:
    """Past the first few folders, one listing serves the rest: the same answer as folder by folder."""
    storage = lagging_run(run_url, tmp_path)
    for epoch in range(3, COUNT + 1):  # all but the first two cut short: corrupt from the listing
        put_raw(storage, b"\x00" * 10, name_of(epoch), "model.weights.h5")
    assert [info.name for info in storage.newest_first()] == [name_of(2), name_of(1)]


def test_the_index_is_repaired_once_by_the_writer_holding_the_lease(
    run_url: str, tmp_path: Path, index_writes: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    storage = lagging_run(run_url, tmp_path)
    before = raw(storage, run_index.INDEX_NAME)
    index_writes.clear()
    reader = RunManager(run_url, staging_dir=tmp_path / "reader")
    assert reader.newest_good() is not None and reader.newest_good().name == name_of(COUNT)  # type: ignore[union-attr]
    assert cli_main(["list", run_url]) == 0
    assert cli_main(["prune", run_url, "--keep-last", "3", "--dry-run"]) == 0
    capsys.readouterr()
    assert index_writes == [] and raw(storage, run_index.INDEX_NAME) == before  # readers write nothing

    writer = RunManager(run_url, staging_dir=tmp_path / "writer", async_upload=False)
    writer.writer.acquire()
    try:
        for epoch in (COUNT + 1, COUNT + 2):
            folder = writer.writer.stage(name_of(epoch))
            folder.mkdir(parents=True)
            (folder / "model.weights.h5").write_bytes(bytes([epoch]) * 64)
            writer.writer.submit(folder, name_of(epoch), Manifest(epoch=epoch, step=epoch * 10))
            if epoch == COUNT + 1:
                # the first commit mended the index: every checkpoint, in its one write
                assert sorted(indexed(storage)) == [name_of(e) for e in range(1, COUNT + 2)]
                assert len(index_writes) == 1
    finally:
        writer.release()
    assert sorted(indexed(storage)) == [name_of(e) for e in range(1, COUNT + 3)]
    assert len(index_writes) == 2  # one per commit


def test_list_shows_every_checkpoint(
    run_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lagging_run(run_url, tmp_path)
    assert cli_main(["list", run_url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in shown["checkpoints"]] == [name_of(e) for e in range(1, COUNT + 1)]
    assert all(c["status"] == "ok" for c in shown["checkpoints"])
    assert shown["latest"] == name_of(COUNT) and shown["best"]["name"] == name_of(COUNT)


@pytest.mark.parametrize("damaged_newest", [False, True], ids=["intact", "damaged-newest"])
def test_prune_keeps_the_right_ones_and_lists_the_run_once(
    run_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], index_writes: list[str],
    listings: list[str], damaged_newest: bool,
) -> None:
    storage = lagging_run(run_url, tmp_path)
    if damaged_newest:  # cut short: corrupt from the listing
        put_raw(storage, b"\x00" * 10, name_of(COUNT), "model.weights.h5")
    index_writes.clear()
    listings.clear()
    assert cli_main(["prune", run_url, "--keep-last", "3", "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the newest good 3; a damaged newer one stays (its writer may still be at it)
    newest_good = COUNT - 1 if damaged_newest else COUNT
    kept = [name_of(e) for e in range(newest_good - 2, COUNT + 1)]
    assert out["kept"] == kept
    assert sorted(out["deleted"]) == [name_of(e) for e in range(1, newest_good - 2)]
    assert sorted(storage.fs.ls(storage.root, detail=False)) == sorted(
        [f"{storage.root}/{name}" for name in kept] + [f"{storage.root}/{run_index.INDEX_NAME}"])
    assert listings == [storage.root]  # one listing of the run, none per deleted folder
    assert len(index_writes) == 1  # the deleted ones left the index in one write, before any went
    assert set(indexed(storage)) <= set(kept)  # and it names no deleted folder
