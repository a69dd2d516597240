"""training_state: callbacks get back only the fields resumable saves, from a hostile state.json too.

state.json is a payload file, vouched for by the manifest's CRC32C; whoever can write the
manifest can write both. Restoring other callbacks' state (`restore_callback_states`) sets only
the fields `callback_states` saves for that class, with numbers: never ``on_epoch_end`` or
``model``; a callback of one's own gets its state through ``set_state``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import replace_payload_file, small_model

import resumable
from resumable.keras.checkpoint import snapshot, training_state

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(64, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
FIT: dict[str, Any] = {"batch_size": 32, "shuffle": False, "verbose": 0, "validation_data": (X[:32], Y[:32])}


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
    """A callback of one's own with get_state()/set_state() (`resumable.keras.checkpoint.user_state`)."""

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


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_hostile_callback_state_sets_nothing_but_its_fields(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = str(tmp_path / "run")
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    resumable.resume(url, build_model=small_model, async_upload=False).fit(X, Y, epochs=1, callbacks=[early],
                                                                         **FIT)
    state = json.loads((tmp_path / "run" / "ckpt-000001" / snapshot.STATE_FILE).read_text())
    state["callbacks"]["EarlyStopping#0"].update(wait=1, on_epoch_end=0, model="x", best_weights=10**18)
    replace_payload_file(tmp_path / "run", snapshot.STATE_FILE, json.dumps(state).encode(), "ckpt-000001")
    restored = keras.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    with caplog.at_level(logging.WARNING, logger="resumable"):
        resumable.resume(url, build_model=small_model, async_upload=False).fit(X, Y, epochs=2,
                                                                             callbacks=[restored], **FIT)
    for name in ("on_epoch_end", "model", "best_weights"):
        assert f"not restoring EarlyStopping#0.{name}" in caplog.text
    assert restored.model is not None and restored.wait in (0, 2)  # trained on: its own model, its own count
