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
    files = {"a.bin": {"size": 1, "crc32c": "00000000"}}
    data = {"format": FORMAT_NAME, "format_version": 1, "epoch": 2, "files": files, "written_by": "a tool"}
    m = Manifest.from_json(json.dumps(data).encode(), "x")
    assert (m.epoch, m.step, m.batch, m.metrics, m.state, m.payload) == (2, 0, 0, {}, {}, None)
    assert m.files == {"a.bin": FileEntry(1, "00000000")}


def good() -> dict:  # type: ignore[type-arg]
    return json.loads(full().to_json())


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (b"", CorruptCheckpointError, "not valid JSON"),
        (full().to_json()[:40], CorruptCheckpointError, "not valid JSON"),
        (b"\xff\xfe{}", CorruptCheckpointError, "UTF-16 or UTF-32 text, not UTF-8"),
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
    entry = {"size": 1, "crc32c": "00000000"}
    files = {"model.keras": entry, "assets/a/b.txt": entry}
    data = json.dumps({**good(), "files": files}).encode()
    assert list(Manifest.from_json(data, "m").files) == ["model.keras", "assets/a/b.txt"]


# ----------------------------------------------------------------------------- hostile fields

def edited(**changes: object) -> bytes:
    """The good manifest with fields replaced (a value of `DROP` removes the field)."""
    data = good()
    for key, value in changes.items():
        if value is DROP:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data).encode()


DROP = object()


def good_text() -> str:
    return full().to_json().decode()


ENTRY = {"size": 1234, "crc32c": "0a1b2c3d"}

# Each manifest a hand edit or a hostile writer could leave, with a fragment of the reason.
HOSTILE_FIELDS = {
    "epoch-string": (edited(epoch="3"), "epoch: expected an integer >= 0, got '3'"),
    "epoch-float": (edited(epoch=3.5), "epoch: expected an integer >= 0, got 3.5"),
    "epoch-whole-float": (edited(epoch=3.0), "epoch: expected an integer"),
    "epoch-bool": (edited(epoch=True), "epoch: expected an integer >= 0, got True"),
    "epoch-null": (edited(epoch=None), "epoch: expected an integer"),
    "epoch-negative": (edited(epoch=-1), "epoch: expected an integer >= 0, got -1"),
    "epoch-over-int64": (edited(epoch=2**63), "epoch: expected an integer"),
    "epoch-400-digits": (edited(epoch=int("9" * 400)), "integer of 400 digits"),
    "epoch-1e400": (good_text().replace('"epoch": 3', '"epoch": 1e400').encode(), "too large for a float"),
    "epoch-nan": (good_text().replace('"epoch": 3', '"epoch": NaN').encode(), "holds NaN"),
    "step-negative": (edited(step=-5), "step: expected an integer >= 0"),
    "batch-float": (edited(batch=1.5), "batch: expected an integer >= 0"),
    "metric-infinity": (good_text().replace('"loss": 0.25', '"loss": Infinity').encode(), "Infinity"),
    "metric-string": (edited(metrics={"loss": "0.25"}), "metrics['loss']: expected a number or null"),
    "metric-bool": (edited(metrics={"loss": False}), "metrics['loss']: expected a number"),
    "metrics-list": (edited(metrics=[0.25]), "metrics: expected an object"),
    "files-missing": (edited(files=DROP), "files: missing"),
    "files-string": (edited(files="model.keras"), "files: expected an object"),
    "files-null": (edited(files=None), "files: expected an object"),
    "files-empty": (edited(files={}), "files: lists no file"),
    "entry-not-object": (edited(files={"model.keras": [1234, "0a1b2c3d"]}), "expected an object with size"),
    "size-negative": (edited(files={"model.keras": {**ENTRY, "size": -1}}), "size: expected an integer >= 0"),
    "size-string": (edited(files={"model.keras": {**ENTRY, "size": "1234"}}), "size: expected an integer"),
    "size-float": (edited(files={"model.keras": {**ENTRY, "size": 1234.0}}), "size: expected an integer"),
    "size-missing": (edited(files={"model.keras": {"crc32c": "0a1b2c3d"}}), "size: expected an integer"),
    "crc-uppercase": (edited(files={"model.keras": {**ENTRY, "crc32c": "0A1B2C3D"}}), "8 lowercase hex"),
    "crc-7-digits": (edited(files={"model.keras": {**ENTRY, "crc32c": "0a1b2c3"}}), "8 lowercase hex"),
    "crc-9-digits": (edited(files={"model.keras": {**ENTRY, "crc32c": "0a1b2c3d4"}}), "8 lowercase hex"),
    "crc-not-hex": (edited(files={"model.keras": {**ENTRY, "crc32c": "0a1b2c3z"}}), "8 lowercase hex"),
    "crc-newline": (edited(files={"model.keras": {**ENTRY, "crc32c": "0a1b2c3d\n"}}), "8 lowercase hex"),
    "crc-integer": (edited(files={"model.keras": {**ENTRY, "crc32c": 12345678}}), "8 lowercase hex"),
    "versions-list": (edited(versions=["keras"]), "versions: expected an object of strings"),
    "version-number": (edited(versions={"keras": 3.15}), "versions: expected an object of strings"),
    "state-list": (edited(state=[["callbacks", {}]]), "state: expected an object"),
    "created-number": (edited(created=20261122), "created: expected a string"),
    "payload-absent-file": (edited(payload="model.weights.h5"), "payload: 'model.weights.h5' is not among"),
    "payload-number": (edited(payload=1), "payload: expected a string"),
    "keras-without-model": (
        edited(files={"assets/vocab.txt": ENTRY}), "written by Keras but lists neither model.keras"),
    "duplicate": (good_text().replace('"epoch": 3', '"epoch": 3, "epoch": 3').encode(), "'epoch' twice"),
    "deep-state": (edited(state=json.loads("[" * 100 + "]" * 100)), "more than 64 levels"),
    "deep-state-object": (edited(state={"a": json.loads("[" * 100 + "]" * 100)}), "more than 64 levels"),
    "recursion": (edited(state=DROP)[:-1] + b', "state": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                  "nested too deep"),
    "utf16": (good_text().encode("utf-16"), "UTF-16 or UTF-32"),
    "utf32": (good_text().encode("utf-32"), "UTF-16 or UTF-32"),
    "too-large": (edited(state={"pad": "x" * (16 * 2**20)}), "larger than any real one"),
}


@pytest.mark.parametrize(("data", "reason"), HOSTILE_FIELDS.values(), ids=HOSTILE_FIELDS.keys())
def test_a_hostile_manifest_is_corrupt_with_one_line(data: bytes, reason: str) -> None:
    where = "gs://b/run/ckpt-000003/manifest.json"
    with pytest.raises(CorruptCheckpointError) as caught:
        Manifest.from_json(data, where)
    text = str(caught.value)
    assert reason in text
    assert text.startswith(f"{where}: ") and "\n" not in text and len(text) < 300
    assert "the checkpoint is unusable, delete it" in text or "not a resumable manifest" in text


def test_a_payload_must_be_one_of_the_files_and_is_written_only_when_set() -> None:
    m = full()
    m.payload = "model.keras"
    back = Manifest.from_json(m.to_json(), "here")
    assert back.payload == "model.keras" and json.loads(m.to_json())["payload"] == "model.keras"
    assert "payload" not in json.loads(full().to_json())  # as older writers: absent when not set


def test_writers_other_than_keras_may_commit_any_files() -> None:
    data = edited(versions={"resumable": "0.1.0"}, files={"a.bin": ENTRY})
    assert list(Manifest.from_json(data, "m").files) == ["a.bin"]
    # ... and a Keras-written manifest naming its payload need not use the usual names
    data = edited(files={"weights/shard-0.h5": ENTRY}, payload="weights/shard-0.h5")
    assert Manifest.from_json(data, "m").payload == "weights/shard-0.h5"
    # ... and one from before `payload` existed is usable with either model file
    for name in ("model.keras", "model.weights.h5"):
        assert name in Manifest.from_json(edited(files={name: ENTRY}), "m").files


def test_a_huge_metric_integer_reads_as_a_float() -> None:
    """Within 64 digits an integer is JSON, and a metric a float: never an OverflowError."""
    assert Manifest.from_json(edited(metrics={"loss": 10**60}), "m").metrics["loss"] == 1e60
