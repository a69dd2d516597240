"""Weights loaded a variable at a time in place (compat.assigned_in_place): exact, scoped to the
model being loaded, and gone once the load ends. What it saves in memory is measured in
tests/keras/test_resume_memory.py."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.lanes

keras = pytest.importorskip("keras")

from resumable.keras import compat  # noqa: E402
from resumable.keras.compat import in_place  # noqa: E402

IN_PLACE = keras.backend.backend() == "jax"  # the others load as Keras does


def trained_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(40), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(seed).normal(size=(16, 6)).astype("float32")
    model.fit(x, x[:, :3], epochs=1, verbose=0)
    return model


def overridden(model: keras.Model) -> list[bool]:
    return ["assign" in vars(v) for v in list(model.variables) + list(model.optimizer.variables)]


def test_only_the_loaded_models_variables_are_overridden_and_only_during_the_load() -> None:
    model, other = trained_model(1), trained_model(2)
    with compat.assigned_in_place(model):
        assert all(overridden(model)) is IN_PLACE
        with compat.assigned_in_place(model):  # a load inside a load keeps the outer's override
            pass
        assert all(overridden(model)) is IN_PLACE
        assert not any(overridden(other))
    assert not any(overridden(model))


@pytest.mark.parametrize("give_back_bytes", [64, 16 * 2**20], ids=["heap given back each variable", "rarely"])
def test_loading_in_place_gives_the_saved_values_bit_for_bit(
        give_back_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values, optimizer state included, are those saved, however often the heap is
    given back meanwhile."""
    monkeypatch.setattr(in_place, "GIVE_BACK_BYTES", give_back_bytes)
    saved = trained_model(3)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    loaded = trained_model(4)
    with open(tmp_path / "model.weights.h5", "rb") as file:
        if not compat.load_weights_from(loaded, io.BytesIO(file.read())):
            pytest.skip("this Keras loads through load_weights, not in place")
    pairs = list(zip(saved.variables + saved.optimizer.variables,
                     loaded.variables + loaded.optimizer.variables, strict=True))
    for before, after in pairs:
        before_value, after_value = keras.ops.convert_to_numpy(before), keras.ops.convert_to_numpy(after)
        assert np.array_equal(before_value, after_value), before.path
    assert not any(overridden(loaded))


def test_a_value_that_does_not_fit_is_refused_as_keras_refuses_it() -> None:
    model = trained_model(5)
    kernel = model.layers[0].kernel
    with compat.assigned_in_place(model), pytest.raises(ValueError):
        kernel.assign(np.zeros((7, 40), "float32"))  # Keras' own assign: the shape differs
    assert not any(overridden(model))
