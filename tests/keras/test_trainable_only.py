"""save_trainable_only=True in one process (TensorFlow): what is saved, exact resumes, refusals.

Keras' own Dense.enable_lora stands in for a keras-hub model here; tests/keras/test_keras_hub.py
runs a keras-hub Gemma with LoRA on TensorFlow and JAX, killed with SIGKILL and resumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import backends
import numpy as np
import pytest
from fit_interrupts import InterruptAt

import resumable
from resumable import CheckpointMismatchError, CheckpointNotFoundError, RunStorage

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(96, 8)).astype("float32")
Y = (X[:, :1] - 2 * X[:, 1:2]).astype("float32")
FIT = {"batch_size": 16, "shuffle": False, "verbose": 0, "validation_data": (X[:32], Y[:32])}


@pytest.fixture(autouse=True, scope="module")
def deterministic_ops() -> None:
    backends.deterministic_ops()


def lora_model(base_seed: int = 3, rank: int = 4, freeze_bn: bool = True, dtype: str | None = None) -> Any:
    """A frozen 'base' (Dense with LoRA, a frozen BatchNormalization) under a trained head with its
    own BatchNormalization and Dropout: the variables of each kind a fine-tune has."""
    keras.utils.set_random_seed(base_seed)
    base = keras.layers.Dense(256, activation="relu", name="base", dtype=dtype)
    base_bn = keras.layers.BatchNormalization(name="base_bn", dtype=dtype)
    inputs = keras.Input((8,))
    hidden = base_bn(base(inputs))
    keras.utils.set_random_seed(7)  # the head's initial weights do not depend on the base's seed
    head = keras.layers.Dense(16, activation="relu", name="head", dtype=dtype)(hidden)
    head = keras.layers.BatchNormalization(name="head_bn", dtype=dtype)(head)
    head = keras.layers.Dropout(0.2, name="drop")(head)
    outputs = keras.layers.Dense(1, name="out", dtype=dtype)(head)
    model = keras.Model(inputs, outputs)
    base.enable_lora(rank)
    base_bn.trainable = not freeze_bn
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def assert_same_state(a: Any, b: Any) -> None:
    """Bitwise: every weight (frozen, trained, statistics), every optimizer variable, the seed states."""
    for x, y in zip(a.variables, b.variables, strict=True):
        assert np.array_equal(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y)), x.path
    for x, y in zip(a.optimizer.variables, b.optimizer.variables, strict=True):
        assert np.array_equal(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y)), x.path


def checkpoint_folder(url: Path) -> Path:
    latest = RunStorage(str(url)).latest()
    assert latest is not None
    return url / latest.name


@pytest.mark.lanes
def test_only_what_trains_is_saved_with_the_frozen_fingerprint(tmp_path: Path) -> None:
    run = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    run.fit(X, Y, epochs=1, **FIT)
    folder = checkpoint_folder(tmp_path / "run")

    assert sorted(p.name for p in folder.iterdir()) == ["arrays.npz", "manifest.json", "state.json",
                                                        "trainable.npz"]
    layout = json.loads((folder / "state.json").read_text())["trainable"]
    saved = [path for path, _, _ in layout["weights"]]
    # LoRA's factors, the head and its BatchNormalization's statistics; not the LoRA'd kernel, not
    # the frozen BatchNormalization.
    assert saved == [
        "base/bias", "base/lora_kernel_a", "base/lora_kernel_b", "head/kernel", "head/bias",
        "head_bn/gamma", "head_bn/beta", "out/kernel", "out/bias", "head_bn/moving_mean",
        "head_bn/moving_variance",
    ]
    assert len(layout["optimizer"]) == 2 + 2 * 9  # iterations, learning rate, Adam's two per trainable
    with np.load(folder / "trainable.npz") as data:
        assert len(data.files) == len(layout["weights"]) + len(layout["optimizer"])
    manifest = json.loads((folder / "manifest.json").read_text())
    frozen = manifest["state"]["frozen"]
    assert manifest["state"]["format"] == "trainable"
    assert frozen == layout["frozen"]
    assert (frozen["variables"], frozen["bytes"]) == (5, (8 * 256 + 4 * 256) * 4)  # kernel, 4 BN vectors
    assert len(frozen["crc32c"]) == 8


@pytest.mark.lanes
def test_a_trainable_only_resume_equals_a_run_never_stopped(tmp_path: Path) -> None:
    keras.utils.set_random_seed(1)
    straight = resumable.resume(str(tmp_path / "straight"), build_model=lora_model, save_trainable_only=True)
    straight.fit(X, Y, epochs=4, **FIT)

    keras.utils.set_random_seed(1)
    first = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    first.fit(X, Y, epochs=2, **FIT)
    resumed = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    assert resumed.initial_epoch == 2
    resumed.fit(X, Y, epochs=4, **FIT)

    assert_same_state(straight.model, resumed.model)
    assert resumed.history == straight.history


@pytest.mark.lanes
def test_a_mid_epoch_trainable_only_checkpoint_resumes_at_its_batch(tmp_path: Path) -> None:
    keras.utils.set_random_seed(1)
    straight = resumable.resume(str(tmp_path / "straight"), build_model=lora_model)
    straight.fit(X, Y, epochs=2, **FIT)

    keras.utils.set_random_seed(1)
    first = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    with pytest.raises(KeyboardInterrupt):
        first.fit(X, Y, epochs=2, callbacks=[InterruptAt(epoch=1, batch=3)], **FIT)
    resumed = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    assert (resumed.initial_epoch, resumed.callback.resume_batch) == (1, 3)
    resumed.fit(X, Y, epochs=2, **FIT)

    assert_same_state(straight.model, resumed.model)
    assert resumed.history == straight.history


class RaiseAt(InterruptAt):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if (self.epoch, batch + 1) == self.at:
            raise RuntimeError("boom")


def test_run_fit_again_after_an_error_goes_back_to_the_trainable_only_checkpoint(tmp_path: Path) -> None:
    keras.utils.set_random_seed(1)
    straight = resumable.resume(str(tmp_path / "straight"), build_model=lora_model)
    straight.fit(X, Y, epochs=2, **FIT)

    keras.utils.set_random_seed(1)
    run = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    with pytest.raises(RuntimeError, match="boom"):
        run.fit(X, Y, epochs=2, callbacks=[RaiseAt(epoch=1, batch=3)], **FIT)
    run.fit(X, Y, epochs=2, **FIT)  # loads epoch 1's trainable.npz into the model trained 3 batches past it

    assert_same_state(straight.model, run.model)


def test_resume_without_build_model_says_to_pass_one(tmp_path: Path) -> None:
    run = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    run.fit(X, Y, epochs=1, **FIT)

    with pytest.raises(CheckpointNotFoundError, match="holds only what trains.*pass build_model=") as caught:
        resumable.resume(str(tmp_path / "run"))
    assert "\n" not in str(caught.value)


@pytest.mark.lanes
def test_another_base_model_is_refused_in_one_line(tmp_path: Path) -> None:
    run = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    run.fit(X, Y, epochs=1, **FIT)

    with pytest.raises(CheckpointMismatchError, match="trained on other frozen weights") as caught:
        resumable.resume(str(tmp_path / "run"), build_model=lambda: lora_model(base_seed=4))
    assert "\n" not in str(caught.value)
    assert "over 5 variables" in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"rank": 2}, r"lora_kernel_a.*\(8, 4\) in the checkpoint"),
     ({"freeze_bn": False}, r"of the trained variables, number 3 is 'base_bn/gamma' \(float32 \(256,\)\) "
                            r"in the model but 'head/kernel' \(float32 \(256, 16\)\) in the checkpoint")],
    ids=["other-lora-rank", "base-not-frozen"],
)
def test_other_trained_variables_are_named(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    run = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True)
    run.fit(X, Y, epochs=1, **FIT)

    with pytest.raises(CheckpointMismatchError, match=message) as caught:
        resumable.resume(str(tmp_path / "run"), build_model=lambda: lora_model(**kwargs))
    assert "\n" not in str(caught.value)


def test_bfloat16_variables_keep_their_bits(tmp_path: Path) -> None:
    """.npy cannot name bfloat16: stored as uint16, viewed back."""
    def build() -> Any:
        return lora_model(dtype="bfloat16")

    run = resumable.resume(str(tmp_path / "run"), build_model=build, save_trainable_only=True)
    run.fit(X, Y, epochs=1, **FIT)
    resumed = resumable.resume(str(tmp_path / "run"), build_model=build)

    assert keras.backend.standardize_dtype(resumed.model.get_layer("head").kernel.dtype) == "bfloat16"
    assert_same_state(run.model, resumed.model)


def test_a_full_run_continues_trainable_only_and_back(tmp_path: Path) -> None:
    keras.utils.set_random_seed(1)
    straight = resumable.resume(str(tmp_path / "straight"), build_model=lora_model)
    straight.fit(X, Y, epochs=3, **FIT)

    keras.utils.set_random_seed(1)
    resumable.resume(str(tmp_path / "run"), build_model=lora_model).fit(X, Y, epochs=1, **FIT)
    resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_trainable_only=True).fit(
        X, Y, epochs=2, **FIT)
    last = resumable.resume(str(tmp_path / "run"), build_model=lora_model)
    last.fit(X, Y, epochs=3, **FIT)

    assert_same_state(straight.model, last.model)
    names = [sorted(c.manifest.files) for c in RunStorage(str(tmp_path / "run")).list() if c.manifest]
    assert [("model.keras" in n, "trainable.npz" in n) for n in names] == [
        (True, False), (False, True), (True, False)]


@pytest.mark.lanes
@pytest.mark.parametrize("weights_only", [False, True], ids=["keras-file", "weights-only"])
def test_full_checkpoints_of_lora_layers_resume_unmerged(tmp_path: Path, weights_only: bool) -> None:
    """Keras saves a LoRA layer merged and loads it with zero factors; resume() puts both back."""
    keras.utils.set_random_seed(1)
    straight = resumable.resume(str(tmp_path / "straight"), build_model=lora_model)
    straight.fit(X, Y, epochs=2, **FIT)

    keras.utils.set_random_seed(1)
    first = resumable.resume(str(tmp_path / "run"), build_model=lora_model, save_weights_only=weights_only)
    first.fit(X, Y, epochs=1, **FIT)
    resumed = resumable.resume(str(tmp_path / "run"), build_model=None if not weights_only else lora_model,
                               save_weights_only=weights_only)
    layer = resumed.model.get_layer("base")
    assert layer.lora_enabled
    assert np.array_equal(keras.ops.convert_to_numpy(layer.lora_kernel_a),
                          keras.ops.convert_to_numpy(first.model.get_layer("base").lora_kernel_a))
    resumed.fit(X, Y, epochs=2, **FIT)

    assert_same_state(straight.model, resumed.model)


def test_save_trainable_only_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Received: save_trainable_only='yes'. Expected True or False."):
        resumable.CheckpointCallback(str(tmp_path / "run"), save_trainable_only="yes")  # type: ignore[arg-type]


def test_lora_enabled_between_two_fits_of_one_callback_is_saved_unmerged(tmp_path: Path) -> None:
    """Whether the model has LoRA layers is asked once per fit, not once per callback: a head
    trained first, then LoRA enabled on the base, the second fit's checkpoint resumes unmerged."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    base = keras.layers.Dense(16, activation="relu", name="base")
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(base(inputs)))
    model.compile(optimizer="adam", loss="mse")
    callback = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss")
    model.fit(X, Y, epochs=1, callbacks=[callback], **FIT)
    base.enable_lora(4)
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(6)  # the step count goes on, as in one run
    model.fit(X, Y, initial_epoch=1, epochs=2, callbacks=[callback], **FIT)

    resumed = resumable.resume(str(tmp_path / "run"), monitor="loss")
    layer = resumed.model.get_layer("base")
    assert resumed.initial_epoch == 2 and layer.lora_enabled
    for name in ("kernel", "lora_kernel_a", "lora_kernel_b"):
        assert np.array_equal(keras.ops.convert_to_numpy(getattr(layer, name)),
                              keras.ops.convert_to_numpy(getattr(base, name))), name
