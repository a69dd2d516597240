"""The input kinds people train with, each stopped and resumed in a new process (tests/keras/test_inputs.py).

    KERAS_BACKEND=jax python tests/jobs/inputs_job.py unbroken|stop|resume OUT_DIR [CASE ...]

PHASE is one of:

- ``unbroken``: every case trains ``EPOCHS`` epochs in one ``run.fit``;
- ``stop``: every case trains ``STOP_EPOCH`` epochs and ends (``stop-epoch``: an epoch-end
  checkpoint), and is interrupted (KeyboardInterrupt, as Ctrl-C) after batch ``STOP_BATCH`` of
  epoch ``STOP_EPOCH + 1`` (``stop-batch``: a mid-epoch checkpoint), in run folders of its own;
- ``resume``: resumes each run a ``stop`` process left and trains to ``EPOCHS``
  (``resume-epoch``, ``resume-batch``); after it, a case with callbacks runs its code once more
  (``resume()`` and ``run.fit`` of the finished run).

Each case runs in turn in this one process (its run folders are ``OUT_DIR/<case>-<kind>``); the
phases run in separate processes, as sessions of a notebook do. A case writes
``OUT_DIR/<case>-<step>.npz`` (the final weights) and ``.json`` (the warnings resumable gave,
the history, what the case's callbacks saw, or the error). Prints ``CASE <name> <step> ok|error``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import resumable  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fit_interrupts import InterruptAt  # noqa: E402

EPOCHS = 3
STOP_EPOCH = 1  # stop-epoch: after this many epochs; stop-batch: in the next one
STOP_BATCH = 2
BATCH = 16
SAMPLES = 96  # 6 batches per epoch
CLASSES = 3

rng = np.random.default_rng(0)
X = rng.normal(size=(SAMPLES, 4)).astype("float32")
Y = (np.argmax(X[:, :CLASSES], axis=1)).astype("int64")
W = rng.uniform(0.5, 1.5, size=(SAMPLES,)).astype("float32")
X_VAL = rng.normal(size=(32, 4)).astype("float32")
Y_VAL = (np.argmax(X_VAL[:, :CLASSES], axis=1)).astype("int64")


def seed(value: int) -> None:
    keras.utils.set_random_seed(value)


def build() -> keras.Model:
    seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.1), keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


# ----------------------------------------------------------------------------- inputs


def shuffled(seed_value: int | None = 1) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(SAMPLES, seed=seed_value).batch(BATCH)


class Batches(keras.utils.PyDataset):
    """Batches by index; ``fit`` shuffles their order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        part = slice(index * BATCH, (index + 1) * BATCH)
        return X[part], Y[part]


class OwnOrder(Batches):
    """Reorders its samples in ``on_epoch_end`` with its own generator, as keras.io's Sequence
    examples do; with ``get_state``/``set_state`` when ``stateful``."""

    def __init__(self, stateful: bool) -> None:
        super().__init__()
        self.rng = np.random.default_rng(4)
        self.order = np.arange(SAMPLES)
        if stateful:
            self.get_state = lambda: {"order": self.order.tolist(), "rng": self.rng.bit_generator.state}
            self.set_state = self._set_state

    def _set_state(self, state: dict[str, Any]) -> None:
        self.order = np.asarray(state["order"])
        self.rng.bit_generator.state = state["rng"]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        part = self.order[index * BATCH:(index + 1) * BATCH]
        return X[part], Y[part]

    def on_epoch_end(self) -> None:
        self.order = self.rng.permutation(SAMPLES)


def stream() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """An endless generator of random batches, seeded: the same in every session."""
    draw = np.random.default_rng(5)
    while True:
        part = draw.integers(0, SAMPLES, BATCH)
        yield X[part], Y[part]


def started(generator: Iterator[Any]) -> Iterator[Any]:
    next(generator)  # a batch looked at before run.fit
    return generator


def pipeline() -> tf.data.Dataset:
    """map with parallel calls, cache, a deterministic interleave of shuffled shards, prefetch."""
    shards = tf.data.Dataset.range(4).interleave(
        lambda i: tf.data.Dataset.from_tensor_slices((X, Y)).shard(4, i).shuffle(24, seed=2),
        cycle_length=2, num_parallel_calls=2, deterministic=True)
    return (shards.map(lambda x, y: (x * 2.0, y), num_parallel_calls=tf.data.AUTOTUNE).cache()
            .shuffle(64, seed=3).batch(BATCH).prefetch(tf.data.AUTOTUNE))


VALIDATION = {"validation_data": (X_VAL, Y_VAL)}
FLIP = keras.layers.RandomFlip("horizontal", seed=8)  # a Keras random layer in the pipeline


def flipped(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.reshape(FLIP(tf.reshape(x, (-1, 2, 2, 1)), training=True), (-1, 4)), y
CLASS_WEIGHT = {0: 1.0, 1: 2.0, 2: 0.5}


def unseeded() -> tf.data.Dataset:
    from tensorflow.python.framework import config

    # No global seed: the shuffle's seeds come from the OS (op determinism would refuse that).
    config.disable_op_determinism()
    tf.random.set_seed(None)
    try:
        return shuffled(None)
    finally:
        tf.config.experimental.enable_op_determinism()


# ----------------------------------------------------------------------------- callbacks


class Counter(keras.callbacks.Callback):
    """A user's callback with state: the batches it saw, carried across sessions by get_state/set_state."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.epochs: list[int] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches += 1

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.epochs.append(epoch)

    def get_state(self) -> dict[str, Any]:
        return {"batches": self.batches, "epochs": self.epochs, "never": float("inf")}

    def set_state(self, state: dict[str, Any]) -> None:
        assert state["never"] == float("inf")
        self.batches, self.epochs = state["batches"], list(state["epochs"])


def build_scheduled() -> keras.Model:
    model = build()
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=4, decay_rate=0.8)
    model.compile(optimizer=keras.optimizers.Adam(schedule),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def stock_callbacks(folder: Path, stopping: keras.callbacks.EarlyStopping) -> list[keras.callbacks.Callback]:
    return [stopping, keras.callbacks.CSVLogger(str(folder / "log.csv"), append=True),
            keras.callbacks.TensorBoard(str(folder / "tb"), update_freq=1, write_graph=False), Counter()]


def callbacks_seen(callbacks: list[keras.callbacks.Callback], folder: Path) -> dict[str, Any]:
    """What a case's callbacks wrote or hold, to compare with the unbroken run's."""
    counter = next(c for c in callbacks if isinstance(c, Counter))
    events = []
    for path in sorted((folder / "tb").rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                tensor = value.HasField("tensor")
                scalar = float(tf.make_ndarray(value.tensor)) if tensor else value.simple_value
                events.append([path.parent.name, value.tag, int(event.step), scalar])
    return {"csv": (folder / "log.csv").read_text(), "counter": [counter.batches, counter.epochs],
            "tensorboard": sorted(events)}


Callbacks = Callable[[Path], list[keras.callbacks.Callback]]


class Case(NamedTuple):
    arguments: Callable[[], dict[str, Any]]
    build: Callable[[], keras.Model] = build
    callbacks: Callbacks | None = None


def _callbacks(patience: int, min_delta: float, scheduler: bool) -> Callbacks:
    def make(folder: Path) -> list[keras.callbacks.Callback]:
        stopping = keras.callbacks.EarlyStopping(monitor="val_loss", patience=patience, min_delta=min_delta,
                                                 restore_best_weights=True)
        decay = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.9)
        return [*stock_callbacks(folder, stopping), *([decay] if scheduler else [])]
    return make


CASES: dict[str, Case] = {
    # fit shuffles them (its default); a validation split of shuffled arrays
    "arrays": Case(lambda: {"x": X, "y": Y, "batch_size": BATCH, "validation_split": 0.25}),
    "arrays-weights": Case(lambda: {"x": X, "y": Y, "batch_size": BATCH, "sample_weight": W, **VALIDATION}),
    "arrays-class-weight": Case(lambda: {"x": X, "y": Y, "batch_size": BATCH, "class_weight": CLASS_WEIGHT}),
    # a shuffled validation dataset too
    "tf.data-shuffle": Case(lambda: {
        "x": shuffled(), "validation_data": tf.data.Dataset.from_tensor_slices((X_VAL, Y_VAL)).shuffle(
            32, seed=7).batch(8)}),
    "tf.data-repeat": Case(lambda: {"x": shuffled().repeat(), "steps_per_epoch": 5, **VALIDATION}),
    "tf.data-pipeline": Case(lambda: {"x": pipeline(), "class_weight": CLASS_WEIGHT}),
    "pydataset-threads": Case(lambda: {"x": Batches(workers=2), **VALIDATION}),
    "pydataset-processes": Case(lambda: {"x": Batches(workers=2, use_multiprocessing=True)}),
    "pydataset-state": Case(lambda: {"x": OwnOrder(stateful=True), "shuffle": False}),
    "generator": Case(lambda: {"x": stream(), "steps_per_epoch": 6, **VALIDATION}),
    # EarlyStopping (never stopping; then stopping after epoch 2), CSVLogger, TensorBoard, a callback of
    # one's own, and a LearningRateScheduler; then a learning-rate schedule in the optimizer
    "callbacks": Case(lambda: {"x": X, "y": Y, "batch_size": BATCH, **VALIDATION}, build,
                      _callbacks(patience=10, min_delta=0.0, scheduler=True)),
    "callbacks-stopped": Case(lambda: {"x": X, "y": Y, "batch_size": BATCH, **VALIDATION}, build_scheduled,
                              _callbacks(patience=1, min_delta=10.0, scheduler=False)),
    # said, not exact:
    "tf.data-unseeded": Case(lambda: {"x": unseeded()}),
    "tf.data-random-layer": Case(lambda: {"x": shuffled().map(flipped)}),
    "tf.data-fewer-steps": Case(lambda: {"x": shuffled(), "steps_per_epoch": 4}),
    "pydataset-own-order": Case(lambda: {"x": OwnOrder(stateful=False), "shuffle": False}),
    "generator-started": Case(lambda: {"x": started(stream()), "steps_per_epoch": 6}),
}


def run_case(name: str, phase: str, out: Path) -> dict[str, Any]:
    kind = phase.split("-")[-1] if phase != "unbroken" else "unbroken"
    url = str(out / f"{name}-{kind}")
    folder = out / f"{name}-{kind}-files"
    folder.mkdir(exist_ok=True)
    case = CASES[name]
    report: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seed(2)
        run = resumable.resume(url, build_model=case.build, keep_last=None)
        seed(3)  # what fit draws (shuffles, dropout) comes from here, or from the checkpoint
        callbacks = case.callbacks(folder) if case.callbacks else []
        if phase == "stop-batch":
            callbacks.append(InterruptAt(STOP_EPOCH, STOP_BATCH))
        epochs = STOP_EPOCH if phase == "stop-epoch" else EPOCHS
        try:
            run.fit(**case.arguments(), epochs=epochs, verbose=0, callbacks=callbacks)
        except KeyboardInterrupt:
            assert phase == "stop-batch"
        report["history"] = run.history
        if case.callbacks and phase != "stop-batch":
            report["callbacks"] = callbacks_seen(callbacks, folder)
        if case.callbacks and phase.startswith("resume"):
            # "Run all" once more: the run is over, and the model must be as it ended
            again = resumable.resume(url, build_model=case.build)
            output = io.StringIO()
            with contextlib.redirect_stdout(output):
                again.fit(**case.arguments(), epochs=EPOCHS, callbacks=case.callbacks(folder))
            report["rerun"] = output.getvalue()
            np.savez(out / f"{name}-{phase}-rerun.npz", *[np.asarray(w) for w in again.model.get_weights()])
    report["warnings"] = [str(w.message) for w in caught if "resumable" in str(w.message)]
    np.savez(out / f"{name}-{phase}.npz", *[np.asarray(w) for w in run.model.get_weights()])
    return report


PHASES = {"unbroken": ["unbroken"], "stop": ["stop-epoch", "stop-batch"],
          "resume": ["resume-epoch", "resume-batch"]}


def main(argv: list[str]) -> int:
    phase, out = argv[0], Path(argv[1])
    names = argv[2:] or list(CASES)
    tf.config.experimental.enable_op_determinism()
    for name in names:
        for step in PHASES.get(phase, [phase]):
            started = time.monotonic()
            try:
                report = run_case(name, step, out)
                status = "ok"
            except BaseException as e:  # noqa: BLE001 - reported per case; the other cases go on
                report = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                status = "error"
            (out / f"{name}-{step}.json").write_text(json.dumps(report, default=str))
            print(f"CASE {name} {step} {status} {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
