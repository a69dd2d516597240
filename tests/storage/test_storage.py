"""The RunStorage contract, run against a local folder, memory:// and a real fake-gcs-server."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resumable import (
    CheckpointExistsError,
    CheckpointInfo,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    Manifest,
    NotAFolderError,
    NotAuthenticatedError,
    ResumableError,
    RetryPolicy,
    RunNotFoundError,
    RunStorage,
    Status,
)
from resumable.core.checksum import crc32c_of_bytes
from resumable.core.manifest import MANIFEST_NAME, FileEntry
from resumable.core.naming import NameTemplate
from resumable.storage import ListedFile, run_index

FILES = {
    "model.keras": bytes(random.Random(0).randrange(256) for _ in range(50_000)),
    "state.json": b'{"epoch": 3}\n',
    "assets/vocab.txt": b"a\nb\n",
}


def stage(folder: Path, files: dict[str, bytes] | None = None) -> Path:
    for rel, data in (files or FILES).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def commit(
    storage: RunStorage, tmp_path: Path, name: str, manifest: Manifest, files: dict[str, bytes] | None = None
) -> Any:
    return storage.commit(stage(tmp_path / "stage" / name, files), name, manifest)


def raw(storage: RunStorage, *parts: str) -> bytes:
    return bytes(storage.fs.cat_file("/".join((storage.root, *parts))))


def put_raw(storage: RunStorage, data: bytes, *parts: str) -> None:
    path = "/".join((storage.root, *parts))
    if storage.is_local:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    storage.fs.pipe_file(path, data)


def names(infos: Any) -> list[str]:
    return [info.name for info in infos]


@pytest.fixture
def storage(run_url: str) -> RunStorage:
    return RunStorage(run_url, retry=RetryPolicy(attempts=2, initial_delay=0.001))


# ----------------------------------------------------------------- round trip


def test_empty_run(storage: RunStorage) -> None:
    assert storage.list() == []
    assert storage.latest() is None
    assert list(storage.newest_first()) == []
    assert storage.exists() is False
    with pytest.raises(CheckpointNotFoundError, match="ckpt-000001: no such checkpoint"):
        storage.get("ckpt-000001")


def test_commit_list_latest_get_fetch_verify(storage: RunStorage, tmp_path: Path) -> None:
    info = commit(storage, tmp_path, "ckpt-000003", Manifest(epoch=3, step=300, metrics={"loss": 0.25}))
    assert info.ok and info.name == "ckpt-000003" and info.url == f"{storage.url}/ckpt-000003"
    assert storage.exists() is True

    [listed] = storage.list()
    assert listed.status is Status.OK and listed.problem == ""
    assert (listed.epoch, listed.step, listed.metrics) == (3, 300, {"loss": 0.25})
    assert listed.size == sum(len(d) for d in FILES.values()) + len(
        raw(storage, "ckpt-000003", MANIFEST_NAME)
    )

    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000003" and latest.ok
    got = storage.get("ckpt-000003")
    assert got.manifest is not None
    assert {rel: (e.size, e.crc32c) for rel, e in got.manifest.files.items()} == {
        rel: (len(data), crc32c_of_bytes(data)) for rel, data in FILES.items()
    }
    assert got.manifest.created_at is not None

    cache = storage.fetch(latest, tmp_path / "cache")
    assert {p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()} == {
        *FILES,
        MANIFEST_NAME,
    }
    for rel, data in FILES.items():
        assert (cache / rel).read_bytes() == data
        assert raw(storage, "ckpt-000003", rel) == data
    assert Manifest.from_json((cache / MANIFEST_NAME).read_bytes(), "cache").epoch == 3
    assert storage.verify("ckpt-000003") == []
    # fetching by name into the same folder again is a no-op that still checks
    assert storage.fetch("ckpt-000003", tmp_path / "cache") == cache


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


# ----------------------------------------------------------------- ordering


def test_ordering_by_epoch_and_step_not_by_name_or_time(run_url: str, tmp_path: Path) -> None:
    storage = RunStorage(run_url, filename="ckpt-{epoch}")  # unpadded: "ckpt-10" < "ckpt-9" as text
    template = NameTemplate("ckpt-{epoch}")
    saves = [  # (epoch, step, mid-epoch), committed in shuffled order
        (10, 1000, False),
        (2, 200, False),
        (9, 900, False),
        (2, 250, True),
        (1, 100, False),
        (9, 950, True),
    ]
    for epoch, step, mid in saves:
        name = template.format(epoch, step, mid_epoch=mid)
        commit(storage, tmp_path, name, Manifest(epoch=epoch, step=step, batch=50 if mid else 0))
    expected = ["ckpt-1", "ckpt-2", "ckpt-2-step-000000250", "ckpt-9", "ckpt-9-step-000000950", "ckpt-10"]
    assert names(storage.list()) == expected
    assert names(storage.list(check_files=False)) == expected  # every one from the index
    put_raw(storage, b"half", "ckpt-5", "model.keras")  # then a partial folder, not indexed: the other path
    assert names(storage.list(check_files=False)) == expected[:3] + ["ckpt-5"] + expected[3:]
    assert names(storage.newest_first()) == expected[::-1]
    latest = storage.latest()
    assert latest is not None and (latest.name, latest.epoch, latest.step) == ("ckpt-10", 10, 1000)


def test_ordering_with_a_metric_template(run_url: str, tmp_path: Path) -> None:
    template = "weights-{epoch:02d}-{val_accuracy:.3f}"
    storage = RunStorage(run_url, filename=template)
    made = []
    for epoch, acc in [(3, 0.912), (100, 0.5), (12, 0.999), (7, float("nan"))]:
        name = NameTemplate(template).format(epoch, logs={"val_accuracy": acc})
        commit(storage, tmp_path, name, Manifest(epoch=epoch, step=epoch * 10, metrics={"val_accuracy": acc}))
        made.append(name)
    assert made == ["weights-03-0.912", "weights-100-0.500", "weights-12-0.999", "weights-07-nan"]
    assert names(storage.list()) == [
        "weights-03-0.912",
        "weights-07-nan",
        "weights-12-0.999",
        "weights-100-0.500",
    ]
    latest = storage.latest()
    assert (
        latest is not None and latest.name == "weights-100-0.500" and latest.metrics == {"val_accuracy": 0.5}
    )


def test_names_from_another_template_are_ordered_by_their_manifests(
    run_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = RunStorage(run_url, filename="old-{epoch}")
    commit(old, tmp_path, "old-5", Manifest(epoch=5, step=50))
    commit(old, tmp_path, "old-7", Manifest(epoch=7, step=70))
    new = RunStorage(run_url)  # the default template cannot parse "old-7"
    commit(new, tmp_path, "ckpt-000006", Manifest(epoch=6, step=60))
    put_raw(new, b"x", "ckpt-000003", "model.keras")  # partial, older than old-7
    put_raw(new, b"x", "ckpt-000009", "model.keras")  # partial, newer than old-7
    assert names(new.list()) == ["ckpt-000003", "old-5", "ckpt-000006", "old-7", "ckpt-000009"]
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert names(new.newest_first()) == ["old-7", "ckpt-000006", "old-5"]
    assert "ckpt-000009: no manifest" in caplog.text and "ckpt-000003" not in caplog.text


# ----------------------------------------------------------------- cost of latest()

COUNTED = (
    "find",
    "ls",
    "walk",
    "glob",
    "info",
    "exists",
    "isdir",
    "isfile",
    "cat",
    "cat_file",
    "open",
    "get_file",
    "du",
    "expand_path",
)


@pytest.fixture
def fs_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Count the filesystem calls RunStorage makes (not those fsspec makes inside them)."""

    def install(storage: RunStorage) -> Counter[str]:
        calls: Counter[str] = Counter()
        depth = [0]
        for name in COUNTED:
            original = getattr(storage.fs, name)

            def wrapper(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
                if not depth[0]:
                    calls[_name] += 1
                depth[0] += 1
                try:
                    return _original(*args, **kwargs)
                finally:
                    depth[0] -= 1

            monkeypatch.setattr(storage.fs, name, wrapper)
        if storage.is_gcs:  # and every HTTP request gcsfs sends
            original_call = storage.fs._call

            async def counting_call(*args: Any, **kwargs: Any) -> Any:
                calls["http"] += 1
                return await original_call(*args, **kwargs)

            monkeypatch.setattr(storage.fs, "_call", counting_call)
        return calls

    yield install


@pytest.mark.parametrize("count", [3, 12])
def test_latest_costs_one_listing_and_one_manifest_read(
    storage: RunStorage, tmp_path: Path, fs_calls: Any, count: int
) -> None:
    small = {"model.keras": b"m", "state.json": b"{}"}
    for epoch in range(1, count + 1):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch), small)
    put_raw(storage, b"x", "ckpt-000001-step-000000005", "model.keras")  # an old partial save
    calls = fs_calls(storage)
    latest = storage.latest()
    assert latest is not None and latest.name == f"ckpt-{count:06d}"
    http = calls.pop("http", None)
    assert calls == Counter(find=1, cat_file=1)
    if storage.is_gcs:
        assert http == 2  # one object listing (up to 1,000 objects a page), one GET of the manifest


def summary(infos: Any) -> list[tuple[Any, ...]]:
    return [(i.name, i.status, i.epoch, i.step, i.size, i.metrics, i.created) for i in infos]


@pytest.mark.parametrize("count", [3, 12])
def test_quick_list_costs_two_requests_and_agrees_with_the_full_one(
    storage: RunStorage, tmp_path: Path, fs_calls: Any, count: int
) -> None:
    for epoch in range(1, count + 1):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 7,
                                                               metrics={"loss": 1 / epoch}))
    full = storage.list()
    calls = fs_calls(storage)
    quick = storage.list(check_files=False)
    http = calls.pop("http", None)
    if storage.is_gcs:
        assert http == 2  # the folder names and the run index, sent together
    else:
        assert calls == Counter(ls=1, cat_file=1)
    assert summary(quick) == summary(full)
    assert not any(i.checked for i in quick) and all(i.checked for i in full)


def test_an_indexed_checkpoint_is_the_dataclass_its_constructor_builds(
    storage: RunStorage, tmp_path: Path
) -> None:
    """`list` builds indexed infos lazily, without the dataclass' __init__: still equal, sized, frozen."""
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1, step=3, metrics={"loss": 0.5}))
    (quick,) = storage.list(check_files=False)
    (full,) = storage.list()
    assert isinstance(quick, CheckpointInfo)
    # read before the manifest and files are built from the row, then after
    early = (quick.epoch, quick.step, quick.metrics, quick.size, quick.created, quick.created_iso, quick.ok)
    built = CheckpointInfo(quick.name, quick.url, Status.OK, quick.manifest, listed=dict(quick.listed),
                           checked=False)
    assert all(getattr(quick, f.name) == getattr(built, f.name) for f in dataclasses.fields(CheckpointInfo))
    assert full.manifest is not None and quick.manifest.files == full.manifest.files
    recorded = {rel: ListedFile(e.size, e.crc32c, None) for rel, e in full.manifest.files.items()}
    recorded[MANIFEST_NAME] = ListedFile(full.listed[MANIFEST_NAME].size, None, None)
    assert quick.listed == recorded
    assert early == (built.epoch, built.step, built.metrics, built.size, built.created, built.created_iso,
                     True)
    assert repr(quick).replace("_IndexedInfo", "CheckpointInfo") == repr(built)
    assert quick.manifest is not None and quick.manifest.files  # built from the row: still the types
    assert all(type(f) is ListedFile for f in quick.listed.values())
    assert all(type(e) is FileEntry for e in quick.manifest.files.values())
    assert quick.size == built.size == sum(f.size for f in storage.list()[0].listed.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.status = Status.CORRUPT  # type: ignore[misc]
    copy = dataclasses.replace(quick, problem="x", manifest=Manifest(epoch=9, step=90, created=""))
    assert (copy.problem, copy.epoch, copy.step, copy.created_iso, quick.problem) == ("x", 9, 90, None, "")


def test_quick_list_without_a_usable_index_reads_the_manifests(storage: RunStorage, tmp_path: Path) -> None:
    """An old run, a lost or garbled index: the same answer, only slower."""
    for epoch in range(1, 13):  # more than QUICK_FALLBACK_FOLDERS: one recursive listing
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    full = summary(storage.list())
    for damage in (b"not json", b'{"format": "resumable.index", "format_version": 99}', None):
        if damage is None:
            storage.fs.rm_file(f"{storage.root}/index.json")
        else:
            put_raw(storage, damage, "index.json")
        assert summary(storage.list(check_files=False)) == full
        assert all(i.checked for i in storage.list(check_files=False))


def test_quick_list_drops_folders_gone_and_checks_folders_not_indexed(
    storage: RunStorage, tmp_path: Path
) -> None:
    for epoch in (1, 2, 3):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch))
    storage.fs.rm(f"{storage.root}/ckpt-000002", recursive=True)  # deleted by hand: still in the index
    put_raw(storage, b"x", "ckpt-000004", "model.keras")  # an interrupted commit: not in the index
    put_raw(storage, b"{", "ckpt-000005", "model.keras")
    put_raw(storage, b'{"format": "resumable.checkpoint", "format_version": 7}', "ckpt-000005", MANIFEST_NAME)
    quick = storage.list(check_files=False)
    assert [(i.name, str(i.status), i.checked) for i in quick] == [
        ("ckpt-000001", "ok", False), ("ckpt-000003", "ok", False),
        ("ckpt-000004", "partial", True), ("ckpt-000005", "corrupt", True),
    ]
    assert summary(quick) == summary(storage.list())


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
    original = storage._mend_index

    def counting(entries: dict[str, Any], keep: set[str]) -> None:
        mends.append(next(iter(keep)))
        original(entries, keep)

    monkeypatch.setattr(storage, "_mend_index", counting)
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


def test_latest_skips_newer_bad_checkpoints_with_a_warning(
    storage: RunStorage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    put_raw(storage, b"{", "ckpt-000002", MANIFEST_NAME + ".bak")  # an unrelated file does not matter
    put_raw(storage, b"half", "ckpt-000004", "model.keras")  # interrupted save: partial
    commit(storage, tmp_path, "ckpt-000003", Manifest(epoch=3))
    storage.fs.rm_file(f"{storage.root}/ckpt-000003/state.json")  # a file gone: corrupt
    with caplog.at_level(logging.WARNING, logger="resumable"):
        latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000002"
    text = caplog.text
    assert "ckpt-000004: no manifest" in text and "ckpt-000003: state.json missing" in text
    listed = {i.name: i for i in storage.list()}
    assert (listed["ckpt-000003"].status, listed["ckpt-000004"].status) == (Status.CORRUPT, Status.PARTIAL)
    assert listed["ckpt-000002"].ok
    with pytest.raises(CorruptCheckpointError, match="state.json missing"):
        storage.fetch(listed["ckpt-000003"], tmp_path / "c3")
    with pytest.raises(CorruptCheckpointError, match="no manifest"):
        storage.fetch("ckpt-000004", tmp_path / "c4")
    assert storage.verify("ckpt-000004") == [f"{storage.url}/ckpt-000004: no manifest (an interrupted save)"]
    assert storage.verify("ckpt-000003") == [f"{storage.url}/ckpt-000003/state.json: missing"]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda blob: blob[: len(blob) // 2], "manifest is not valid JSON"),
        (
            lambda blob: blob.replace(b'"format_version": 1', b'"format_version": 99'),
            "manifest format 99 is newer",
        ),
        (lambda blob: b"[]", "not a resumable manifest"),
        (lambda blob: blob.replace(b'"epoch"', b'"epoch_"'), "missing or has a bad field"),
    ],
    ids=["truncated", "format-99", "not-ours", "no-epoch"],
)
def test_bad_manifests_are_corrupt_and_skipped(
    storage: RunStorage, tmp_path: Path, damage: Any, problem: str
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    commit(storage, tmp_path, "ckpt-000002", Manifest(epoch=2))
    blob = raw(storage, "ckpt-000002", MANIFEST_NAME)
    damaged = damage(blob)
    assert damaged != blob
    put_raw(storage, damaged, "ckpt-000002", MANIFEST_NAME)
    info = storage.get("ckpt-000002")
    assert info.status is Status.CORRUPT and problem in info.problem and "\n" not in info.problem
    assert names(storage.newest_first()) == ["ckpt-000001"]
    assert [i.status for i in storage.list()] == [Status.OK, Status.CORRUPT]
    assert storage.verify(info) == [f"{storage.url}/ckpt-000002: {info.problem}"]


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
    original_rm = storage.fs.rm_file
    original_replace = storage._replace_file
    monkeypatch.setattr(storage.fs, "rm_file", lambda p: (
        events.append(p.rsplit("/", 1)[-1]), original_rm(p)))
    monkeypatch.setattr(storage, "_replace_file", lambda p, d: (
        events.append("index"), original_replace(p, d)))
    storage.delete("ckpt-000001")
    assert events[:2] == ["index", MANIFEST_NAME]
    assert names(storage.list(check_files=False)) == ["ckpt-000002"]

    def broken(path: str, data: bytes) -> None:
        raise OSError(errno.EIO, "Input/output error")

    # An index that cannot be updated would vouch for a folder without a manifest: nothing is deleted.
    monkeypatch.setattr(storage, "_replace_file", broken)
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


def test_truncate_before_delete_defaults_to_drive_only(tmp_path: Path) -> None:
    assert RunStorage(str(tmp_path)).truncate_before_delete is False
    assert RunStorage("/content/drive/MyDrive/runs/exp1").truncate_before_delete is True
    assert RunStorage("memory://content/drive/x").truncate_before_delete is False


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


# ----------------------------------------------------------------- errors


def test_run_url_that_is_a_file(run_url: str) -> None:
    storage = RunStorage(run_url)
    if storage.is_local:
        Path(storage.root).parent.mkdir(parents=True, exist_ok=True)
    storage.fs.pipe_file(storage.root, b"not a folder")
    for call in (storage.list, storage.latest, storage.exists, lambda: storage.get("ckpt-000001"),
                 lambda: storage.list(check_files=False)):
        with pytest.raises(NotAFolderError, match="is a file, not a run folder") as caught:
            call()
        assert run_url in str(caught.value) and "\n" not in str(caught.value)
        assert isinstance(caught.value, NotADirectoryError)


def test_missing_bucket(gcs_server: str, tmp_path: Path) -> None:
    storage = RunStorage("gs://no-such-bucket-4c1d/runs/exp1")
    started = time.monotonic()
    for call in (
        storage.list,
        lambda: storage.list(check_files=False),
        storage.latest,
        storage.exists,
        lambda: storage.commit(stage(tmp_path / "s"), "ckpt-000001", Manifest(epoch=1)),
    ):
        with pytest.raises(RunNotFoundError) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and "gs://no-such-bucket-4c1d" in message and "bucket" in message
        assert isinstance(caught.value, FileNotFoundError)
    assert time.monotonic() - started < 5


def test_missing_local_folder_is_an_empty_run(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "not" / "yet"))
    assert storage.list() == [] and storage.latest() is None and storage.exists() is False
    assert storage.list(check_files=False) == []


def test_empty_url_is_refused() -> None:
    with pytest.raises(ResumableError, match="empty"):
        RunStorage("")


def _bad_service_account(tmp_path: Path, token_uri: str) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = tmp_path / "service-account.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "k",
                "private_key": key.decode(),
                "client_email": "nobody@p.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )
    return path


@pytest.fixture
def refusing_token_server() -> Iterator[str]:
    """A token endpoint on 127.0.0.1 that answers every refresh with 400 invalid_grant."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps(
                {"error": "invalid_grant", "error_description": "Invalid JWT\nSignature."}
            ).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("in_colab", [False, True])
def test_not_authenticated_fails_fast_with_one_line(
    gcs_bucket: str,
    tmp_path: Path,
    refusing_token_server: str,
    monkeypatch: pytest.MonkeyPatch,
    in_colab: bool,
) -> None:
    """gcsfs alone retries a failed token refresh for over 30 s; we refresh once and say what to do."""
    import gcsfs

    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(_bad_service_account(tmp_path, refusing_token_server))
    )
    monkeypatch.delenv("FSSPEC_GCS_TOKEN", raising=False)
    if in_colab:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261101-060000_RC00")
    else:
        monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
        monkeypatch.delenv("COLAB_GPU", raising=False)
    gcsfs.GCSFileSystem.clear_instance_cache()
    url = f"{gcs_bucket}/runs/exp1"
    storage = RunStorage(url, storage_options={"token": "google_default"})
    assert storage.fs.credentials.method == "google_default"  # real credentials, not anon
    started = time.monotonic()
    with pytest.raises(NotAuthenticatedError) as caught:
        storage.latest()
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert (
        message.startswith(f"{url}: not authenticated") and "\n" not in message and "invalid_grant" in message
    )
    assert ("authenticate_user()" in message) is in_colab
    assert isinstance(caught.value, PermissionError)
    gcsfs.GCSFileSystem.clear_instance_cache()
