"""CheckpointCallback and resume() in one process: arguments, contents, retention, state, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import backends
import numpy as np
import pytest
from keras_helpers import same_weights

import resumable
from resumable import (
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    ResumableError,
    RunStorage,
)
from resumable.storage import STREAM_MIN_BYTES

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(192, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
X_VAL, Y_VAL = X[:64], Y[:64]
FIT = {"batch_size": 32, "shuffle": False, "verbose": 0, "validation_data": (X_VAL, Y_VAL)}
STEPS = 6  # per epoch


@pytest.fixture(autouse=True, scope="module")
def deterministic_ops() -> None:
    """Bitwise-equal training runs (CPU); set here rather than at import, which every run collects."""
    backends.deterministic_ops()


def make_model(units: int = 16, dropout: bool = False) -> Any:
    keras.utils.set_random_seed(3)
    middle = [keras.layers.Dropout(0.3)] if dropout else []
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(units, activation="relu"), *middle, keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


# ------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"save_freq": "daily"}, "Received: save_freq='daily'. Expected 'epoch' or a positive int."),
        ({"save_freq": 0}, "Received: save_freq=0"),
        ({"save_freq": 2.5}, "Received: save_freq=2.5"),
        ({"mode": "up"}, "Received: mode='up'"),
        ({"keep_last": 0}, "Received: keep_last=0"),
        ({"keep_best": -1}, "Received: keep_best=-1"),
        ({"monitor": ""}, "Received: monitor=''"),
        ({"filename": "ckpt"}, "Received: filename='ckpt'"),
        ({"verbose": 5}, "Received: verbose=5"),
    ],
)
def test_invalid_arguments_fail_in_init(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="Invalid value for argument") as caught:
        resumable.CheckpointCallback(str(tmp_path / "run"), **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "filepath", ["model.keras", "weights.{epoch:02d}.h5", "best.weights.h5", "weights.hdf5", ""]
)
def test_a_model_file_path_is_not_a_run_folder(filepath: str) -> None:
    with pytest.raises(ValueError, match="Received: filepath=.*Expected a run folder"):
        resumable.CheckpointCallback(filepath)


def test_resume_validates_callback_arguments_before_touching_storage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="save_freq"):
        resumable.resume(str(tmp_path / "run"), build_model=make_model, save_freq="daily")
    assert not (tmp_path / "run").exists()


@pytest.mark.lanes
def test_import_resumable_does_not_import_keras_or_tensorflow() -> None:
    code = (
        "import sys, resumable; resumable.RunStorage; "
        "print(sorted(m for m in ('keras', 'tensorflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_resume_is_the_function_after_its_module_is_imported() -> None:
    import resumable.keras.run  # noqa: F401

    assert callable(resumable.resume) and resumable.resume.__name__ == "resume"


# ------------------------------------------------------------------------- save and resume


@pytest.mark.slow
def test_checkpoints_hold_model_optimizer_and_state(run_url: str) -> None:
    run = resumable.resume(run_url, build_model=make_model, keep_last=2, keep_best=0)
    assert run.initial_epoch == 0 and run.checkpoint is None
    run.fit(X, Y, epochs=3, **FIT)

    storage = RunStorage(run_url)
    assert [c.name for c in storage.list()] == ["ckpt-000002", "ckpt-000003"]
    latest = storage.latest()
    assert latest is not None and latest.epoch == 3 and latest.step == 3 * STEPS
    assert set(latest.manifest.files) == {"model.keras", "state.json"}  # type: ignore[union-attr]
    assert latest.metrics["val_loss"] == pytest.approx(run.history["val_loss"][-1])
    state = latest.manifest.state  # type: ignore[union-attr]
    assert state["optimizer"]["class"] == "Adam" and state["optimizer"]["iterations"] == 3 * STEPS
    assert state["monitor"] == "val_loss" and state["best"] == min(run.history["val_loss"])

    again = resumable.resume(run_url, build_model=make_model, keep_last=2, keep_best=0)
    assert again.initial_epoch == 3
    assert again.checkpoint is not None and again.checkpoint.name == "ckpt-000003"
    assert same_weights(again.model, run.model)
    assert int(again.model.optimizer.iterations.numpy()) == 3 * STEPS
    for slot, restored in zip(run.model.optimizer.variables, again.model.optimizer.variables, strict=True):
        assert np.array_equal(slot.numpy(), restored.numpy()), slot.path
    assert again.history == run.history and len(again.history["loss"]) == 3
    assert again.callback.best == run.callback.best

    again.fit(X, Y, epochs=4, **FIT)
    assert len(again.history["loss"]) == 4
    assert [c.name for c in storage.list()] == ["ckpt-000003", "ckpt-000004"]


@pytest.mark.slow
def test_a_checkpoint_big_enough_to_stream_round_trips_through_gcs(gcs_bucket: str) -> None:
    """A model.keras over STREAM_MIN_BYTES takes the streamed GCS upload, in the background."""
    url = f"{gcs_bucket}/runs/big"

    def big_model() -> Any:
        return make_model(units=100_000)  # 1M parameters and Adam's two slots: about 12 MB

    run = resumable.resume(url, build_model=big_model)
    run.fit(X, Y, epochs=2, **FIT)
    latest = RunStorage(url).latest()
    assert latest is not None and latest.epoch == 2
    assert latest.manifest.files["model.keras"].size >= STREAM_MIN_BYTES  # type: ignore[union-attr]
    assert RunStorage(url).verify(latest.name) == []

    again = resumable.resume(url, build_model=big_model)
    assert again.initial_epoch == 2 and same_weights(again.model, run.model)
    for slot, restored in zip(run.model.optimizer.variables, again.model.optimizer.variables, strict=True):
        assert np.array_equal(slot.numpy(), restored.numpy()), slot.path


@pytest.mark.lanes
@pytest.mark.slow
def test_resume_without_build_model_loads_the_saved_model(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    first = resumable.resume(url, build_model=make_model)
    first.fit(X, Y, epochs=2, **FIT)

    run = resumable.resume(url)
    assert same_weights(run.model, first.model)
    assert int(run.model.optimizer.iterations.numpy()) == 2 * STEPS


@pytest.mark.slow
def test_retention_keeps_the_last_and_the_best(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    # mode="max" on a falling loss makes an early epoch the best, so last and best differ
    run = resumable.resume(
        url, build_model=make_model, monitor="val_loss", mode="max", keep_last=2, keep_best=1
    )
    run.fit(X, Y, epochs=5, **FIT)

    best_epoch = int(np.argmax(run.history["val_loss"])) + 1
    names = [c.name for c in RunStorage(url).list()]
    assert names == sorted({f"ckpt-{best_epoch:06d}", "ckpt-000004", "ckpt-000005"})
    assert run.callback.best == max(run.history["val_loss"])


@pytest.mark.slow
def test_save_best_only_commits_only_improvements(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=make_model, monitor="val_loss", mode="max", save_best_only=True,
                           keep_last=None)
    run.fit(X, Y, epochs=4, **FIT)

    values = run.history["val_loss"]
    improved = [i + 1 for i, v in enumerate(values) if v > max(values[:i], default=-np.inf)]
    assert [c.epoch for c in RunStorage(url).list()] == improved


@pytest.mark.slow
def test_mid_epoch_checkpoints_resume_from_the_epoch_start(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=make_model, save_freq=4, keep_last=None)
    run.fit(X, Y, epochs=2, **FIT)
    names = [c.name for c in RunStorage(url).list()]
    assert "ckpt-000000-step-000000004" in names and "ckpt-000001-step-000000008" in names
    assert "ckpt-000002" in names

    storage = RunStorage(url)
    storage.delete("ckpt-000002")  # as if killed after the mid-epoch save of epoch 2
    again = resumable.resume(url, build_model=make_model, save_freq=4)
    assert again.checkpoint is not None and again.checkpoint.name == "ckpt-000001-step-000000008"
    assert again.initial_epoch == 1 and again.checkpoint.manifest.batch == 2  # type: ignore[union-attr]
    again.fit(X, Y, epochs=2, **FIT)
    assert again.initial_epoch == 2 and len(again.history["loss"]) == 2


def test_a_name_with_batch_saves_mid_epoch_as_keras_names_it(tmp_path: Path) -> None:
    """``{batch}`` is the batch within the epoch (Keras' ModelCheckpoint); it used to crash the first save."""
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=make_model, save_freq=4, keep_last=None, async_upload=False,
                           filename="e{epoch:02d}-b{batch:02d}")
    run.fit(X, Y, epochs=2, **FIT)
    names = [c.name for c in RunStorage(url, filename="e{epoch:02d}-b{batch:02d}").list() if c.ok]
    assert names == ["e00-b04-step-000000004", "e01-b00", "e01-b02-step-000000008", "e02-b00"]


# ------------------------------------------------------------------------- callback state


def fit_with_state_callbacks(run: Any, epochs: int, ours_first: bool = False) -> tuple[Any, Any]:
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=4, min_delta=10.0)
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1, factor=0.5, min_delta=10.0)
    if ours_first:  # a plain model.fit with the checkpoint callback before the others
        callbacks = [run.callback, early, plateau]
        run.model.fit(X, Y, epochs=epochs, initial_epoch=run.initial_epoch, callbacks=callbacks, **FIT)
    else:  # run.fit puts it last
        run.fit(X, Y, epochs=epochs, callbacks=[early, plateau], **FIT)
    return early, plateau


@pytest.mark.lanes
@pytest.mark.slow
@pytest.mark.parametrize("ours_first", [False, True], ids=["run.fit", "model.fit-callback-first"])
def test_early_stopping_plateau_and_best_survive_a_resume(tmp_path: Path, ours_first: bool) -> None:
    # min_delta=10 makes every epoch after the first "no improvement": EarlyStopping stops
    # after 5 epochs and the learning rate halves each epoch, if their state survives.
    straight = resumable.resume(str(tmp_path / "straight"), build_model=make_model)
    early_a, plateau_a = fit_with_state_callbacks(straight, 10)
    assert len(straight.history["loss"]) == 5

    url = str(tmp_path / "resumed")
    fit_with_state_callbacks(resumable.resume(url, build_model=make_model), 3, ours_first)
    resumed = resumable.resume(url, build_model=make_model)
    assert resumed.callback.best == min(resumed.history["val_loss"])
    early_b, plateau_b = fit_with_state_callbacks(resumed, 10, ours_first)

    assert resumed.history == straight.history
    assert (early_b.wait, early_b.stopped_epoch, early_b.best) == (
        early_a.wait, early_a.stopped_epoch, early_a.best)
    assert (plateau_b.wait, plateau_b.cooldown_counter, plateau_b.best) == (
        plateau_a.wait, plateau_a.cooldown_counter, plateau_a.best)
    lr = float(resumed.model.optimizer.learning_rate.numpy())
    assert lr == float(straight.model.optimizer.learning_rate.numpy()) < 1e-2
    assert resumed.callback.best == straight.callback.best
    assert same_weights(resumed.model, straight.model)

    # stopped early: a later session does not train again
    done = resumable.resume(url, build_model=make_model)
    assert done.complete
    assert done.fit(X, Y, epochs=10, **FIT).history == {}
    assert RunStorage(url).latest().epoch == 5  # type: ignore[union-attr]


@pytest.mark.lanes
@pytest.mark.slow
def test_dropout_masks_continue_after_a_resume(tmp_path: Path) -> None:
    # Keras does not save SeedGenerator states; without ours the masks after a resume repeat epoch 1's.
    straight = resumable.resume(str(tmp_path / "straight"), build_model=lambda: make_model(dropout=True))
    straight.fit(X, Y, epochs=4, **FIT)

    url = str(tmp_path / "resumed")
    resumable.resume(url, build_model=lambda: make_model(dropout=True)).fit(X, Y, epochs=2, **FIT)
    resumed = resumable.resume(url, build_model=lambda: make_model(dropout=True))
    resumed.fit(X, Y, epochs=4, **FIT)

    assert same_weights(resumed.model, straight.model)


@pytest.mark.slow
def test_a_plain_model_fit_saves_the_state_of_its_other_callbacks(tmp_path: Path) -> None:
    url = str(tmp_path / "run")

    def early_stopping() -> Any:
        # mode="max" on a falling loss: the first epoch stays the best, so the state is visible
        return keras.callbacks.EarlyStopping(
            monitor="val_loss", mode="max", patience=5, restore_best_weights=True
        )

    early = early_stopping()
    make_model().fit(X, Y, epochs=2, callbacks=[early, resumable.CheckpointCallback(url)], **FIT)
    assert (early.best_epoch, early.wait) == (0, 1)

    latest = RunStorage(url).latest()
    assert latest is not None and "arrays.npz" in latest.manifest.files  # type: ignore[union-attr]
    assert latest.manifest.state["callbacks"]["EarlyStopping#0"]["wait"] == 1  # type: ignore[union-attr]
    run = resumable.resume(url, build_model=make_model)
    restored = early_stopping()
    run.fit(X, Y, epochs=3, callbacks=[restored], **FIT)
    assert (restored.best_epoch, restored.wait, restored.best) == (0, 2, early.best)
    for saved, carried in zip(early.best_weights, restored.best_weights, strict=True):
        assert np.array_equal(saved, carried)


# ------------------------------------------------------------------------- errors and fallbacks


@pytest.mark.slow
def test_a_plain_fit_into_an_existing_run_folder_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    make_model().fit(X, Y, epochs=1, callbacks=[resumable.CheckpointCallback(url)], **FIT)

    with pytest.raises(CheckpointExistsError, match=r"resumable\.resume"):
        make_model().fit(X, Y, epochs=1, callbacks=[resumable.CheckpointCallback(url)], **FIT)
    assert [c.name for c in RunStorage(url).list()] == ["ckpt-000001"]


@pytest.mark.slow
def test_fit_of_a_resumed_model_without_initial_epoch_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=make_model).fit(X, Y, epochs=2, **FIT)
    run = resumable.resume(url, build_model=make_model)

    with pytest.raises(ResumableError, match="initial_epoch=2"):
        run.model.fit(X, Y, epochs=3, callbacks=[run.callback], **FIT)
    # raised in the callback's on_epoch_begin: Keras calls no on_train_end, the hook gave the lease back
    assert not (tmp_path / "run" / "lease.json").exists()
    with pytest.raises(ValueError, match="initial_epoch"):
        run.fit(X, Y, epochs=3, initial_epoch=0, **FIT)


@pytest.mark.lanes
@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    # async_upload=False: every epoch committed (in the background a newer one may replace one waiting)
    first = resumable.resume(url, build_model=make_model, keep_last=None, async_upload=False)
    first.fit(X, Y, epochs=3, **FIT)
    model_file = tmp_path / "run" / "ckpt-000003" / "model.keras"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    model_file.write_bytes(bytes(data))

    with pytest.warns(UserWarning, match="ckpt-000003"):
        run = resumable.resume(url, build_model=make_model, keep_last=None)
    assert run.checkpoint is not None and run.checkpoint.name == "ckpt-000002" and run.initial_epoch == 2
    run.fit(X, Y, epochs=3, **FIT)  # writes a good ckpt-000003 in place of the damaged one
    assert RunStorage(url).verify("ckpt-000003") == []


@pytest.mark.lanes
@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_build_model_names_the_mismatch(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=make_model).fit(X, Y, epochs=1, **FIT)

    expected = r"weight 0 .*kernel.* \(8, 32\) in the model but \(8, 16\)"
    with pytest.raises(CheckpointMismatchError, match=expected):
        resumable.resume(url, build_model=lambda: make_model(units=32))


@pytest.mark.slow
def test_a_different_optimizer_is_named(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=make_model).fit(X, Y, epochs=1, **FIT)

    def sgd_model() -> Any:
        model = make_model()
        model.compile(optimizer="sgd", loss="mse")
        return model

    expected = "Adam optimizer state but the model's optimizer is SGD"
    with pytest.raises(CheckpointMismatchError, match=expected):
        resumable.resume(url, build_model=sgd_model)


def test_no_checkpoint_and_no_build_model_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="pass build_model="):
        resumable.resume(str(tmp_path / "run"))


# ------------------------------------------------------------------------- issue #21: errors and monitors


class RaiseAt(keras.callbacks.Callback):
    """Raises RuntimeError at one epoch end or one batch end (0-based), once."""

    def __init__(self, epoch: int, batch: int | None = None) -> None:
        super().__init__()
        self.epoch, self.batch, self.current, self.raised = epoch, batch, -1, False

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.batch is not None and self.current == self.epoch and batch == self.batch and not self.raised:
            self.raised = True
            raise RuntimeError("boom from another callback")

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.batch is None and epoch == self.epoch and not self.raised:
            self.raised = True
            raise RuntimeError("boom from another callback")


@pytest.mark.parametrize(
    ("raise_at", "save_freq", "expected"),
    [((1, None), "epoch", "ckpt-000002"), ((0, 3), 4, "ckpt-000000-step-000000004")],
    ids=["epoch-end", "batch-end"],
)
def test_another_callback_raising_in_the_same_hook_keeps_that_checkpoint(
    tmp_path: Path, raise_at: tuple[int, int | None], save_freq: Any, expected: str
) -> None:
    """(a) run.fit used to put ours last: a callback raising in that hook lost its checkpoint."""
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=make_model, save_freq=save_freq, keep_last=None)
    with pytest.raises(RuntimeError, match="boom"):
        run.fit(X, Y, epochs=3, callbacks=[RaiseAt(*raise_at)], **FIT)
    names = [c.name for c in RunStorage(url).list() if c.ok]
    assert names[-1] == expected


def test_run_fit_again_after_an_exception_trains_no_batch_twice(tmp_path: Path, capsys: Any) -> None:
    """(b) A second run.fit on the same Run went on from the model's mid-epoch weights: extra steps."""
    straight = resumable.resume(str(tmp_path / "straight"), build_model=make_model)
    straight.fit(X, Y, epochs=3, **FIT)

    run = resumable.resume(str(tmp_path / "run"), build_model=make_model)
    with pytest.raises(RuntimeError, match="boom"):
        run.fit(X, Y, epochs=3, callbacks=[RaiseAt(1, batch=2)], **FIT)  # 3 steps into epoch 2
    run.fit(X, Y, epochs=3, **FIT)

    assert int(run.model.optimizer.iterations.numpy()) == 3 * STEPS
    assert run.history == straight.history
    assert same_weights(run.model, straight.model)
    assert "continuing from" in capsys.readouterr().out


def test_resuming_with_another_monitor_takes_its_best_from_the_history(tmp_path: Path) -> None:
    """(c) The old monitor's best used to become the new monitor's value to beat, silently."""
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=make_model, monitor="val_loss").fit(X, Y, epochs=2, **FIT)

    with pytest.warns(UserWarning, match=r"tracked the best 'val_loss'.*monitors 'loss'"):
        run = resumable.resume(url, build_model=make_model, monitor="loss")
    assert run.callback.best == min(run.history["loss"]) != min(run.history["val_loss"])


def test_a_monitor_fit_never_logs_warns_once_with_keep_best(tmp_path: Path) -> None:
    """(d) Only save_best_only used to warn: keep_best then protected nothing, silently."""
    run = resumable.resume(str(tmp_path / "run"), build_model=make_model, monitor="val_acc", keep_best=1)
    with pytest.warns(UserWarning, match=r"monitor='val_acc' is not among .*keep_best=1") as caught:
        run.fit(X, Y, epochs=3, **FIT)
    assert len([w for w in caught if "val_acc" in str(w.message)]) == 1


def test_a_run_folder_named_like_an_hdf5_file_is_refused(tmp_path: Path) -> None:
    """(e) A path ending in weights.hdf5 was accepted and became a directory."""
    path = tmp_path / "weights.hdf5"
    with pytest.raises(ValueError, match=r"Expected a run folder.*resumable\.ModelCheckpoint"):
        resumable.resume(str(path), build_model=make_model)
    with pytest.raises(ValueError, match=r"Expected a run folder.*resumable\.ModelCheckpoint"):
        resumable.CheckpointCallback(str(path))
    assert not path.exists()


def test_the_arguments_read_back_as_attributes_that_cannot_be_changed_afterwards(tmp_path: Path) -> None:
    cb = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", save_freq=3, verbose=1)
    assert (cb.filepath, cb.monitor, cb.mode, cb.save_freq, cb.verbose) == (str(tmp_path / "run"), "loss",
                                                                           "min", 3, 1)
    with pytest.raises(AttributeError, match="`save_freq` is a constructor argument: pass it when creating"):
        cb.save_freq = "epoch"  # type: ignore[misc]
    assert cb.save_freq == 3 and cb.schedule.save_freq == 3  # the callback and its schedule agree
