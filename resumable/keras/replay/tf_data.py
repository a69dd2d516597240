"""Replaying a ``tf.data.Dataset`` in a resumed run: the order an unbroken run would have had.

A seeded ``shuffle`` (``reshuffle_each_iteration=True``, the default) draws new seeds each time
an iterator of the dataset is created: epoch k of a run is the k-th iterator's order. A new
session builds the dataset anew, at its first order, so a resumed run must create as many
iterators as the unbroken run had before the resumed epoch. Creating one without reading from
it costs well under a millisecond (a few with parallel ``interleave``): nothing is read.

Two ways Keras reads a dataset, and one replay for each:

- **Passes** (no ``steps_per_epoch``, or one the dataset's batches do not exceed): Keras reads
  one pass per epoch. ``model.fit`` gets the dataset itself, so it runs the ops a plain
  ``model.fit`` runs, and creates the iterators a plain ``model.fit`` creates: two per pass on
  TensorFlow (the second, at the pass's end, never read), one on JAX and torch, and there one
  more first, to build the model.
  `Passes` counts them, and before each epoch (and each validation) creates the ones an
  unbroken run created before it that this session has not (a new session's dataset: all of
  them). Mid-epoch, the resumed epoch's pass skips the batches already trained (read, not
  trained: the cost of a mid-epoch resume is reading part of one epoch).
- **Stream** (``.repeat()`` or an unknown length, with ``steps_per_epoch``): Keras reads one
  iterator across all epochs. `Stream` creates that iterator itself, positioned at the batch
  the checkpoint was taken at (by reading the batches before it: the cost of resuming a stream
  is reading every batch since the run started), and every ``model.fit`` of `Run.fit` reads
  from it, the rest of a mid-epoch checkpoint's epoch and the epochs after.

`problem` says, before a resumed run trains, what in a pipeline no replay can give back.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from resumable.keras import compat
from resumable.keras.compat import tf_data_internals

logger = logging.getLogger("resumable")

SEED_HINT = "pass seed= to it, or call keras.utils.set_random_seed(...) before building the dataset"


def problem(dataset: Any) -> str | None:
    """Why a resumed run cannot be given this dataset's order, in words ending with what to change;
    None when every random choice in it is seeded."""
    stages = tf_data_internals.stages(dataset)
    ops = tf_data_internals.function_ops(dataset)
    if stages is None or ops is None:
        return ("resumable cannot look inside this TensorFlow's tf.data pipelines to check that every "
                "shuffle is seeded; upgrade resumable, or check it yourself")
    if any(s.nondeterministic for s in stages) or dataset.options().deterministic is False:
        return "it trades order for speed (deterministic=False): drop that for an exact resume"
    for stage in stages:
        if stage.seeds == (0, 0) and "Shuffle" in stage.kind:
            return f"its .shuffle() has no seed: {SEED_HINT}"
        if stage.seeds == (0, 0):
            return f"it draws random choices without a seed ({stage.kind.strip('_')}): {SEED_HINT}"
        if stage.memory_cache and _reshuffles_below(stages, stage):
            return ("its .cache() comes after a .shuffle() that reshuffles each epoch, so every epoch "
                    "repeats the first epoch's order: cache before shuffling for an exact resume")
    for op in ops:
        if tf_data_internals.is_shuffle(op) and op.seeds == (0, 0):
            return ("a dataset built inside one of its functions (interleave, flat_map) shuffles "
                    f"without a seed: {SEED_HINT}")
        if tf_data_internals.is_random(op) and op.seeds == (0, 0):
            return f"a function in it ({op.type}) draws random numbers without a seed: {SEED_HINT}"
        if tf_data_internals.changes_a_variable(op):
            return ("a function in it changes a variable (a Keras random layer such as RandomFlip, "
                    "or a tf.random.Generator), whose state is not saved: apply those layers inside "
                    "the model instead (their state is then saved)")
    return None


def reshuffles(dataset: Any) -> bool:
    """True when the dataset's order may change from one iterator to the next (a shuffle or a
    random choice reshuffling each iteration, also inside its functions); True when it cannot
    be told."""
    stages = tf_data_internals.stages(dataset)
    ops = tf_data_internals.function_ops(dataset)
    if stages is None or ops is None:
        return True
    return any(s.reshuffles for s in stages) or any(tf_data_internals.is_shuffle(op) for op in ops)


def _reshuffles_below(stages: list[tf_data_internals.Stage], top: tf_data_internals.Stage) -> bool:
    pending = list(top.below)
    seen: set[int] = set()
    while pending:
        i = pending.pop()
        if i in seen:
            continue
        seen.add(i)
        if stages[i].reshuffles:
            return True
        pending.extend(stages[i].below)
    return False


def cardinality(dataset: Any) -> int:
    """Batches per pass: a count, or `INFINITE` (-1) or `UNKNOWN` (-2) as TensorFlow says them."""
    return int(dataset.cardinality())


INFINITE = -1
UNKNOWN = -2


class Passes:
    """One dataset read a pass per epoch, across this session's `Run.fit` calls.

    ``model.fit`` gets the dataset itself (its ops and Keras' iterators as a plain ``model.fit``
    has them), so the iterators Keras creates are counted from what its epoch iterator does
    (`compat.dataset_iterators_per_pass`), not observed. ``roles`` counts the uses of the dataset in one epoch
    (training, validation: the same object can be both); ``build_reads`` the iterators a plain
    ``model.fit`` creates to build the model before its first epoch (one on JAX and torch, where
    `Run.fit` builds it without reading: the iterator is created here instead).
    """

    def __init__(self, dataset: Any, build_reads: int = 0, tensorflow: bool = True) -> None:
        self.dataset = dataset
        self.known = cardinality(dataset) >= 0
        self.build_reads = build_reads
        self.tensorflow = tensorflow  # Keras' TF epoch iterator; the others create iterators lazily
        self.iterators = 0  # created in this session: here, and by Keras as counted
        self._ending = 0  # the iterator Keras creates when the pass begun is read to its end
        self.roles: list[str] = []

    def add_role(self, role: str) -> None:
        """``role`` reads this dataset each epoch (roles are added in the order fit reads them)."""
        if role not in self.roles:
            self.roles.append(role)

    def slot(self, epoch: int, role: str) -> int:
        """The iterator (1-based, counting from the dataset's creation) that ``role`` reads in
        ``epoch`` of an unbroken ``model.fit``."""
        self.add_role(role)
        per_pass = compat.dataset_iterators_per_pass(self.known, self.tensorflow)
        return self.build_reads + per_pass * (len(self.roles) * epoch + self.roles.index(role)) + 1

    def bring_to(self, slot: int) -> bool:
        """Create (and drop) iterators until the next one is ``slot``; False when it is past that."""
        self.settle()
        missing = slot - 1 - self.iterators
        for _ in range(max(missing, 0)):
            iter(self.dataset)
        self.iterators += max(missing, 0)
        return missing >= 0

    def pass_begins(self) -> None:
        """Keras creates the iterator of a pass now, and may create one more at the pass's end."""
        self.iterators += 1
        self._ending = compat.dataset_iterators_per_pass(self.known, self.tensorflow) - 1

    def settle(self) -> None:
        """The pass begun was read to its end: Keras created its ending iterator."""
        self.iterators += self._ending
        self._ending = 0

    def abandon(self) -> None:
        """The fit ended (an interrupt may have cut the pass short): no ending iterator is counted."""
        self._ending = 0

    def for_fit(self, skip: int = 0) -> Any:
        """What ``model.fit`` reads: the dataset itself, or without the first ``skip`` batches of
        each pass (a mid-epoch resume; the ``skip`` shares the dataset's shuffle seeds)."""
        return self.dataset.skip(skip) if skip else self.dataset


class Stream:
    """One dataset Keras reads as a single stream across epochs (``steps_per_epoch``).

    `Run.fit` reads every batch from one iterator, created here and positioned at ``position``
    by reading (not training) the batches before it; ``consumed`` counts the batches the fits
    took since, as Keras reports them.
    """

    def __init__(self, dataset: Any, position: int, build_reads: int = 0) -> None:
        import tensorflow as tf

        self.dataset = dataset
        for _ in range(build_reads):  # the iterator JAX's and torch's fit create to build the model
            iter(dataset)
        self.start = position
        with tf.init_scope():
            self._pulled = tf.Variable(0, dtype=tf.int64, trainable=False, name="resumable_stream_pulled")
        self._iterator = iter(dataset.skip(position) if position else dataset)
        self.consumed = 0

    @property
    def position(self) -> int:
        """Batches of the stream trained on, from the run's start."""
        return self.start + self.consumed

    @property
    def pulled(self) -> int:
        """Batches read from the iterator so far (prefetching reads ahead of training)."""
        return int(self._pulled.numpy())

    def wrapper(self, limit: int | None = None) -> Any:
        """What one ``model.fit`` reads: the stream's next batches, at most ``limit`` of them (so a
        fit of the rest of an epoch never reads ahead into what the next fit trains on)."""
        import tensorflow as tf

        iterator = self._iterator
        pulled = self._pulled

        def next_batch(_: Any) -> Any:
            with tf.control_dependencies([pulled.assign_add(1)]):
                return iterator.get_next()

        count = -1 if limit is None else limit
        wrapped = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat(count).map(next_batch)
        return wrapped.with_options(self.dataset.options())


class Registry:
    """What this session did with each dataset object: a dataset given to `Run.fit` again continues
    from where it stands; one never seen is taken as fresh (built, and read only by the notebook's
    own code, as in every session)."""

    def __init__(self) -> None:
        self.passes: weakref.WeakKeyDictionary[Any, Passes] = weakref.WeakKeyDictionary()
        self.streams: weakref.WeakKeyDictionary[Any, Stream] = weakref.WeakKeyDictionary()

    def passes_of(self, dataset: Any, build_reads: int = 0, tensorflow: bool = True) -> Passes:
        found = self.passes.get(dataset)
        if found is None:
            found = self.passes[dataset] = Passes(dataset, build_reads, tensorflow)
        return found


REGISTRY = Registry()


def is_dataset(x: Any) -> bool:
    """True for a ``tf.data.Dataset`` (never imports TensorFlow)."""
    import sys

    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


__all__ = ["INFINITE", "REGISTRY", "UNKNOWN", "Passes", "Stream", "cardinality", "is_dataset", "problem",
           "reshuffles"]
