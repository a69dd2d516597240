"""tf.data replay in one process: each epoch's pass and a stream's position, and what is said.

A dataset read as Keras reads it, through `tf_data.Passes` and `tf_data.Stream`, against a fresh
one brought to the same epoch or batch: the same batches in the same order. The end-to-end
check, in new processes with real training, is tests/keras/test_inputs.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from resumable.keras.replay import tf_data  # noqa: E402


def order(dataset: Any) -> list[list[int]]:
    return [batch.numpy().tolist() for batch in dataset]


def shuffled() -> Any:
    return tf.data.Dataset.range(12).shuffle(12, seed=1).batch(4)


def read_as_keras(passes: tf_data.Passes, epochs: int, build_read: bool = False) -> list[list[list[int]]]:
    """As Keras' epoch iterator reads the dataset: each epoch a new iterator, read to its end, and
    one more it creates then and never reads (and first one to build the model, on JAX)."""
    if build_read:
        passes.bring_to(passes.slot(0, "x"))
    orders = []
    for epoch in range(epochs):
        assert passes.bring_to(passes.slot(epoch, "x"))
        passes.pass_begins()
        orders.append(order(passes.for_fit()))
        iter(passes.dataset)
        passes.settle()
    return orders


def plain_keras(dataset: Any, epochs: int) -> list[list[list[int]]]:
    """The orders a plain model.fit on TensorFlow reads: iterators 1, 3, 5, ..."""
    orders = []
    for _ in range(epochs):
        orders.append(order(dataset))
        iter(dataset)
    return orders


def test_each_epoch_reads_the_order_a_plain_fit_reads() -> None:
    expected = plain_keras(shuffled(), 4)
    assert len({str(o) for o in expected}) == 4  # each epoch its own order
    assert read_as_keras(tf_data.Passes(shuffled()), 4) == expected


def test_a_fresh_dataset_brought_to_an_epoch_reads_that_epoch_s_order() -> None:
    unbroken = read_as_keras(tf_data.Passes(shuffled()), 5)
    for epoch in range(5):
        resumed = tf_data.Passes(shuffled())
        resumed.bring_to(resumed.slot(epoch, "x"))
        assert order(resumed.for_fit()) == unbroken[epoch]
        mid = tf_data.Passes(shuffled())
        mid.bring_to(mid.slot(epoch, "x"))
        assert order(mid.for_fit(skip=2)) == unbroken[epoch][2:]


def test_the_iterator_a_build_reads_comes_first() -> None:
    unbroken = read_as_keras(tf_data.Passes(shuffled(), build_reads=1), 3, build_read=True)
    plain = shuffled()
    iter(plain)  # JAX's fit creates an iterator to build the model first
    assert unbroken == plain_keras(plain, 3)
    resumed = tf_data.Passes(shuffled(), build_reads=1)
    resumed.bring_to(resumed.slot(2, "x"))
    assert order(resumed.for_fit()) == unbroken[2]


def test_training_and_validation_on_one_dataset_get_slots_of_their_own() -> None:
    passes = tf_data.Passes(shuffled())
    passes.add_role("x")
    passes.add_role("validation_data")
    assert [passes.slot(3, "x"), passes.slot(3, "validation_data"), passes.slot(4, "x")] == [13, 15, 17]


def test_a_dataset_of_unknown_length_counts_as_keras_does() -> None:
    passes = tf_data.Passes(tf.data.Dataset.range(12).filter(lambda x: x > 2).batch(4))
    # each pass ends by running out of data: Keras creates no iterator at its end
    assert [passes.slot(e, "x") for e in range(3)] == [1, 2, 3]


def test_a_dataset_read_past_the_slot_says_so() -> None:
    passes = tf_data.Passes(shuffled())
    read_as_keras(passes, 2)
    assert not passes.bring_to(passes.slot(0, "x"))


def test_a_stream_continues_at_its_position_across_fits() -> None:
    def stream() -> Any:
        return shuffled().repeat()

    reference = iter(stream())
    unbroken = [next(reference).numpy().tolist() for _ in range(14)]
    resumed = tf_data.Stream(stream(), position=5)
    first_fit = order(resumed.wrapper(limit=4))  # the rest of an epoch: never more than it trains on
    assert resumed.pulled == 4
    second_fit = iter(resumed.wrapper())
    assert first_fit + [next(second_fit).numpy().tolist() for _ in range(5)] == unbroken[5:14]


@contextlib.contextmanager
def without_a_seed() -> Iterator[None]:
    """No global seed, and op determinism off (which refuses unseeded random ops) while inside."""
    from tensorflow.python.framework import config

    determinism = config.is_op_determinism_enabled()
    config.disable_op_determinism()
    tf.random.set_seed(None)
    try:
        yield
    finally:
        if determinism:
            tf.config.experimental.enable_op_determinism()


def flip() -> Callable[[Any], Any]:
    layer = keras.layers.RandomFlip("horizontal", seed=2)
    return lambda x: layer(tf.reshape(tf.cast(x, "float32"), (-1, 2, 2, 1)), training=True)


UNSEEDED = {
    "shuffle": (lambda: tf.data.Dataset.range(8).shuffle(8), "its .shuffle() has no seed: pass seed= to it"),
    "shuffle-in-interleave": (
        lambda: tf.data.Dataset.range(2).interleave(lambda i: tf.data.Dataset.range(4).shuffle(4)),
        "a dataset built inside one of its functions (interleave, flat_map) shuffles without a seed"),
    "random-in-map": (lambda: tf.data.Dataset.range(4).map(lambda x: tf.random.uniform([])),
                      "a function in it (RandomUniform) draws random numbers without a seed"),
    "sample-from-datasets": (
        lambda: tf.data.Dataset.sample_from_datasets([tf.data.Dataset.range(3), tf.data.Dataset.range(3)]),
        "it draws random choices without a seed (RandomDataset)"),
}
SAID = {
    "keras-random-layer": (lambda: tf.data.Dataset.range(8).batch(4).map(flip()),
                           "a function in it changes a variable (a Keras random layer such as RandomFlip"),
    "nondeterministic-map": (
        lambda: tf.data.Dataset.range(8).map(lambda x: x, num_parallel_calls=2, deterministic=False),
        "it trades order for speed (deterministic=False)"),
    "options-nondeterministic": (lambda: tf.data.Dataset.range(8).with_options(nondeterministic()),
                                 "it trades order for speed (deterministic=False)"),
    "cache-after-shuffle": (lambda: tf.data.Dataset.range(8).shuffle(8, seed=1).cache(),
                            "its .cache() comes after a .shuffle() that reshuffles each epoch"),
}
REPLAYABLE = {
    "seeded-shuffle": lambda: shuffled(),
    "cache-then-shuffle": lambda: tf.data.Dataset.range(8).cache().shuffle(8, seed=1),
    "cache-after-fixed-shuffle": lambda: tf.data.Dataset.range(8).shuffle(
        8, seed=1, reshuffle_each_iteration=False).cache(),
    "seeded-shuffle-in-interleave": lambda: tf.data.Dataset.range(2).interleave(
        lambda i: tf.data.Dataset.range(4).shuffle(4, seed=2), num_parallel_calls=2, deterministic=True),
    "seeded-random-in-map": lambda: tf.data.Dataset.range(4).map(lambda x: tf.random.uniform([], seed=3)),
    "parallel-map": lambda: tf.data.Dataset.range(8).map(lambda x: x * 2,
                                                         num_parallel_calls=tf.data.AUTOTUNE),
}


def nondeterministic() -> Any:
    options = tf.data.Options()
    options.deterministic = False
    return options


@pytest.mark.parametrize(("make", "said"), UNSEEDED.values(), ids=UNSEEDED.keys())
def test_an_unseeded_random_choice_is_said_with_what_to_do(make: Callable[[], Any], said: str) -> None:
    with without_a_seed():
        dataset = make()
    problem = tf_data.problem(dataset)
    assert problem is not None and said in problem
    assert problem.endswith("or call keras.utils.set_random_seed(...) before building the dataset")


@pytest.mark.parametrize(("make", "said"), SAID.values(), ids=SAID.keys())
def test_what_no_replay_gives_back_is_said(make: Callable[[], Any], said: str) -> None:
    keras.utils.set_random_seed(1)
    problem = tf_data.problem(make())
    assert problem is not None and said in problem


@pytest.mark.parametrize("make", REPLAYABLE.values(), ids=REPLAYABLE.keys())
def test_a_seeded_pipeline_is_replayable(make: Callable[[], Any]) -> None:
    with without_a_seed():
        dataset = make()
    assert tf_data.problem(dataset) is None


def test_an_unseeded_shuffle_built_after_a_global_seed_is_replayable() -> None:
    def session() -> tuple[str | None, list[list[int]]]:
        keras.utils.set_random_seed(5)  # the op seed then comes from the global one
        dataset = tf.data.Dataset.range(8).shuffle(8).batch(8)
        return tf_data.problem(dataset), order(dataset)

    first, again = session(), session()
    assert first[0] is None and first == again
