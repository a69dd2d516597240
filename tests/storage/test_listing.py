"""Listing a run (storage/listing.py): ordering, the cost of latest() and list(), bad checkpoints."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import commit, names, put_raw, raw, summary

from resumable import CheckpointInfo, CorruptCheckpointError, Manifest, RunStorage, Status
from resumable.core.manifest import MANIFEST_NAME, FileEntry
from resumable.core.naming import NameTemplate
from resumable.storage import ListedFile

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



# ----------------------------------------------------------------- cost of latest() and the quick list


@pytest.mark.parametrize("count", [3, 12])
def test_latest_costs_three_requests_whatever_the_run_length(
    storage: RunStorage, tmp_path: Path, fs_calls: Any, count: int
) -> None:
    """The folder names, then the newest folder's files and its manifest: never every folder's files."""
    small = {"model.keras": b"m", "state.json": b"{}"}
    for epoch in range(1, count + 1):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", Manifest(epoch=epoch), small)
    put_raw(storage, b"x", "ckpt-000001-step-000000005", "model.keras")  # an old partial save
    calls = fs_calls(storage)
    latest = storage.latest()
    assert latest is not None and latest.name == f"ckpt-{count:06d}"
    http = calls.pop("http", None)
    assert calls == Counter(ls=1, find=1, cat_file=1)
    if storage.is_gcs:
        assert http == 3  # the folder names (1,000 a page), the newest folder's objects, its manifest



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
    """Indexed infos build their manifests and files when first read: still equal, sized, frozen."""
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
    assert type(quick) is CheckpointInfo and repr(quick) == repr(built)
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



# ----------------------------------------------------------------- bad checkpoints


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


def test_older_partial_folders_are_named_once_and_never_restored(
    storage: RunStorage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    commit(storage, tmp_path, "ckpt-000001", Manifest(epoch=1))
    put_raw(storage, b"half", "ckpt-000002", "model.keras")  # an upload killed, then replaced
    commit(storage, tmp_path, "ckpt-000003", Manifest(epoch=3))
    with caplog.at_level(logging.INFO, logger="resumable"):
        assert names(storage.newest_first()) == ["ckpt-000003", "ckpt-000001"]
    said = [r for r in caplog.records if "older partial" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and "ckpt-000002" in said[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


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
