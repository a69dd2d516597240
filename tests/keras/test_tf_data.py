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

from resumable.keras import tf_data  # noqa: E402


def order(dataset: Any) -> list[list[int]]:
    return [batch.numpy().tolist() for batch in dataset]


def shuffled() -> Any:
    return tf.data.Dataset.range(12).shuffle(12, seed=1).batch(4)


def read_as_keras(passes: tf_data.Passes, epochs: int) -> list[list[list[int]]]:
    """Each epoch: the pass brought to its slot, read once; then an iterator Keras makes and never
    reads (at each epoch end, and once to build the model)."""
    wrapper = passes.wrapper()
    iter(wrapper)
    orders = []
    for epoch in range(epochs):
        assert passes.bring_to(passes.slot(epoch, "x"))
        orders.append(order(wrapper))
        iter(wrapper)
    return orders


def test_a_fresh_dataset_brought_to_an_epoch_reads_that_epoch_s_order() -> None:
    unbroken = read_as_keras(tf_data.Passes(shuffled()), 5)
    assert len({str(o) for o in unbroken}) == 5  # each epoch its own order

    for epoch in range(5):
        resumed = tf_data.Passes(shuffled())
        resumed.bring_to(resumed.slot(epoch, "x"))
        assert order(resumed.wrapper()) == unbroken[epoch]
        mid = tf_data.Passes(shuffled())
        mid.bring_to(mid.slot(epoch, "x"))
        assert order(mid.wrapper(skip=2)) == unbroken[epoch][2:]


def test_a_pass_read_to_build_the_model_takes_the_spare_slot() -> None:
    unbroken = read_as_keras(tf_data.Passes(shuffled()), 3)
    resumed = tf_data.Passes(shuffled())
    next(iter(resumed.wrapper()))  # JAX's fit reads a batch of an unbuilt model's input
    assert resumed.iterators == 1
    resumed.bring_to(resumed.slot(2, "x"))
    assert order(resumed.wrapper()) == unbroken[2]


def test_training_and_validation_on_one_dataset_get_slots_of_their_own() -> None:
    passes = tf_data.Passes(shuffled())
    passes.add_role("x")
    passes.add_role("validation_data")
    assert [passes.slot(3, "x"), passes.slot(3, "validation_data"), passes.slot(4, "x")] == [14, 16, 18]


def test_a_dataset_read_past_the_slot_says_so() -> None:
    passes = tf_data.Passes(shuffled())
    read_as_keras(passes, 2)
    assert not passes.bring_to(passes.slot(0, "x"))


@pytest.mark.parametrize(("dataset", "count"), [
    (lambda: tf.data.Dataset.range(12).batch(4), 3),
    (lambda: tf.data.Dataset.range(12).batch(4).repeat(), tf_data.INFINITE),
    (lambda: tf.data.Dataset.range(12).filter(lambda x: x > 2).batch(4), tf_data.UNKNOWN),
])
def test_the_wrapper_keeps_the_dataset_s_length(dataset: Callable[[], Any], count: int) -> None:
    passes = tf_data.Passes(dataset())
    assert tf_data.cardinality(passes.wrapper()) == count
    assert tf_data.cardinality(passes.wrapper(skip=1)) == (count - 1 if count >= 0 else count)


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
