"""The run index's rows (storage/run_index.py): what `resumable list` reads instead of every manifest."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from paths import ROOT

from resumable.core.manifest import FileEntry, Manifest
from resumable.storage import run_index
from resumable.storage.run_index import IndexRow


def test_an_entry_gives_back_the_listing_part_of_its_manifest() -> None:
    manifest = Manifest(
        epoch=7, step=700, batch=3, created="2026-11-22T08:00:00+00:00",
        files={"model.keras": FileEntry(1234, "0a1b2c3d"), "assets/v.txt": FileEntry(4, "deadbeef")},
        metrics={"loss": 0.25, "val_loss": math.nan, "acc": float("inf")},
        versions={"keras": "3.15.1"},
        state={"monitor": "val_loss", "mode": "min", "best": 0.2, "callbacks": {}},
    )
    blob = run_index.encode({"ckpt-000007": run_index.entry(manifest, 612)})
    decoded = run_index.decode(blob)
    row = decoded["ckpt-000007"]
    listed, size = row.manifest(), row.manifest_size
    assert size == 612
    assert (listed.epoch, listed.step, listed.batch, listed.created, listed.files) == (
        manifest.epoch, manifest.step, manifest.batch, manifest.created, manifest.files)
    assert all(type(e) is FileEntry for e in listed.files.values())
    assert listed.metrics["loss"] == 0.25 and math.isnan(listed.metrics["val_loss"])
    assert math.isnan(listed.metrics["acc"])  # JSON has no inf: null, read back as NaN
    assert listed.state == {"monitor": "val_loss", "mode": "min"}  # only what ranks checkpoints
    assert listed.versions == {}
    assert json.loads(blob)["format_version"] == run_index.INDEX_VERSION
    [(name, row)] = decoded.items()
    assert (name, row.manifest_size) == ("ckpt-000007", 612)
    assert repr(row.manifest()) == repr(listed)  # NaN != NaN: compare the text
    assert math.isnan(row.metrics["val_loss"])  # the row's own metrics are floats too (null: NaN)


def test_the_index_is_stored_a_column_at_a_time_in_name_order() -> None:
    files = {"a": FileEntry(1, "00000000")}
    entries = {f"ckpt-{e:06d}": run_index.entry(Manifest(epoch=e, step=10 * e, created=f"t{e}", files=files),
                                                100 + e)
               for e in (3, 1, 2)}
    raw = json.loads(run_index.encode(entries))
    assert raw["names"] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    assert raw["epoch"] == [1, 2, 3] and raw["step"] == [10, 20, 30]
    assert raw["manifest_size"] == [101, 102, 103]
    assert set(raw) == {"format", "format_version", *run_index.COLUMNS}
    assert run_index.decode(run_index.encode(entries)) == entries
    rows = run_index.decode(run_index.encode(entries))
    assert [(name, row.manifest().epoch, row.manifest_size) for name, row in rows.items()] == [
        ("ckpt-000001", 1, 101), ("ckpt-000002", 2, 102), ("ckpt-000003", 3, 103)]


def good_entry() -> IndexRow:
    return run_index.entry(Manifest(epoch=1, files={"a": FileEntry(1, "00000000")}, created="x"), 100)


def stored(row: IndexRow, **damage: Any) -> dict[str, Any]:
    """A row's values as the file holds them, by column, with ``damage`` applied."""
    return {**row.to_json(), **damage}


def index_of(rows: dict[str, dict[str, Any]]) -> bytes:
    """An index holding ``rows`` (values by column) as they are, as a hand edit could leave them."""
    data: dict[str, Any] = {"format": "resumable.index", "format_version": run_index.INDEX_VERSION,
                            "names": list(rows)}
    for column in run_index.COLUMNS[1:]:
        data[column] = [values[column] for values in rows.values()]
    return json.dumps(data).encode()


DAMAGES = [
    {"epoch": "1"}, {"epoch": True}, {"step": None}, {"manifest_size": 1.5}, {"manifest_size": True},
    {"files": {"a": [1]}}, {"files": {"a": ["1", "00000000"]}}, {"files": []}, {"metrics": {"loss": "low"}},
    {"metrics": []}, {"metrics": {"loss": [1]}}, {"created": 5}, {"state": {"monitor": 1}},
    {"state": {"best": 0.5}}, {"state": []},
    # file names that would lead out of the checkpoint folder, as a manifest refuses them
    {"files": {"../../outside": [1, "00000000"]}}, {"files": {"/etc/passwd": [1, "00000000"]}},
    {"files": {"a/./b": [1, "00000000"]}}, {"files": {"manifest.json": [1, "00000000"]}},
]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_bad_entry_is_refused_not_half_read(damage: dict[str, Any]) -> None:
    with pytest.raises((KeyError, TypeError, ValueError, AttributeError)):
        IndexRow.from_json(**stored(good_entry(), **damage))


@pytest.mark.parametrize("damage", DAMAGES)
def test_listing_leaves_out_a_bad_entry_and_keeps_the_others(damage: dict[str, Any]) -> None:
    """That folder's own manifest decides; its neighbours still come from the index."""
    blob = index_of({"ckpt-000001": stored(good_entry()), "ckpt-000002": stored(good_entry(), **damage),
                     "ckpt-000003": stored(good_entry())})
    assert list(run_index.decode(blob)) == ["ckpt-000001", "ckpt-000003"]


@pytest.mark.parametrize("damage", DAMAGES + [{"metrics": {"loss": 1}}])
def test_every_row_the_validator_lets_through_builds_its_manifest(damage: dict[str, Any]) -> None:
    """Rows that pass `IndexRow.from_json` are never built by `IndexRow.manifest` into an error later."""
    blob = index_of({"ckpt-000001": stored(good_entry()), "ckpt-000002": stored(good_entry(), **damage)})
    rows = run_index.decode(blob)
    assert "ckpt-000001" in rows
    for row in rows.values():
        assert isinstance(row.manifest(), Manifest)


def test_a_hand_made_row_does_not_change_how_the_others_read() -> None:
    entries = {f"ckpt-{e:06d}": run_index.entry(Manifest(
        epoch=e, step=e, files={"m.h5": FileEntry(e, "0000000a")}, metrics={"loss": 1 / e},
        created="2026-11-22T08:00:00+00:00", state={"monitor": "loss"}), 90) for e in (1, 2, 3)}
    alone = run_index.decode(run_index.encode(entries))
    hand_made = {name: stored(row) for name, row in entries.items()}
    hand_made["ckpt-000004"] = stored(good_entry(), metrics={"loss": 1})  # an integer metric
    beside = run_index.decode(index_of(hand_made))
    assert list(alone.values()) == list(beside.values())[:3]
    assert [repr(r.manifest()) for r in alone.values()] == [
        repr(r.manifest()) for r in list(beside.values())[:3]]
    hand_made_metrics = beside["ckpt-000004"].metrics
    assert hand_made_metrics == {"loss": 1.0} and type(hand_made_metrics["loss"]) is float


def test_a_nan_metric_reads_back_as_nan() -> None:
    """A diverged epoch (loss NaN, stored as null) is common: it reads back as NaN, a float."""
    files = {"a": FileEntry(1, "00000000")}
    entries = {f"ckpt-{e:06d}": run_index.entry(Manifest(epoch=e, metrics={"loss": loss, "acc": 0.5},
                                                         files=files), 90)
               for e, loss in ((1, 0.5), (2, math.nan), (3, math.inf))}
    raw = json.loads(run_index.encode(entries))
    assert raw["metrics"][1] == {"loss": None, "acc": 0.5}
    rows = list(run_index.decode(run_index.encode(entries)).values())
    assert len(rows) == 3
    assert rows[0].metrics == {"loss": 0.5, "acc": 0.5}
    assert [math.isnan(r.metrics["loss"]) for r in rows] == [False, True, True]
    assert all(type(v) is float for r in rows for v in r.metrics.values())
    assert math.isnan(rows[1].manifest().metrics["loss"])


def test_a_hand_made_integer_metric_reads_back_as_a_float() -> None:
    manifest = IndexRow.from_json(**stored(good_entry(), metrics={"loss": 0.5, "epochs_seen": 3})).manifest()
    assert manifest.metrics == {"loss": 0.5, "epochs_seen": 3.0}
    assert all(type(v) is float for v in manifest.metrics.values())


def columns(**change: Any) -> bytes:
    raw = json.loads(run_index.encode({"ckpt-000001": good_entry(), "ckpt-000002": good_entry()}))
    return json.dumps({**raw, **change}).encode()


@pytest.mark.parametrize("blob", [
    None, b"", b"not json", b"[]", b'{"format":"other"}',
    b'{"format":"resumable.index","format_version":1,"checkpoints":{"a":{"manifest":{}}}}',
    b'{"format":"resumable.index","format_version":2,"checkpoints":{"a":{"epoch":1,"step":0,"batch":0,'
    b'"created":"","metrics":{},"files":{},"manifest_size":9}}}',  # the layout of version 2: one object each
    columns(format_version=4),
    columns(epoch=[1]),  # a column shorter than the names: no row can be trusted to line up
    columns(names={"ckpt-000001": 1}),
    columns(metrics=None),
])
def test_an_unusable_index_decodes_to_nothing(blob: bytes | None) -> None:
    assert run_index.decode(blob) == {}


def test_a_good_index_of_the_same_shape_decodes() -> None:
    """The blobs above are refused for what they change, not for how they are built."""
    assert sorted(run_index.decode(columns())) == ["ckpt-000001", "ckpt-000002"]
    assert len(run_index.decode(columns())) == 2


def test_the_example_in_the_format_docs_is_an_index_this_version_reads() -> None:
    text = (ROOT / "docs" / "format.md").read_text()
    example = re.search(r'```json\n(\{"format":"resumable\.index".*?)```', text, re.S)
    assert example is not None
    listed = run_index.decode(example.group(1).encode())
    manifests = [(name, row.manifest()) for name, row in listed.items()]
    assert [(name, manifest.epoch, manifest.state["monitor"]) for name, manifest in manifests] == [
        ("ckpt-000001", 1, "val_loss"), ("ckpt-000002", 2, "val_loss")]
