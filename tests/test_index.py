"""The run index's entries: what `resumable list` reads instead of every manifest."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from resumable import index as run_index
from resumable.manifest import FileEntry, Manifest


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
    listed, size = run_index.manifest_of(decoded["ckpt-000007"])
    assert size == 612
    assert (listed.epoch, listed.step, listed.batch, listed.created, listed.files) == (
        manifest.epoch, manifest.step, manifest.batch, manifest.created, manifest.files)
    assert listed.metrics["loss"] == 0.25 and math.isnan(listed.metrics["val_loss"])
    assert math.isnan(listed.metrics["acc"])  # JSON has no inf: null, read back as NaN
    assert listed.state == {"monitor": "val_loss", "mode": "min"}  # only what ranks checkpoints
    assert listed.versions == {}
    assert json.loads(blob)["format_version"] == run_index.INDEX_VERSION


def good_entry() -> dict[str, Any]:
    return run_index.entry(Manifest(epoch=1, files={"a": FileEntry(1, "00000000")}, created="x"), 100)


@pytest.mark.parametrize("damage", [
    {"epoch": "1"}, {"epoch": True}, {"step": None}, {"manifest_size": 1.5}, {"files": {"a": [1]}},
    {"files": {"a": ["1", "00000000"]}}, {"files": []}, {"metrics": {"loss": "low"}}, {"metrics": []},
    {"metrics": {"loss": [1]}}, {"created": 5},
])
def test_a_bad_entry_is_refused_not_half_read(damage: dict[str, Any]) -> None:
    entry = {**good_entry(), **damage}
    with pytest.raises((KeyError, TypeError, ValueError, AttributeError)):
        run_index.manifest_of(entry)


def test_a_hand_made_integer_metric_reads_back_as_a_float() -> None:
    manifest, _ = run_index.manifest_of({**good_entry(), "metrics": {"loss": 0.5, "epochs_seen": 3}})
    assert manifest.metrics == {"loss": 0.5, "epochs_seen": 3.0}
    assert all(type(v) is float for v in manifest.metrics.values())


@pytest.mark.parametrize("blob", [
    None, b"", b"not json", b"[]", b'{"format":"other"}',
    b'{"format":"resumable.index","format_version":1,"checkpoints":{"a":{"manifest":{}}}}',
    b'{"format":"resumable.index","format_version":2,"checkpoints":[]}',
])
def test_an_unusable_index_decodes_to_nothing(blob: bytes | None) -> None:
    assert run_index.decode(blob) == {}
