"""A model rebuilt from a checkpoint's config for a load (`resume()` without ``build_model``):
every saved value comes back, and a variable the checkpoint lacks holds its initializer's value,
as Keras gives it. On JAX its initializers are not drawn while it is built: their temporaries
cost several times the variable (compat/deferred_init.py; the memory is measured in
tests/keras/test_resume_memory.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.lanes

keras = pytest.importorskip("keras")

import resumable  # noqa: E402
from resumable.keras.compat import deferred_init  # noqa: E402

ON_JAX = keras.backend.backend() == "jax"


@keras.saving.register_keras_serializable(package="resumable_tests")
class Unsaved(keras.layers.Layer):
    """A Dense-like layer whose ``extra`` variable (an initializer's 7s) is never saved."""

    def build(self, input_shape: tuple[int, ...]) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], 3), initializer="glorot_uniform")
        self.extra = self.add_weight(shape=(3,), initializer=keras.initializers.Constant(7.0),
                                     trainable=False)

    def call(self, inputs: Any) -> Any:
        return keras.ops.matmul(inputs, self.kernel) + 0.0 * self.extra

    def save_own_variables(self, store: Any) -> None:
        store["0"] = self.kernel.numpy() if hasattr(self.kernel, "numpy") else np.asarray(self.kernel)

    def load_own_variables(self, store: Any) -> None:
        self.kernel.assign(store["0"])


def model() -> keras.Model:
    inputs = keras.Input((5,))
    built = keras.Model(inputs, keras.layers.Dense(2)(Unsaved()(keras.layers.Dense(8)(inputs))))
    built.compile(optimizer="adam", loss="mse")
    return built


@pytest.fixture
def run(tmp_path: Path) -> tuple[str, keras.Model]:
    """A run folder with one checkpoint of `model`, and the model it saved."""
    keras.utils.set_random_seed(1)
    trained = model()
    x = np.random.default_rng(2).normal(size=(16, 5)).astype("float32")
    url = str(tmp_path / "run")
    checkpoints = resumable.CheckpointCallback(url, monitor="loss")
    trained.fit(x, x[:, :2], epochs=1, verbose=0, callbacks=[checkpoints])
    return url, trained


def values(model: keras.Model) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables]


def test_every_saved_value_comes_back_and_an_unsaved_one_holds_its_initializers_value(
        run: tuple[str, keras.Model]) -> None:
    url, trained = run
    resumed = resumable.resume(url, monitor="loss").model
    unsaved = next(layer for layer in resumed.layers if isinstance(layer, Unsaved))
    assert np.array_equal(keras.ops.convert_to_numpy(unsaved.extra), np.full(3, 7.0, "float32"))
    for before, after in zip(values(trained), values(resumed), strict=True):
        assert np.array_equal(before, after)


class Counted:
    """How often each initializer class is called, from now on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        for kind in (keras.initializers.GlorotUniform, keras.initializers.Zeros, keras.initializers.Constant):
            monkeypatch.setattr(kind, "__call__", self._counting(kind, kind.__call__))

    def _counting(self, kind: type, call: Any) -> Any:
        def counted(initializer: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls[kind.__name__] = self.calls.get(kind.__name__, 0) + 1
            return call(initializer, *args, **kwargs)
        return counted


@pytest.mark.skipif(not ON_JAX, reason="JAX's initializers (the other backends build as Keras does)")
def test_on_jax_a_model_rebuilt_for_its_load_draws_only_the_values_the_load_does_not_give(
        run: tuple[str, keras.Model], monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = run
    counted = Counted(monkeypatch)
    resumable.resume(url, monitor="loss")
    assert "GlorotUniform" not in counted.calls  # every kernel was loaded: no random draw
    assert counted.calls["Constant"] == 1  # the unsaved `extra`, once the load left it alone


@pytest.mark.skipif(not ON_JAX, reason="JAX's initializers")
def test_only_the_building_thread_gets_zeros_and_only_while_it_builds() -> None:
    constant = keras.initializers.Constant(3.0)
    before = dict(keras.Variable.__dict__)
    elsewhere: list[Any] = []
    with pytest.raises(RuntimeError), deferred_init.initial_values_deferred() as deferred:
        mine = keras.Variable(constant, shape=(4,))
        worker = threading.Thread(target=lambda: elsewhere.append(keras.Variable(constant, shape=(4,))))
        worker.start()
        worker.join()
        raise RuntimeError("the build failed")
    assert dict(keras.Variable.__dict__) == before
    assert np.array_equal(keras.ops.convert_to_numpy(elsewhere[0]), np.full(4, 3.0, "float32"))
    assert np.array_equal(keras.ops.convert_to_numpy(mine), np.zeros(4, "float32"))
    deferred.finish()  # nothing loaded it: its initializer's value
    assert np.array_equal(keras.ops.convert_to_numpy(mine), np.full(4, 3.0, "float32"))
    assert np.array_equal(keras.ops.convert_to_numpy(keras.Variable(constant, shape=(4,))), np.full(4, 3.0))
