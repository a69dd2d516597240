"""Timed saves, exact mid-epoch resume and saving on interrupt (KeyboardInterrupt, SIGTERM, SIGKILL).

In-process tests interrupt a fit with a callback raising KeyboardInterrupt at a batch, resume from
the checkpoint that leaves, and compare with a fit never interrupted, bitwise. Subprocess tests run
tests/jobs/train_job.py and kill it (SIGKILL) or stop it (SIGTERM) between two mid-epoch saves.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import backends
import numpy as np
import pytest
from fit_interrupts import InterruptAt
from forked import ForkedJob, start_job
from keras_helpers import assert_equal_weights, same_weights, saved_weights
from paths import JOBS

import resumable
from resumable import RunStorage
from resumable.keras.callback.interrupts import save_interrupted

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(192, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
X_VAL, Y_VAL = X[:64], Y[:64]
BATCH = 32
STEPS = 6  # per epoch
JOB = JOBS / "train_job.py"


@pytest.fixture(autouse=True, scope="module")
def deterministic_ops() -> None:
    backends.deterministic_ops()


def make_model() -> Any:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    return model


class Batches(keras.utils.PyDataset):
    def __init__(self) -> None:
        super().__init__()

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        part = slice(index * BATCH, (index + 1) * BATCH)
        return X[part], Y[part]


def endless() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A deterministic stream: epoch after epoch of the same batches."""
    while True:
        for i in range(STEPS):
            yield X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH]


def fit_args(data: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh inputs for one fit, as a notebook re-run would create them."""
    common: dict[str, Any] = {"validation_data": (X_VAL, Y_VAL), "verbose": 0}
    if data == "arrays":
        return (X, Y), {**common, "batch_size": BATCH, "shuffle": False}
    if data == "arrays-shuffled":  # model.fit shuffles each epoch
        return (X, Y), {**common, "batch_size": BATCH, "shuffle": True}
    if data == "validation-split":
        return (X, Y), {"verbose": 0, "batch_size": BATCH, "validation_split": 0.25}
    if data == "tf.data":
        import tensorflow as tf

        return (tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH),), common
    if data == "pydataset":  # shuffled by model.fit (its default shuffle=True)
        return (Batches(),), common
    if data == "generator":
        return (endless(),), {**common, "steps_per_epoch": STEPS}
    raise AssertionError(data)


# ------------------------------------------------------------------------- save_interval


@pytest.mark.parametrize("value", [0, -5, float("nan"), float("inf"), "10m", True, datetime.timedelta(0)])
def test_save_interval_must_be_positive(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ValueError, match="Invalid value for argument `save_interval`") as caught:
        resumable.CheckpointCallback(str(tmp_path / "run"), save_interval=value)
    assert f"Received: save_interval={value!r}. Expected a positive number of seconds" in str(caught.value)


def test_save_interval_takes_seconds_or_a_timedelta(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    ten_minutes = datetime.timedelta(minutes=10)
    assert resumable.CheckpointCallback(url, save_interval=ten_minutes).save_interval == 600.0
    assert resumable.CheckpointCallback(url, save_interval=90).save_interval == 90.0
    assert resumable.CheckpointCallback(url).save_interval is None


@pytest.mark.slow
def test_timed_saves_commit_mid_epoch_checkpoints(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=make_model, save_interval=1e-6, keep_last=None,
                           async_upload=False)
    run.fit(*fit_args("arrays")[0], epochs=1, **fit_args("arrays")[1])

    checkpoints = RunStorage(url).list()
    # Every batch but the last (the epoch-end save follows it) is past the tiny interval.
    assert [(c.epoch, c.manifest.batch, c.step) for c in checkpoints if c.manifest] == [
        (0, b, b) for b in range(1, STEPS)] + [(1, 0, STEPS)]
    assert all(c.ok for c in checkpoints)


@pytest.mark.slow
def test_a_long_interval_saves_only_at_epoch_ends(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=make_model, save_interval=3600, keep_last=None)
    run.fit(*fit_args("arrays")[0], epochs=2, **fit_args("arrays")[1])
    assert [c.name for c in RunStorage(url).list()] == ["ckpt-000001", "ckpt-000002"]


# ------------------------------------------------------------------------- in-process resume


@pytest.mark.lanes
@pytest.mark.slow
@pytest.mark.parametrize("data", ["arrays", "arrays-shuffled", "validation-split",
                                  pytest.param("tf.data", marks=backends.needs_tensorflow),
                                  "pydataset", "generator"])
def test_interrupted_mid_epoch_resumes_at_the_batch_and_equals_uninterrupted(
    tmp_path: Path, data: str, capsys: pytest.CaptureFixture[str],
) -> None:
    straight = resumable.resume(str(tmp_path / "straight"), build_model=make_model)
    args, kwargs = fit_args(data)
    straight.fit(*args, epochs=3, **kwargs)

    url = str(tmp_path / "resumed")
    first = resumable.resume(url, build_model=make_model, save_freq=2)
    args, kwargs = fit_args(data)
    with pytest.raises(KeyboardInterrupt):
        # InterruptAt runs before the checkpoint callback: its batch end never reaches ours.
        first.fit(*args, epochs=3, callbacks=[InterruptAt(epoch=1, batch=3)], **kwargs)

    per_epoch = 5 if data == "validation-split" else STEPS  # 144 training samples: 5 batches
    latest = RunStorage(url).latest()
    assert latest is not None and latest.manifest is not None and latest.ok
    assert (latest.epoch, latest.manifest.batch, latest.step) == (1, 3, per_epoch + 3)
    assert f"saved {latest.url} (epoch 1 + 3 batches)" in capsys.readouterr().out

    again = resumable.resume(url, build_model=make_model, save_freq=2)
    assert again.checkpoint is not None and again.checkpoint.name == latest.name
    args, kwargs = fit_args(data)
    history = again.fit(*args, epochs=3, **kwargs)

    assert same_weights(again.model, straight.model)
    # The resumed epoch reports the metrics of the whole epoch, as the uninterrupted one did.
    assert again.history == straight.history
    assert history.epoch == [1, 2] and history.history["loss"] == straight.history["loss"][1:]
    steps = [(c.epoch, c.step) for c in RunStorage(url).list()]
    assert steps[-1] == (3, 3 * per_epoch)


@pytest.mark.slow
def test_early_stopping_state_carries_from_the_rest_of_the_epoch_to_the_next_epochs(tmp_path: Path) -> None:
    def early() -> Any:  # min_delta=10: no epoch after the first improves; stops after 3 epochs
        return keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=10.0)

    straight = resumable.resume(str(tmp_path / "straight"), build_model=make_model)
    straight.fit(*fit_args("arrays")[0], epochs=10, callbacks=[early()], **fit_args("arrays")[1])
    assert len(straight.history["loss"]) == 3

    url = str(tmp_path / "resumed")
    first = resumable.resume(url, build_model=make_model)
    with pytest.raises(KeyboardInterrupt):
        first.fit(*fit_args("arrays")[0], epochs=10, callbacks=[early(), InterruptAt(1, 4)],
                  **fit_args("arrays")[1])
    again = resumable.resume(url, build_model=make_model)
    again.fit(*fit_args("arrays")[0], epochs=10, callbacks=[early()], **fit_args("arrays")[1])

    assert again.history == straight.history and again.complete
    assert same_weights(again.model, straight.model)


@pytest.mark.slow
def test_a_plain_model_fit_replays_the_epoch_with_a_warning(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    first = resumable.resume(url, build_model=make_model)
    with pytest.raises(KeyboardInterrupt):
        first.fit(*fit_args("arrays")[0], epochs=2, callbacks=[InterruptAt(0, 2)], **fit_args("arrays")[1])
    again = resumable.resume(url, build_model=make_model)
    assert again.callback.resume_batch == 2
    with pytest.warns(UserWarning, match="saved 2 batches into epoch 1; model.fit cannot start there"):
        again.model.fit(X, Y, epochs=1, batch_size=BATCH, verbose=0, callbacks=[again.callback])
    assert again.initial_epoch == 1 and again.model.optimizer.iterations.numpy() == 2 + STEPS


@pytest.mark.slow
def test_an_epoch_that_cannot_be_positioned_is_replayed_with_a_warning(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    first = resumable.resume(url, build_model=make_model)
    with pytest.raises(KeyboardInterrupt):
        first.fit(*fit_args("arrays")[0], epochs=2, callbacks=[InterruptAt(0, 4)], **fit_args("arrays")[1])
    again = resumable.resume(url, build_model=make_model)
    expected = "saved 4 batches into epoch 1, but steps_per_epoch=3 is not more than that; that epoch rest"
    with pytest.warns(UserWarning, match=expected):
        again.fit(X, Y, epochs=1, batch_size=BATCH, steps_per_epoch=3, verbose=0)
    assert again.initial_epoch == 1 and again.model.optimizer.iterations.numpy() == 4 + 3


@pytest.mark.slow
@pytest.mark.parametrize(("interrupt_at", "steps"), [(3, [2, 3]), (4, [2, 4])])
def test_an_interrupt_saves_unless_that_step_is_saved(
    tmp_path: Path, interrupt_at: int, steps: list[int],
) -> None:
    url = str(tmp_path / "run")
    callback = resumable.CheckpointCallback(url, save_freq=2, keep_last=None)
    model = make_model()
    with pytest.raises(KeyboardInterrupt):
        # after ours: at batch 4, ours has just saved step 4 (a multiple of save_freq) when it raises
        model.fit(X, Y, epochs=1, batch_size=BATCH, shuffle=False, verbose=0,
                  callbacks=[callback, InterruptAt(0, interrupt_at)])
    assert save_interrupted(callback) is None
    callback.wait_for_uploads()
    assert [c.step for c in RunStorage(url).list()] == steps


class SignalAt(keras.callbacks.Callback):
    """Send this process SIGINT ``times`` times after batch ``batch`` (1-based) of the first epoch."""

    def __init__(self, batch: int, times: int = 1) -> None:
        super().__init__()
        self.batch, self.times = batch, times

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch + 1 == self.batch:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.lanes
@pytest.mark.slow
def test_ctrl_c_saves_at_the_batch_end_then_raises_and_puts_the_handler_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ctrl_c_as_in_a_notebook: None,
) -> None:
    url = str(tmp_path / "run")
    before = signal.getsignal(signal.SIGINT)
    run = resumable.resume(url, build_model=make_model)
    with pytest.raises(KeyboardInterrupt):
        run.fit(*fit_args("arrays")[0], epochs=2, callbacks=[SignalAt(batch=4)], **fit_args("arrays")[1])

    assert signal.getsignal(signal.SIGINT) is before
    latest = RunStorage(url).latest()
    assert latest is not None and latest.manifest is not None and latest.ok
    assert (latest.epoch, latest.manifest.batch) == (0, 4)
    captured = capsys.readouterr()
    assert "resumable: Ctrl-C: saving a checkpoint at the end of this batch" in captured.err
    assert f"interrupted; saved {latest.url} (epoch 0 + 4 batches)" in captured.out


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path: Path, ctrl_c_as_in_a_notebook: None) -> None:
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=make_model)
    with pytest.raises(KeyboardInterrupt):
        run.fit(*fit_args("arrays")[0], epochs=2, callbacks=[SignalAt(batch=4, times=2)],
                **fit_args("arrays")[1])
    assert RunStorage(url).list() == []


# ------------------------------------------------------------------------- signals, in a subprocess


def job(url: str | Path, *extra: str) -> ForkedJob:
    return start_job(JOB, [str(url), *extra])


def read_until(proc: ForkedJob, wanted: Any, timeout: float = 120) -> list[str]:
    """Lines of stdout up to and including the first for which ``wanted(line)``; kill on timeout."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if wanted(lines[-1]):
                return lines
    finally:
        timer.cancel()
    raise AssertionError("the job ended without the expected line:\n" + "\n".join(lines)
                         + proc.stderr_text()[-3000:])


def finish(proc: ForkedJob, timeout: float = 300) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err[-3000:]


EPOCHS = 3
TIMED = ["--epochs", str(EPOCHS), "--save-interval", "0.25", "--batch-sleep", "0.04", "--keep-last", "10"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    code, output = finish(job(folder / "run", "--epochs", str(EPOCHS), "--shuffle",
                              "--out", str(folder / "final.npz")))
    assert code == 0, output
    return saved_weights(folder / "final.npz")


def is_mid_epoch_commit(line: str) -> bool:
    return line.startswith("LOG resumable: saved ") and "-step-" in line


@pytest.mark.slow
@pytest.mark.parametrize("where", [pytest.param("local", marks=pytest.mark.lanes), "gcs"])
def test_sigkill_between_mid_epoch_saves_resumes_at_the_batch_and_equals_uninterrupted(
    where: str, tmp_path: Path, uninterrupted: list[np.ndarray], request: pytest.FixtureRequest,
) -> None:
    url = str(tmp_path / "run") if where == "local" else request.getfixturevalue("gcs_bucket") + "/runs/kill"
    proc = job(url, *TIMED, "--shuffle")
    commits = 0

    def second_mid_epoch_commit(line: str) -> bool:
        nonlocal commits
        commits += is_mid_epoch_commit(line)
        return commits == 2

    read_until(proc, second_mid_epoch_commit)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    latest = RunStorage(url).latest()
    assert latest is not None and latest.manifest is not None and latest.manifest.batch > 0

    code, output = finish(job(url, *TIMED, "--shuffle", "--out", str(tmp_path / "final.npz")))

    assert code == 0, output
    assert f"RESUMED {latest.name} batch={latest.manifest.batch}" in output
    assert_equal_weights(saved_weights(tmp_path / "final.npz"), uninterrupted)
    assert RunStorage(url).latest().epoch == EPOCHS  # type: ignore[union-attr]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_then_the_process_exits(tmp_path: Path) -> None:
    # (that an interrupt's checkpoint resumes exactly is shown in-process with KeyboardInterrupt)
    url = tmp_path / "run"
    proc = job(url, *TIMED, "--shuffle")
    read_until(proc, is_mid_epoch_commit)
    proc.send_signal(signal.SIGTERM)
    code, output = finish(proc, timeout=60)

    assert code == 128 + signal.SIGTERM, output
    assert "resumable: SIGTERM: saving a checkpoint at the end of this batch" in output
    latest = RunStorage(url).latest()
    assert latest is not None and latest.ok and latest.manifest is not None
    assert f"interrupted; saved {latest.url}" in output
    assert "DONE" not in output
