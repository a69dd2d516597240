"""The manifest: written last, it commits a checkpoint and vouches for every payload file."""

from __future__ import annotations

import json
import math

import pytest

from resumable import CorruptCheckpointError, UnsupportedFormatError
from resumable.core.manifest import FORMAT_NAME, FORMAT_VERSION, FileEntry, Manifest


def full() -> Manifest:
    return Manifest(
        epoch=3,
        step=312,
        batch=12,
        files={"model.keras": FileEntry(1234, "0a1b2c3d"), "assets/vocab.txt": FileEntry(5, "ffffffff")},
        metrics={"loss": 0.25, "val_loss": math.nan, "lr": 1e-3},
        created="2026-11-22T04:00:00+00:00",
        versions={"resumable": "0.1.0", "keras": "3.15.1"},
        state={"callbacks": {"EarlyStopping": {"wait": 2, "best": 0.31}}},
    )


def test_round_trip() -> None:
    m = full()
    back = Manifest.from_json(m.to_json(), "here")
    assert back.metrics.pop("val_loss") != back.metrics.get("val_loss")  # NaN comes back as NaN
    m.metrics.pop("val_loss")
    assert back == m
    assert back.total_size == 1239
    assert back.created_at is not None and back.created_at.year == 2026


def test_the_documented_fields() -> None:
    doc = json.loads(full().to_json())
    assert list(doc) == [
        "format",
        "format_version",
        "epoch",
        "step",
        "batch",
        "created",
        "metrics",
        "files",
        "versions",
        "state",
    ]
    assert (
        (doc["format"], doc["format_version"]) == (FORMAT_NAME, FORMAT_VERSION) == ("resumable.checkpoint", 1)
    )
    assert doc["metrics"]["val_loss"] is None  # strict JSON: no NaN literal
    assert list(doc["files"]) == ["assets/vocab.txt", "model.keras"]  # sorted
    assert doc["files"]["model.keras"] == {"size": 1234, "crc32c": "0a1b2c3d"}


def test_created_is_filled_in_when_empty() -> None:
    doc = json.loads(Manifest(epoch=1).to_json())
    assert doc["created"].endswith("+00:00")
    assert Manifest(epoch=1, created="garbage").created_at is None


def test_unknown_fields_are_ignored_and_optional_ones_default() -> None:
    data = {"format": FORMAT_NAME, "format_version": 1, "epoch": 2, "files": {}, "written_by": "another tool"}
    m = Manifest.from_json(json.dumps(data).encode(), "x")
    assert (m.epoch, m.step, m.batch, m.metrics, m.state, m.files) == (2, 0, 0, {}, {}, {})


def good() -> dict:  # type: ignore[type-arg]
    return json.loads(full().to_json())


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (b"", CorruptCheckpointError, "not valid JSON"),
        (full().to_json()[:40], CorruptCheckpointError, "not valid JSON"),
        (b"\xff\xfe{}", CorruptCheckpointError, "not valid JSON"),
        (b"[1, 2]", CorruptCheckpointError, "not a resumable manifest"),
        (
            json.dumps({**good(), "format": "orbax"}).encode(),
            CorruptCheckpointError,
            "not a resumable manifest",
        ),
        (
            json.dumps({**good(), "format_version": 99}).encode(),
            UnsupportedFormatError,
            r"format 99 is newer than this resumable supports \(1\); upgrade",
        ),
        (
            json.dumps({**good(), "format_version": "1"}).encode(),
            CorruptCheckpointError,
            "no valid format_version",
        ),
        (
            json.dumps({**good(), "format_version": 0}).encode(),
            CorruptCheckpointError,
            "no valid format_version",
        ),
        (
            json.dumps({k: v for k, v in good().items() if k != "epoch"}).encode(),
            CorruptCheckpointError,
            "missing or has a bad field",
        ),
        (json.dumps({**good(), "epoch": "three"}).encode(), CorruptCheckpointError, "bad field"),
        (json.dumps({**good(), "files": {"a": {"size": 1}}}).encode(), CorruptCheckpointError, "bad field"),
        (json.dumps({**good(), "files": []}).encode(), CorruptCheckpointError, "bad field"),
    ],
    ids=[
        "empty",
        "truncated",
        "not-utf8",
        "list",
        "other-format",
        "v99",
        "version-str",
        "version-0",
        "no-epoch",
        "epoch-str",
        "no-crc",
        "files-list",
    ],
)
def test_bad_manifests(data: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        Manifest.from_json(data, "gs://b/run/ckpt-000003/manifest.json")
    text = str(caught.value)
    assert text.startswith("gs://b/run/ckpt-000003/manifest.json: ") and "\n" not in text


@pytest.mark.parametrize(
    "name", ["../escape", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", "C:x", "manifest.json", ""]
)
def test_file_names_must_stay_inside_the_checkpoint(name: str) -> None:
    data = json.dumps({**good(), "files": {name: {"size": 1, "crc32c": "00000000"}}}).encode()
    with pytest.raises(CorruptCheckpointError, match="not a plain relative path"):
        Manifest.from_json(data, "m")


def test_nested_file_names_are_fine() -> None:
    data = json.dumps({**good(), "files": {"assets/a/b.txt": {"size": 1, "crc32c": "00000000"}}}).encode()
    assert list(Manifest.from_json(data, "m").files) == ["assets/a/b.txt"]
