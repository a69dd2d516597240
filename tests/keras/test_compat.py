"""resumable.keras.compat against the installed Keras, and with each probed internal taken away.

An internal is taken away by deleting the one attribute the probe reads (monkeypatch), then
clearing the probe's cache: what a Keras that moved it would look like to resumable.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import backends
import numpy as np
import pytest

pytestmark = pytest.mark.lanes

keras = pytest.importorskip("keras")

from keras.src.backend.common import global_state  # noqa: E402
from keras.src.trainers.data_adapters import array_data_adapter, array_slicing  # noqa: E402
from keras.src.utils import module_utils  # noqa: E402

from resumable.keras import compat  # noqa: E402
from resumable.keras.checkpoint import trainable, training_state  # noqa: E402
from resumable.keras.replay import positioning  # noqa: E402

X = np.arange(48, dtype="float32").reshape(12, 4)
Y = np.arange(12, dtype="float32").reshape(12, 1)


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    """Each test probes anew, and leaves the probes to find the real Keras again (monkeypatch undone)."""
    probes: list[Any] = [compat.global_state._lazy_tensorflow, compat.global_state._seed_generator_api,
                         compat.array_adapters, compat.messages.warn_once, compat.snapshots_work,
                         compat.sharding_works, compat.loading._loading_works]
    for probe in probes:
        probe.cache_clear()
    compat.saving._snapshot_failure.clear()
    yield
    for probe in probes:
        probe.cache_clear()
    compat.saving._snapshot_failure.clear()


def small_model() -> Any:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dropout(0.5),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_unsupported_is_one_line_naming_the_keras_version() -> None:
    message = compat.unsupported("the global SeedGenerator")
    assert keras.__version__ in message and "the global SeedGenerator" in message
    assert "\n" not in message


# ----------------------------------------------------------------------------- tensorflow_unavailable


def test_tensorflow_unavailable_tells_keras_and_restores() -> None:
    lazy = module_utils.tensorflow
    before = vars(lazy)["_available"]
    with compat.tensorflow_unavailable():
        assert lazy.available is False
    assert vars(lazy)["_available"] == before


def test_tensorflow_unavailable_restores_after_an_error() -> None:
    before = vars(module_utils.tensorflow)["_available"]
    with pytest.raises(RuntimeError), compat.tensorflow_unavailable():
        raise RuntimeError("save failed")
    assert vars(module_utils.tensorflow)["_available"] == before


def test_tensorflow_unavailable_without_the_internal_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    lazy = module_utils.tensorflow
    monkeypatch.delattr(lazy, "_available")
    with compat.tensorflow_unavailable():
        assert "_available" not in vars(lazy)  # not recreated: Keras is left as it is
    assert compat.global_state._lazy_tensorflow() is None


SAVE_ON_JAX = """
import pathlib, sys, tempfile
import keras
if sys.argv[1] == "gone":  # a Keras without the lazy module resumable probes
    from keras.src.utils import module_utils
    del module_utils.tensorflow
from resumable.keras.checkpoint import model_to_files
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
model.compile(optimizer="adam", loss="mse")
model_to_files.save(model, pathlib.Path(tempfile.mkdtemp()), weights_only=False, state={})
print("tensorflow imported:", "tensorflow" in sys.modules)
"""


@pytest.mark.parametrize(("case", "imported"), [
    ("present", False), pytest.param("gone", True, marks=backends.needs_tensorflow)])
def test_saving_on_jax_imports_tensorflow_only_without_the_internal(case: str, imported: bool) -> None:
    pytest.importorskip("jax")
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SAVE_ON_JAX), case],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"tensorflow imported: {imported}" in done.stdout.splitlines(), done.stdout


# ----------------------------------------------------------------------------- global_seed_generator


def test_global_seed_generator_is_the_one_unseeded_ops_draw_from() -> None:
    keras.utils.set_random_seed(7)  # drops Keras' global generator
    assert compat.global_seed_generator() is None
    generator = compat.global_seed_generator(create=True)
    assert isinstance(generator, keras.random.SeedGenerator)
    assert compat.global_seed_generator() is generator
    before = keras.ops.convert_to_numpy(generator.state).copy()
    keras.random.uniform((2,))
    assert not np.array_equal(keras.ops.convert_to_numpy(generator.state), before)


def test_rng_state_carries_unseeded_keras_random_ops() -> None:
    keras.utils.set_random_seed(7)
    keras.random.uniform((2,))
    state = training_state.rng_state()
    assert "keras" in state
    first = keras.ops.convert_to_numpy(keras.random.uniform((4,)))
    keras.random.uniform((4,))
    training_state.set_rng_state(state)
    assert np.array_equal(keras.ops.convert_to_numpy(keras.random.uniform((4,))), first)


def test_global_seed_generator_without_the_internal_is_none_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    keras.random.uniform((2,))  # a generator exists: only the missing internal can hide it
    monkeypatch.delattr(global_state, "get_global_attribute")
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert compat.global_seed_generator() is None
        assert compat.global_seed_generator(create=True) is None
        assert "keras" not in training_state.rng_state()
    warned = [r.getMessage() for r in caplog.records if "SeedGenerator" in r.getMessage()]
    assert len(warned) == 1 and keras.__version__ in warned[0] and "\n" not in warned[0]


# ----------------------------------------------------------------------------- array_adapters


def test_array_adapters_position_arrays_at_a_batch() -> None:
    adapters = compat.array_adapters()
    assert adapters is not None
    assert adapters.array_data_adapter.can_convert_arrays((X, Y, None))
    partial = positioning.rest_of_epoch(small_model(), (X, Y), {"batch_size": 3, "shuffle": False}, 1, {})
    assert isinstance(partial, dict), partial
    assert partial["steps_per_epoch"] == 3
    first_x, _ = next(iter(partial["x"]))
    assert np.array_equal(keras.ops.convert_to_numpy(first_x), X[3:6])


@pytest.mark.parametrize(("owner", "name"), [
    (array_data_adapter, "can_convert_arrays"),
    (array_data_adapter, "ArrayDataAdapter"),
    (array_slicing, "train_validation_split"),
])
def test_array_adapters_without_the_internal_replay_the_epoch(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str
) -> None:
    monkeypatch.delattr(owner, name)
    assert compat.array_adapters() is None
    reason = positioning.rest_of_epoch(small_model(), (X, Y), {"batch_size": 3, "shuffle": False}, 1, {})
    assert isinstance(reason, str) and keras.__version__ in reason and "\n" not in reason


# ----------------------------------------------------------------------------- running_fit_callbacks


class Recorder(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.seen = compat.running_fit_callbacks(self)


def test_running_fit_callbacks_are_those_of_the_fit() -> None:
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=3)
    recorder = Recorder()
    small_model().fit(X, Y, batch_size=4, epochs=1, verbose=0, callbacks=[stop, recorder])
    seen = recorder.seen
    assert stop in seen and recorder in seen and seen.index(stop) < seen.index(recorder)
    assert any(isinstance(c, keras.callbacks.History) for c in seen)  # the list fit built, not ours


def test_running_fit_callbacks_outside_a_fit_is_the_callback_alone() -> None:
    unrelated = keras.callbacks.CallbackList([keras.callbacks.History()])  # on the stack, without ours
    recorder = Recorder()
    recorder.set_model(small_model())
    recorder.on_train_begin()  # a loop calling callbacks itself keeps no CallbackList
    assert recorder.seen == [recorder]
    assert unrelated.callbacks and recorder not in unrelated.callbacks


# ----------------------------------------------------------------------------- layers' own variables


def fine_tune_model() -> Any:
    """A frozen BatchNormalization, a Dense with LoRA (its kernel frozen), a trained BatchNormalization."""
    keras.utils.set_random_seed(1)
    frozen_bn, lora = keras.layers.BatchNormalization(name="frozen_bn"), keras.layers.Dense(8, name="lora")
    trained_bn, out = keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(1, name="out")
    model = keras.Sequential([keras.Input((4,)), frozen_bn, lora, trained_bn, out])
    frozen_bn.trainable = False
    lora.enable_lora(2)
    return model


def paths(variables: list[Any]) -> list[str]:
    return [v.path.split("/", 1)[1] for v in variables]


def test_trained_non_trainable_variables_are_the_statistics_of_trained_layers() -> None:
    model = fine_tune_model()
    found = compat.trained_non_trainable_variables(model)
    assert paths(found or []) == ["bn/moving_mean", "bn/moving_variance"]
    assert paths(trainable.frozen_variables(model)) == [
        "frozen_bn/gamma", "frozen_bn/beta", "frozen_bn/moving_mean", "frozen_bn/moving_variance",
        "lora/kernel"]


def test_without_the_layer_internals_trainable_only_holds_every_float_non_trainable_weight(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = fine_tune_model()
    # Keras itself reads the attribute: a later Keras would have renamed it, not removed it.
    monkeypatch.setattr(compat.variables, "_OWN_NON_TRAINABLE", "_renamed_in_a_later_keras")
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert compat.trained_non_trainable_variables(model) is None
        assert compat.trained_non_trainable_variables(model) is None
        assert trainable.frozen_variables(model) == []  # bigger checkpoints, still exact
    warned = [r.getMessage() for r in caplog.records if "_non_trainable_variables" in r.getMessage()]
    assert len(warned) == 1 and keras.__version__ in warned[0] and "\n" not in warned[0]


def test_lora_layer_variables_are_the_own_variables_of_lora_layers() -> None:
    model = fine_tune_model()
    assert paths(compat.lora_layer_variables(model) or []) == [
        "lora/kernel", "lora/bias", "lora/lora_kernel_a", "lora/lora_kernel_b"]


def test_lora_layer_variables_without_the_internal_is_none_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = fine_tune_model()
    monkeypatch.delattr(keras.layers.Layer, "_flatten_layers")
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert compat.lora_layer_variables(model) is None
        assert compat.lora_layer_variables(model) is None
    warned = [r.getMessage() for r in caplog.records if "LoRA" in r.getMessage()]
    assert len(warned) == 1 and keras.__version__ in warned[0] and "\n" not in warned[0]


# ----------------------------------------------------------------------------- saving and loading: probed


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def one_line_naming_keras(messages: list[str]) -> bool:
    return len(messages) == 1 and keras.__version__ in messages[0] and "\n" not in messages[0]


def test_the_probes_find_this_keras_behaving() -> None:
    assert compat.snapshots_work() and compat.loading._loading_works()
    assert compat.sharding_works() == compat.can_shard()


def test_a_writer_that_loses_a_value_fails_the_probe_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fill = compat.stores._fill
    monkeypatch.setattr(compat.stores, "_fill", lambda store, values: fill(store, values[:-1]))
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert compat.snapshots_work() is False
        assert compat.saved_values(small_model(), np.array, None) is None
        assert compat.snapshots_work() is False
    assert one_line_naming_keras(said(caplog, "model.save while training waits"))


def test_a_store_that_reads_back_other_values_fails_the_loading_probe(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from keras.src.saving import saving_lib

    original = saving_lib.H5IOStore.__init__

    def init(self: Any, path_or_io: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(path_or_io, (str, os.PathLike)):  # a file object: what the fast loads use
            raise TypeError("path_or_io should be a path")
        original(self, path_or_io, *args, **kwargs)

    monkeypatch.setattr(saving_lib.H5IOStore, "__init__", init)
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert compat.loading._loading_works() is False
        assert compat.load_weights_from(small_model(), object()) is False
    assert one_line_naming_keras(said(caplog, "loaded with load_weights and load_model"))


def test_a_traversal_failing_on_a_model_saves_with_model_save_from_then_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    """A Keras whose internals pass the probe but fail on a real model: that save, and every later
    one, goes through model.save while training waits; the checkpoint is whole either way."""
    from keras.src.saving import saving_lib

    import resumable

    assert compat.snapshots_work()  # probed before the traversal breaks
    original = saving_lib._save_state

    def save_state(saveable: Any, weights_store: Any, *args: Any, **kwargs: Any) -> None:
        if type(weights_store).__name__ == "Recorder" and isinstance(saveable, keras.Model):
            raise TypeError("save_own_variables() takes a store of another kind")
        original(saveable, weights_store, *args, **kwargs)

    monkeypatch.setattr(saving_lib, "_save_state", save_state)
    with caplog.at_level(logging.WARNING, logger="resumable"):
        run = resumable.resume(str(tmp_path / "run"), build_model=small_model, monitor="loss")
        run.fit(X, Y, batch_size=4, epochs=2, verbose=0)
    assert one_line_naming_keras(said(caplog, "a snapshot of the model failed"))
    assert [c.epoch for c in resumable.RunStorage(str(tmp_path / "run")).list()] == [1, 2]
    resumed = resumable.resume(str(tmp_path / "run"), build_model=small_model, monitor="loss")
    assert resumed.initial_epoch == 2
    for a, b in zip(resumed.model.get_weights(), run.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("best_only", [False, True])
def test_the_keras_3_8_save_decision_prints_its_line(best_only: bool,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Keras 3.8 and 3.9 decide in `_save_model`, so resumable decides and prints there: with
    verbose=1 it prints Keras' line (on any Keras: the code that crashed on 3.8 runs here too)."""
    callback = keras.callbacks.ModelCheckpoint("m.keras", monitor="loss", save_best_only=best_only,
                                               mode="min", verbose=1)
    if callback.monitor_op is None:  # Keras 3.10+ sets these at the first epoch's end
        callback.monitor_op, callback.best = np.less, np.inf
    assert compat.callbacks._decided_as_keras_3_8(callback, 0, {"loss": 0.5}, "m.keras")
    said = capsys.readouterr().out.strip()
    if best_only:
        assert said == "Epoch 1: loss improved from inf to 0.50000, saving model to m.keras"
    else:
        assert said == "Epoch 1: saving model to m.keras"
