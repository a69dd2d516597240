"""An unbroken `run.fit` trains exactly as a plain ``model.fit`` with the same arguments, and a
run.fit stopped at an epoch end and resumed (a fresh ``resume()`` in this process, the input
built anew as a new session's notebook would) ends with the same weights too (#52).

Each case sets the same seed before building the model and the input, with op determinism on
TensorFlow, and compares the weights bitwise.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from fit_interrupts import InterruptAt  # noqa: E402
from keras_helpers import assert_equal_weights  # noqa: E402

import resumable  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.lanes]  # the replay models how each Keras creates iterators

SEED = 7
EPOCHS = 3
STOP_AT = 2  # the resumed run's first session ends after this epoch
SAMPLES, BATCH = 24, 4


@pytest.fixture(autouse=True)
def deterministic_ops() -> None:
    tf.config.experimental.enable_op_determinism()


def make_model() -> Any:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 3)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.5).astype("float32")


def tensors() -> Any:
    return tf.data.Dataset.from_tensor_slices(arrays())


class SelfShuffling(keras.utils.PyDataset):
    """Reorders its batches in on_epoch_end, from an RNG of its own, with get_state/set_state."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.y = arrays()
        self.rng = np.random.default_rng(3)
        self.order = np.arange(SAMPLES)

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        picked = self.order[i * BATCH:(i + 1) * BATCH]
        return self.x[picked], self.y[picked]

    def on_epoch_end(self) -> None:
        self.order = self.rng.permutation(SAMPLES)

    def get_state(self) -> Any:
        return {"rng": self.rng.bit_generator.state, "order": self.order.tolist()}

    def set_state(self, state: Any) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.order = np.asarray(state["order"])


class Threaded(keras.utils.PyDataset):
    """Read by Keras' worker threads, shuffled by fit."""

    def __init__(self) -> None:
        super().__init__(workers=2)
        self.x, self.y = arrays()

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[i * BATCH:(i + 1) * BATCH], self.y[i * BATCH:(i + 1) * BATCH]


def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    x, y = arrays()
    rng = np.random.default_rng(5)
    while True:
        picked = rng.choice(SAMPLES, BATCH, replace=False)
        yield x[picked], y[picked]


def six_batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    yield from itertools.islice(batches(), SAMPLES // BATCH)


def batches_to_the_stop() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Exactly the batches of the first session's epochs: a new session's, brought to the
    checkpoint, has none left (an unbroken fit runs out at the next epoch and stops)."""
    yield from itertools.islice(batches(), STOP_AT * 4)


def noisy(x: Any, y: Any) -> tuple[Any, Any]:
    return x + tf.random.uniform(tf.shape(x)) * 0.1, y  # no op seed: from the global seed


def pipeline() -> Any:
    """A deterministic parallel interleave of shuffled shards, a parallel map, cache, prefetch."""
    x, y = arrays()
    shards = tf.data.Dataset.range(4).interleave(
        lambda i: tf.data.Dataset.from_tensor_slices((x, (y > 0).astype("float32"))).shard(4, i)
        .shuffle(8, seed=2), cycle_length=2, num_parallel_calls=2, deterministic=True)
    return (shards.map(lambda a, b: (a * 2.0, b), num_parallel_calls=tf.data.AUTOTUNE).cache()
            .shuffle(SAMPLES, seed=3).batch(BATCH).prefetch(tf.data.AUTOTUNE))


# name: (the input, built after the model; model.fit's other arguments)
CASES: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "tf.data reshuffling": (lambda: tensors().shuffle(SAMPLES, seed=1).batch(BATCH), {}),
    "tf.data in order": (lambda: tensors().batch(BATCH), {}),
    "tf.data repeat, steps_per_epoch": (
        lambda: tensors().shuffle(SAMPLES, seed=1).batch(BATCH).repeat(), {"steps_per_epoch": 5}),
    "tf.data random map, op determinism": (
        lambda: tensors().shuffle(SAMPLES, seed=1).map(noisy, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH), {}),
    "tf.data pipeline, class_weight": (pipeline, {"class_weight": {0: 1.0, 1: 2.0}}),
    "tf.data random map, repeat, steps_per_epoch": (
        lambda: tensors().shuffle(SAMPLES, seed=1).map(noisy, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH).repeat(), {"steps_per_epoch": 5}),
    "PyDataset shuffling in on_epoch_end": (SelfShuffling, {}),  # and fit's shuffle=True
    "PyDataset shuffling in on_epoch_end, shuffle=False": (SelfShuffling, {"shuffle": False}),
    "PyDataset shuffling in on_epoch_end, steps_per_epoch below its length": (
        SelfShuffling, {"steps_per_epoch": 4}),  # 6 batches; each epoch reads the first 4
    "PyDataset shuffling in on_epoch_end, steps_per_epoch below its length, shuffle=False": (
        SelfShuffling, {"steps_per_epoch": 4, "shuffle": False}),
    "PyDataset with workers": (Threaded, {}),
    "generator ending, steps_per_epoch below its length": (six_batches, {"steps_per_epoch": 4}),
    "tf.data without repeat, steps_per_epoch below its length": (
        lambda: tensors().shuffle(SAMPLES, seed=1).batch(BATCH), {"steps_per_epoch": 4}),
    "generator": (batches, {"steps_per_epoch": 4}),
    "generator ending at the checkpoint": (batches_to_the_stop, {"steps_per_epoch": 4}),
    "arrays, shuffle=True": (arrays, {"batch_size": BATCH, "shuffle": True}),
    "tf.data validation": (
        lambda: tensors().shuffle(SAMPLES, seed=1).batch(BATCH),
        {"validation_data": "shuffled"}),
}


def fit_arguments(make_input: Callable[[], Any],
                  extra: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments of the fit, the input built now."""
    data = make_input()
    args = data if isinstance(data, tuple) else (data,)
    kwargs = dict(extra)
    if kwargs.get("validation_data") == "shuffled":
        kwargs["validation_data"] = tensors().shuffle(SAMPLES, seed=2).batch(BATCH)
    return args, kwargs


def with_model_fit(case: str) -> list[np.ndarray]:
    make_input, extra = CASES[case]
    keras.utils.set_random_seed(SEED)
    model = make_model()
    args, kwargs = fit_arguments(make_input, extra)
    model.fit(*args, epochs=EPOCHS, verbose=0, **kwargs)
    return model.get_weights()


def with_run_fit(case: str, folder: Path, epochs: int,
                 callbacks: list[Any] | None = None) -> list[np.ndarray]:
    make_input, extra = CASES[case]
    keras.utils.set_random_seed(SEED)
    run = resumable.resume(str(folder), build_model=make_model)
    args, kwargs = fit_arguments(make_input, extra)
    run.fit(*args, epochs=epochs, verbose=0, callbacks=callbacks, **kwargs)
    return run.model.get_weights()


# Cases that still differ from model.fit, and why.
DIFFERS: dict[str, str] = {}


# On JAX and torch, model.fit reads a batch to build the model; with workers that leaves Keras' queue
# a batch behind for the whole fit (each epoch starts with the previous pass's batches). run.fit
# builds the model first: each epoch reads its own pass, which a resumed run can read again.
WORKERS_BEHIND = ("model.fit's build read leaves Keras' worker queue a batch behind (JAX, torch); "
                  "run.fit says so")


# Cases a resumed run.fit reads otherwise than model.fit, and why (an unbroken one is exact).
RESUMED_DIFFERS: dict[str, str] = {
    "generator ending, steps_per_epoch below its length": (
        "once a finite generator runs out, Keras reads again the batches it looked at first (13 steps "
        "on 6 batches in 4 epochs); a new session's generator, brought to its end, has none"),
    "tf.data without repeat, steps_per_epoch below its length": (
        "resumable replays whole passes of a tf.data.Dataset, and a resumed run.fit says so"),
}


def differs(case: str, resumed: bool = False) -> str | None:
    if case == "PyDataset with workers" and keras.backend.backend() != "tensorflow":
        return WORKERS_BEHIND
    return (RESUMED_DIFFERS.get(case) if resumed else None) or DIFFERS.get(case)


def cases(resumed: bool = False) -> list[Any]:
    return [pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=why))
            if (why := differs(case, resumed)) is not None else case for case in CASES]


@pytest.mark.parametrize("case", cases())
def test_an_unbroken_run_fit_trains_as_model_fit(case: str, tmp_path: Path) -> None:
    expected = with_model_fit(case)
    assert_equal_weights(with_run_fit(case, tmp_path / "run", EPOCHS), expected, f"{case}, unbroken")


@pytest.mark.parametrize("case", cases(resumed=True))
def test_a_resumed_run_fit_ends_as_model_fit(case: str, tmp_path: Path) -> None:
    expected = with_model_fit(case)
    with_run_fit(case, tmp_path / "run", STOP_AT)
    assert_equal_weights(with_run_fit(case, tmp_path / "run", EPOCHS), expected, f"{case}, resumed")


def test_a_resumed_run_fit_whose_generator_ended_at_the_checkpoint_says_so_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with_run_fit("generator ending at the checkpoint", tmp_path / "run", STOP_AT)
    capsys.readouterr()
    run = resumable.resume(str(tmp_path / "run"), build_model=make_model)
    history = run.fit(batches_to_the_stop(), epochs=EPOCHS, steps_per_epoch=4, verbose=1)
    out = capsys.readouterr().out
    said = f"(generator batches_to_the_stop()) ended at the checkpoint, after {STOP_AT * 4} batches: nothing"
    assert out.count(said) == 1 and "Epoch" not in out, out  # one line, no epoch begun
    assert history.history == {}


# Inputs whose order an epoch draws: Ctrl-C three batches into the second epoch, then a resume.
# With steps_per_epoch below a PyDataset's length, its pass spans epochs (4 batches, then 2): Ctrl-C
# inside the short epoch, and three batches into the first (the resumed fit then starts mid-pass).
BELOW = "PyDataset shuffling in on_epoch_end, steps_per_epoch below its length"
MID_EPOCH = [(case, 1, 3) for case in ("tf.data reshuffling", "PyDataset shuffling in on_epoch_end",
                                       "arrays, shuffle=True")] + [(BELOW, 1, 1), (BELOW, 0, 3)]


@pytest.mark.parametrize(("case", "epoch", "batch"), MID_EPOCH)
def test_a_run_fit_resumed_mid_epoch_ends_as_model_fit(case: str, epoch: int, batch: int,
                                                       tmp_path: Path) -> None:
    expected = with_model_fit(case)
    with pytest.raises(KeyboardInterrupt):
        with_run_fit(case, tmp_path / "run", EPOCHS, callbacks=[InterruptAt(epoch=epoch, batch=batch)])
    assert_equal_weights(with_run_fit(case, tmp_path / "run", EPOCHS), expected, f"{case}, resumed mid-epoch")


def test_run_fit_says_where_it_reads_a_pydataset_otherwise_than_model_fit(tmp_path: Path) -> None:
    keras.utils.set_random_seed(SEED)
    run = resumable.resume(str(tmp_path / "run"), build_model=make_model)
    with pytest.warns(UserWarning) as caught:
        run.fit(Threaded(), epochs=1, verbose=0)
    said = [str(w.message) for w in caught if "as a plain model.fit would not" in str(w.message)]
    if keras.backend.backend() == "tensorflow":  # its fit reads no batch to build the model
        assert said == []
    else:
        assert len(said) == 1 and "PyDataset Threaded" in said[0] and "\n" not in said[0]


def test_a_resumed_run_fit_says_it_cannot_refill_keras_worker_queue(tmp_path: Path) -> None:
    """With workers and steps_per_epoch below the length, Keras' worker queue carries batches read
    in one epoch into later passes, as many as its threads got to (model.fit itself then differs
    from run to run); a new session starts with an empty queue, and says so."""
    def fit(epochs: int) -> None:
        keras.utils.set_random_seed(SEED)
        run = resumable.resume(str(tmp_path / "run"), build_model=make_model)
        run.fit(Threaded(), epochs=epochs, steps_per_epoch=4, verbose=0)

    fit(STOP_AT)
    with pytest.warns(UserWarning) as caught:
        fit(EPOCHS)
    said = [str(w.message) for w in caught if "cannot refill" in str(w.message)]
    assert len(said) == 1 and "PyDataset Threaded" in said[0] and "steps_per_epoch=4" in said[0]


def test_a_resumed_run_fit_says_it_replays_whole_passes_of_a_dataset(tmp_path: Path) -> None:
    case = "tf.data without repeat, steps_per_epoch below its length"
    with_run_fit(case, tmp_path / "run", STOP_AT)
    with pytest.warns(UserWarning) as caught:
        with_run_fit(case, tmp_path / "run", EPOCHS)
    said = [str(w.message) for w in caught if "cannot be replayed exactly" in str(w.message)]
    assert len(said) == 1 and "steps_per_epoch=4 is less than its 6 batches" in said[0]
