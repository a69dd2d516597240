"""A hostile state.json: read bounded and strict; callbacks get back only the fields resumable saves.

state.json is a payload file, vouched for by the manifest's CRC32C; whoever can write the
manifest can write both. So it is read like every JSON file from a run folder
(`safe_json`), and restoring other callbacks' state sets only the fields `callback_states`
saves for that class, with numbers: never ``on_epoch_end`` or ``model``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resumable
from resumable import CorruptCheckpointError, RunStorage
from resumable.core.checksum import crc32c_of_file
from resumable.core.manifest import KERAS_PAYLOADS, MANIFEST_NAME
from resumable.keras import snapshot, state_file, training_state
from resumable.storage import run_index

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(64, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
FIT: dict[str, Any] = {"batch_size": 32, "shuffle": False, "verbose": 0, "validation_data": (X[:32], Y[:32])}


def make_model() -> Any:
    keras.utils.set_random_seed(3)
    layers = [keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer="adam", loss="mse")
    return model


def test_the_core_knows_the_keras_side_s_model_files() -> None:
    assert set(KERAS_PAYLOADS) == {snapshot.MODEL_FILE, snapshot.WEIGHTS_FILE}


# ----------------------------------------------------------------------------- restoring callbacks


def restore(states: dict[str, Any], arrays: dict[str, Any] | None = None) -> tuple[Any, list[str]]:
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=3)
    restored = training_state.restore_callback_states([early], states, arrays or {})
    return early, restored


def test_only_the_saved_fields_are_set_each_other_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    before = keras.callbacks.EarlyStopping(monitor="val_loss", patience=3)
    hostile = {"wait": 2, "best": 0.5, "stopped_epoch": "inf", "on_epoch_end": "x", "model": 1,
               "set_model": None, "__class__": "x", "patience": 0, "monitor_op": "x"}
    with caplog.at_level(logging.WARNING, logger="resumable"):
        early, restored = restore({"EarlyStopping#0": hostile})
    assert restored == ["EarlyStopping#0"]
    assert (early.wait, early.best, early.stopped_epoch) == (2, 0.5, float("inf"))
    assert early.on_epoch_end.__func__ is type(early).on_epoch_end  # still the method
    assert early.model is None and callable(early.set_model) and type(early) is keras.callbacks.EarlyStopping
    assert early.patience == before.patience and early.monitor_op == before.monitor_op
    lines = caplog.text.strip().splitlines()
    skipped = ("on_epoch_end", "model", "set_model", "__class__", "patience", "monitor_op")
    assert len(lines) == len(skipped)
    for name, line in zip(skipped, lines, strict=True):
        assert f"not restoring EarlyStopping#0.{name} from state.json" in line


@pytest.mark.parametrize("value", ["3", [1], {"a": 1}, True, "nan!", 10**70])
def test_a_value_of_another_kind_is_skipped(value: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="resumable"):
        early, _ = restore({"EarlyStopping#0": {"wait": value, "best": 0.25}})
    assert early.wait == 0 and early.best == 0.25  # wait untouched (as after on_train_begin), best set
    assert "not restoring EarlyStopping#0.wait" in caplog.text and "is not a number" in caplog.text


@pytest.mark.parametrize("count", [10**18, 3, -1, "2", None, 2.0])
def test_best_weights_are_bounded_by_the_arrays_saved(count: Any, caplog: pytest.LogCaptureFixture) -> None:
    arrays = {f"EarlyStopping#0/best_weights/{i}": np.full(2, i) for i in range(2)}
    with caplog.at_level(logging.WARNING, logger="resumable"):
        early, _ = restore({"EarlyStopping#0": {"best_weights": count}}, arrays)
    assert early.best_weights is None  # never a KeyError, never a list of 10**18 names
    assert "not restoring EarlyStopping#0.best_weights" in caplog.text


def test_best_weights_that_are_all_there_are_restored() -> None:
    arrays = {f"EarlyStopping#0/best_weights/{i}": np.full(2, i) for i in range(2)}
    early, _ = restore({"EarlyStopping#0": {"best_weights": 2}}, arrays)
    assert [list(w) for w in early.best_weights] == [[0, 0], [1, 1]]


def test_a_callback_state_that_is_not_an_object_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="resumable"):
        early, restored = restore({"EarlyStopping#0": [["wait", 2]]})
    assert restored == [] and early.wait == 0
    assert "not restoring EarlyStopping#0 from state.json: not a JSON object" in caplog.text


class Counted(keras.callbacks.Callback):
    """A callback of one's own with get_state()/set_state() (`resumable.keras.user_state`)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.state: Any = None
        self.fail = fail

    def get_state(self) -> Any:
        return self.state

    def set_state(self, state: Any) -> None:
        if self.fail:
            raise RuntimeError("no")
        self.state = state


def test_a_callback_of_one_s_own_gets_its_state_back() -> None:
    mine = Counted()
    restored = training_state.restore_callback_states(
        [mine], {"Counted#0": {"state": {"n": 3, "best": {"$float": "inf"}}}}, {})
    assert restored == ["Counted#0"] and mine.state == {"n": 3, "best": float("inf")}


@pytest.mark.parametrize(("saved", "why"), [
    ({"state": 1, "on_epoch_end": 0}, "expected {'state': ...}"),
    ([1], "expected {'state': ...}"),
    ({"state": {"$float": "big"}}, "{'$float': 'big'} is not a float resumable wrote"),
    ({"state": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}, "nested deeper"),
])
def test_a_hostile_state_of_one_s_own_callback_is_skipped(saved: Any, why: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    mine = Counted()
    with caplog.at_level(logging.WARNING, logger="resumable"):
        restored = training_state.restore_callback_states([mine], {"Counted#0": saved}, {})
    assert restored == [] and mine.state is None
    assert f"not restoring the state of Counted#0: {why}" in caplog.text


def test_a_set_state_that_raises_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="resumable"):
        restored = training_state.restore_callback_states(
            [Counted(fail=True)], {"Counted#0": {"state": 1}}, {})
    assert restored == []
    assert "not restoring the state of Counted#0: set_state() raised RuntimeError: no" in caplog.text


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


def replace_payload_file(run: Path, name: str, rel: str, data: bytes) -> None:
    """Rewrite a committed file and its manifest entry, as a writer that controls both could."""
    (run / name / rel).write_bytes(data)
    manifest = json.loads((run / name / MANIFEST_NAME).read_text())
    manifest["files"][rel] = {"size": len(data), "crc32c": crc32c_of_file(run / name / rel)}
    (run / name / MANIFEST_NAME).write_text(json.dumps(manifest))
    (run / run_index.INDEX_NAME).unlink()  # the index recorded the old sizes


@pytest.mark.slow
def test_resume_skips_a_checkpoint_whose_state_file_is_hostile(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=make_model, async_upload=False).fit(X, Y, epochs=2, **FIT)
    replace_payload_file(tmp_path / "run", "ckpt-000002", snapshot.STATE_FILE, b"[" * 50_000 + b"]" * 50_000)
    assert RunStorage(url).latest().name == "ckpt-000002"  # type: ignore[union-attr]  # its files check out
    with pytest.warns(UserWarning, match="ckpt-000002: state.json is nested too deep"):
        run = resumable.resume(url, build_model=make_model, async_upload=False)
    assert run.checkpoint is not None and run.checkpoint.name == "ckpt-000001"
    run.fit(X, Y, epochs=3, **FIT)  # trains epochs 2 and 3; ckpt-000002 is replaced
    assert [i.name for i in RunStorage(url).list() if i.ok] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]


@pytest.mark.slow
def test_a_hostile_callback_state_sets_nothing_but_its_fields(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = str(tmp_path / "run")
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    resumable.resume(url, build_model=make_model, async_upload=False).fit(X, Y, epochs=1, callbacks=[early],
                                                                        **FIT)
    state = json.loads((tmp_path / "run" / "ckpt-000001" / snapshot.STATE_FILE).read_text())
    state["callbacks"]["EarlyStopping#0"].update(wait=1, on_epoch_end=0, model="x", best_weights=10**18)
    replace_payload_file(tmp_path / "run", "ckpt-000001", snapshot.STATE_FILE, json.dumps(state).encode())
    restored = keras.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    with caplog.at_level(logging.WARNING, logger="resumable"):
        resumable.resume(url, build_model=make_model, async_upload=False).fit(X, Y, epochs=2,
                                                                            callbacks=[restored], **FIT)
    for name in ("on_epoch_end", "model", "best_weights"):
        assert f"not restoring EarlyStopping#0.{name}" in caplog.text
    assert restored.model is not None and restored.wait in (0, 2)  # trained on: its own model, its own count
