"""get_state()/set_state(): a callback's own state as JSON, kept exactly, refused when it is not JSON."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import numpy as np
import pytest

from resumable.keras.checkpoint import user_state


class Mine:
    def __init__(self, state: Any = None) -> None:
        self.state = state

    def get_state(self) -> Any:
        return self.state

    def set_state(self, state: Any) -> None:
        self.state = state


@pytest.mark.parametrize("state", [
    {"batches": 3, "losses": [0.5, 0.25], "name": "x", "done": False, "none": None},
    {"best": float("inf"), "worst": float("-inf"), "nested": [{"a": [1, {"b": 2}]}]},
    [1, 2.5, "three"], 7, "text", None,
])
def test_a_state_comes_back_equal_through_json(state: Any) -> None:
    saved = user_state.capture(Mine(state), "Mine#0")
    assert saved is not None
    back = Mine()
    assert user_state.restore(back, "Mine#0", json.loads(json.dumps(saved, allow_nan=False)))
    assert back.state == state


def test_nan_and_numpy_scalars_come_back_as_floats_and_ints() -> None:
    saved = user_state.capture(Mine({"nan": float("nan"), "f": np.float32(0.5), "i": np.int64(4)}), "Mine#0")
    back = Mine()
    user_state.restore(back, "Mine#0", json.loads(json.dumps(saved, allow_nan=False)))
    assert math.isnan(back.state["nan"]) and back.state["f"] == 0.5 and back.state["i"] == 4
    assert type(back.state["i"]) is int


@pytest.mark.parametrize(("state", "said"), [
    ({"a": {1, 2}}, "get_state() returned a set"),
    ({1: "a"}, "a dict with a key that is not a string"),
    ({"$float": "inf"}, "a dict whose only key is '$float'"),
    (np.zeros(3), "get_state() returned a ndarray"),
])
def test_a_state_json_cannot_hold_is_not_saved_with_one_warning(state: Any, said: str) -> None:
    with pytest.warns(UserWarning, match="not saving the state of Mine#7") as caught:
        assert user_state.capture(Mine(state), "Mine#7") is None
    assert said in str(caught[0].message)


def test_a_get_state_that_raises_is_not_saved_with_one_warning() -> None:
    class Broken(Mine):
        def get_state(self) -> Any:
            raise KeyError("gone")

    with pytest.warns(UserWarning, match="get_state\\(\\) raised KeyError: 'gone'"):
        assert user_state.capture(Broken(), "Broken#0") is None


def test_a_bad_state_warns_once_a_session_not_at_every_save() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            user_state.capture(Mine({"a": object()}), "Once#0")
    assert len([w for w in caught if "Once#0" in str(w.message)]) == 1


def test_only_an_object_with_both_methods_takes_part() -> None:
    class OnlyGet:
        def get_state(self) -> int:
            return 1

    assert user_state.has_protocol(Mine()) and not user_state.has_protocol(OnlyGet())
