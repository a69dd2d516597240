"""state_file: a hostile state.json is read bounded and strict, and resume() passes its checkpoint over.

state.json is a payload file, vouched for by the manifest's CRC32C; whoever can write the
manifest can write both. So it is read like every JSON file from a run folder (`safe_json`),
and each field a restore reads is checked for its type (`check_state`). Callbacks' states:
test_training_state.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import replace_payload_file, small_model

import resumable
from resumable import CorruptCheckpointError, RunStorage
from resumable.keras.checkpoint import snapshot, state_file, training_state

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(64, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
FIT: dict[str, Any] = {"batch_size": 32, "shuffle": False, "verbose": 0, "validation_data": (X[:32], Y[:32])}


# ----------------------------------------------------------------------------- reading state.json


def good_state() -> dict[str, Any]:
    return {"epoch": 1, "best": 0.5, "monitor": "val_loss", "mode": "min", "stopped_early": False,
            "history": [{"loss": 0.4, "val_loss": "nan"}], "callbacks": {"EarlyStopping#0": {"wait": 1}},
            "optimizer": {"class": "Adam", "iterations": 2}, "rng": training_state.rng_state(),
            "model": {"class": "Sequential", "weights": [["dense/kernel", [8, 4]]]}, "version": 1}


def state_with(**changes: Any) -> bytes:
    return json.dumps({**good_state(), **changes}).encode()


HOSTILE_STATES = {
    "nested-100000-deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    "nan": (json.dumps(good_state()).replace('"best": 0.5', '"best": NaN').encode(), "holds NaN"),
    "1e400": (json.dumps(good_state()).replace('"best": 0.5', '"best": 1e400').encode(), "too large"),
    "400-digits": (json.dumps(good_state()).replace('"epoch": 1', '"epoch": ' + "9" * 400).encode(),
                   "integer of 400 digits"),
    "utf-16": (json.dumps(good_state()).encode("utf-16"), "UTF-16 or UTF-32"),
    "duplicate-key": (json.dumps(good_state()).replace('"best": 0.5', '"best": 0.5, "best": 9').encode(),
                      "'best' twice"),
    "not-an-object": (b"[1, 2]", "is not a JSON object"),
    "best-string": (state_with(best="low"), "field best"),
    "history-not-numbers": (state_with(history=[{"loss": "low"}]), "field history[0]"),
    "history-not-a-list": (state_with(history={"loss": 1}), "field history: expected a list"),
    "callbacks-list": (state_with(callbacks=[]), "field callbacks: expected an object"),
    "callbacks-null": (state_with(callbacks=None), "field callbacks: expected an object"),
    "model-null": (state_with(model=None), "field model: expected an object"),
    "rng-python-short": (state_with(rng={"python": [3, [1, 2], None]}), "field rng.python"),
    "rng-numpy-huge": (state_with(rng={"numpy": ["MT19937", [2**40] * 624, 0, 0, 0.0]}), "field rng.numpy"),
    "epoch-rng-keras": (state_with(epoch_rng={"keras": ["a", "b"]}), "field epoch_rng.keras"),
    "weights-not-pairs": (state_with(model={"weights": [["dense/kernel"]]}), "field model.weights"),
    "optimizer-iterations-string": (state_with(optimizer={"class": "Adam", "iterations": "2"}),
                                    "field optimizer"),
    "stopped-early-string": (state_with(stopped_early="yes"), "field stopped_early"),
    "trainable-list": (state_with(trainable=[]), "field trainable: expected an object"),
    "trainable-weights-pairs": (
        state_with(trainable={"weights": [["lora_a", [4]]], "optimizer": [],
                              "frozen": {"crc32c": "00", "variables": 1, "bytes": 4}}),
        "field trainable.weights"),
    "trainable-frozen-missing": (state_with(trainable={"weights": [], "optimizer": []}),
                                 "field trainable.frozen"),
    "inputs-list": (state_with(inputs=[]), "field inputs: expected an object"),
    "inputs-unknown-role": (state_with(inputs={"y": {"kind": "tf.data"}}), "field inputs.y"),
    "inputs-no-kind": (state_with(inputs={"x": {"position": 3}}), "field inputs.x"),
    "inputs-position-negative": (state_with(inputs={"x": {"kind": "iterator", "position": -1}}),
                                 "field inputs.x.position"),
    "inputs-position-huge": (state_with(inputs={"x": {"kind": "iterator", "position": 2**70}}),
                             "field inputs.x.position"),
    "inputs-seed-string": (state_with(inputs={"x": {"kind": "PyDataset", "order_seed": "7"}}),
                           "field inputs.x.order_seed"),
}


@pytest.mark.parametrize(("data", "reason"), HOSTILE_STATES.values(), ids=HOSTILE_STATES.keys())
def test_a_hostile_state_file_is_corrupt_with_one_line(tmp_path: Path, data: bytes, reason: str) -> None:
    (tmp_path / snapshot.STATE_FILE).write_bytes(data)
    with pytest.raises(CorruptCheckpointError) as caught:
        state_file.read_state(tmp_path, "gs://b/run/ckpt-000002")
    text = str(caught.value)
    assert text.startswith("gs://b/run/ckpt-000002: state.json ") and reason in text
    assert "\n" not in text and len(text) < 300


def test_a_good_state_file_reads_back(tmp_path: Path) -> None:
    (tmp_path / snapshot.STATE_FILE).write_bytes(state_with())
    assert state_file.read_state(tmp_path) == good_state()
    assert state_file.read_state(tmp_path / "elsewhere") == {}  # none at all: nothing to restore


def test_a_huge_state_file_is_refused_unread(tmp_path: Path) -> None:
    import tracemalloc

    with open(tmp_path / snapshot.STATE_FILE, "wb") as f:
        f.truncate(400 * 2**20)  # sparse
    tracemalloc.start()
    try:
        with pytest.raises(CorruptCheckpointError, match="larger than any real one"):
            state_file.read_state(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < state_file.STATE_LIMIT + 16 * 2**20  # its limit at most, never 400 MB


def test_a_small_state_file_is_read_without_setting_its_limit_aside(tmp_path: Path) -> None:
    import tracemalloc

    (tmp_path / snapshot.STATE_FILE).write_bytes(state_with())
    tracemalloc.start()
    try:
        state_file.read_state(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_resume_skips_a_checkpoint_whose_state_file_is_hostile(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=small_model, async_upload=False).fit(X, Y, epochs=2, **FIT)
    replace_payload_file(tmp_path / "run", snapshot.STATE_FILE, b"[" * 50_000 + b"]" * 50_000)
    assert RunStorage(url).latest().name == "ckpt-000002"  # type: ignore[union-attr]  # its files check out
    with pytest.warns(UserWarning, match="ckpt-000002: state.json is nested too deep"):
        run = resumable.resume(url, build_model=small_model, async_upload=False)
    assert run.checkpoint is not None and run.checkpoint.name == "ckpt-000001"
    run.fit(X, Y, epochs=3, **FIT)  # trains epochs 2 and 3; ckpt-000002 is replaced
    assert [i.name for i in RunStorage(url).list() if i.ok] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
