"""What `Run.fit` hands each ``model.fit``, so a resumed run reads the batches an unbroken run reads.

A run's data order is part of its state, as its weights are: epoch k of a seeded
``tf.data`` shuffle is the k-th iterator's order, a Python generator is k epochs further on, a
PyDataset may reorder itself in ``on_epoch_end``. A new session starts each of them anew.
`Feed` brings them where the unbroken run had them (`tf_data` for datasets; `py_dataset` for
PyDatasets, their order drawn from a saved seed and their ``get_state``/``set_state`` saved;
generators fast-forwarded; each kind of input through its role in `input_roles`), records in
each checkpoint what a later session needs for that (``state.json``'s ``inputs``), and when an
input cannot be brought there says so once, naming it and what to change.

NumPy arrays need none of this: Keras orders them from the RNG states the checkpoint holds
(`positioning` skips the batches of a resumed epoch).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from typing import Any

import keras

from resumable.core import user_warnings
from resumable.core.display import printable
from resumable.keras import compat
from resumable.keras.checkpoint import torch_backend, user_state
from resumable.keras.replay import positioning, py_dataset, tf_data
from resumable.keras.replay.input_roles import (
    ITERATOR_POSITIONS,
    PYDATASETS,
    ROLE_NAMES,
    TRAIN,
    VALIDATION,
    DatasetPasses,
    DatasetStream,
    IteratorStream,
    PyDatasetRole,
    Role,
    Unchanged,
)

logger = logging.getLogger("resumable")


def describe(x: Any) -> str:
    """How a message names an input: its kind, not its repr (a dataset's repr is its spec)."""
    if tf_data.is_dataset(x):
        return "tf.data.Dataset"
    if isinstance(x, keras.utils.PyDataset):
        return f"PyDataset {type(x).__name__}"
    if inspect.isgenerator(x):
        return f"generator {x.__name__}()"
    return type(x).__name__


class Feed(keras.callbacks.Callback):
    """The inputs of one `Run.fit` call: what each of its ``model.fit`` calls reads, the hooks that
    keep them in step (first among the fit's callbacks: before Keras creates an epoch's iterator),
    and what checkpoints record of them (`state`).

    ``epoch`` and ``batch`` are where the run stands (a mid-epoch checkpoint: ``batch`` > 0);
    ``saved`` is the restored checkpoint's ``inputs`` ({} for a new run or an older checkpoint);
    ``epoch_rng`` a mid-epoch checkpoint's random states at its epoch's start (None: none).
    """

    def __init__(self, model: keras.Model, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                 epoch: int, batch: int, saved: dict[str, Any],
                 epoch_rng: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.model_fitted = model
        self.arguments = _bind(model, args, kwargs)
        self.epoch = epoch
        self.epoch_rng = epoch_rng or {}
        self.resumed = epoch > 0 or batch > 0
        self.problems: list[str] = []
        self.ran_out: str | None = None  # why nothing is left to train: the input ended at the checkpoint
        steps = self.arguments.get("steps_per_epoch")
        self.roles: dict[str, Role] = {
            TRAIN: self._train(self.arguments.get("x"), steps, saved.get(TRAIN) or {}, epoch, batch),
        }
        validation = self.arguments.get("validation_data")
        if tf_data.is_dataset(validation) and self.arguments.get("validation_steps") is None:
            self.roles[VALIDATION] = self._dataset_passes(validation, VALIDATION)
        self._fit_epoch = epoch
        self._pulled_at_fit = 0
        self._said_workers = False

    # ------------------------------------------------------------------ choosing a replay

    def _train(self, x: Any, steps: int | None, saved: dict[str, Any], epoch: int, batch: int) -> Role:
        if tf_data.is_dataset(x):
            count = tf_data.cardinality(x)
            if steps is None or 0 <= count <= steps:
                return self._dataset_passes(x, TRAIN)
            if count >= 0:
                self._say(x, TRAIN, f"steps_per_epoch={steps} is less than its {count} batches, so Keras "
                                    "carries it over from epoch to epoch; resumable replays whole passes "
                                    "only: pass steps_per_epoch >= its batches, or .repeat() it")
                return Unchanged(x)
            return self._dataset_stream(x, saved, epoch, steps, batch)
        if isinstance(x, keras.utils.PyDataset):
            return self._pydataset(x, saved, epoch, batch)
        if isinstance(x, Iterator) and not isinstance(x, (list, tuple, dict)):
            return self._iterator(x, saved, epoch, steps, batch)
        if self.resumed and x is not None and not positioning.takes_arrays(
                self.model_fitted, x, self.arguments.get("y"), self.arguments.get("sample_weight")):
            self._say(x, TRAIN, f"resumable does not know how to bring a {type(x).__name__} to where an "
                                "unbroken run has it (it starts again from its first batch): pass a "
                                "tf.data.Dataset, a keras.utils.PyDataset or a generator for an exact resume")
        return Unchanged(x)

    def _dataset_passes(self, dataset: Any, role: str) -> Role:
        # JAX's and torch's fit create an iterator to build the model; Run.fit builds it unread
        tensorflow = keras.backend.backend() == "tensorflow"
        passes = tf_data.REGISTRY.passes_of(dataset, 0 if tensorflow else 1, tensorflow)
        passes.add_role(role)  # training before validation: the same dataset may be both
        replay = DatasetPasses(passes, role)
        if passes.iterators == 0:  # never read by run.fit: positioned from its start
            if self.resumed:
                self._check(dataset, role)
        elif passes.iterators >= passes.slot(self.epoch, role):
            replay.behind = (f"this session already read epoch {self.epoch + 1}'s pass of it: build the "
                             "dataset again (run the cell that makes it) for an exact resume")
            self._say(dataset, role, replay.behind)
        return replay

    def _dataset_stream(self, dataset: Any, saved: dict[str, Any], epoch: int, steps: int | None,
                        batch: int) -> Role:
        known = tf_data.REGISTRY.streams.get(dataset)
        target = _saved_position(saved, "tf.data", epoch, steps, batch)
        if known is None:
            if self.resumed:
                self._check(dataset, TRAIN)
            build_reads = 0 if keras.backend.backend() == "tensorflow" else 1  # as in _dataset_passes
            known = tf_data.REGISTRY.streams[dataset] = tf_data.Stream(dataset, target, build_reads)
        elif known.position != target:
            self._say(dataset, TRAIN, f"this session already read it {known.position} batches into the run, "
                                      f"and the checkpoint is at batch {target}: build the dataset again "
                                      "(run the cell that makes it) for an exact resume")
        return DatasetStream(known)

    def _iterator(self, iterator: Iterator[Any], saved: dict[str, Any], epoch: int, steps: int | None,
                  batch: int) -> Role:
        target = _saved_position(saved, "iterator", epoch, steps, batch)
        known = ITERATOR_POSITIONS.get(iterator)
        if known is None:
            if self.resumed and not (inspect.isgenerator(iterator)
                                     and inspect.getgeneratorstate(iterator) == inspect.GEN_CREATED):
                self._say(iterator, TRAIN, f"resumable cannot tell where this {describe(iterator)} starts; "
                                           f"it skips {target} batches of it, as if it started where it did "
                                           "in the session that saved the checkpoint: pass a new generator "
                                           "(a generator function's call) for an exact resume")
            known = self._fast_forward(iterator, target)
            if known and known == target:
                return self._unless_ended(iterator, known)
        elif known != target:
            self._say(iterator, TRAIN, f"this session already read {known} batches of it, and the checkpoint "
                                       f"is at batch {target}: pass a new generator for an exact resume")
        return IteratorStream(iterator, known)

    def _unless_ended(self, iterator: Iterator[Any], position: int) -> Role:
        """A generator brought to the checkpoint: its next batch read ahead (handed to fit first), or
        ``ran_out`` said when it has none. An unbroken fit read it to its end there and stopped
        ("Your input ran out of data"); Keras refuses a generator that yields nothing at all."""
        try:
            ahead = next(iterator)
        except StopIteration:
            self.ran_out = (f"the training input ({describe(iterator)}) ended at the checkpoint, after "
                            f"{position} batches: nothing is left to train, and an unbroken model.fit "
                            "stopped there too (Keras: 'Your input ran out of data'); pass a generator "
                            "with more batches to train further")
            return IteratorStream(iterator, position)
        return IteratorStream(iterator, position, ahead=[ahead])

    def _fast_forward(self, iterator: Iterator[Any], count: int) -> int:
        if count and self.arguments.get("verbose", 1):
            print(f"resumable: skipping {count} batches of the {describe(iterator)} to where the run stopped")
        for done in range(count):
            try:
                next(iterator)
            except StopIteration:
                self._say(iterator, TRAIN, f"it ended after {done} batches, before the checkpoint's "
                                           f"batch {count}")
                return done
        ITERATOR_POSITIONS[iterator] = count
        return count

    def _pydataset(self, dataset: Any, saved: dict[str, Any], epoch: int, batch: int) -> Role:
        shuffle = bool(self.arguments.get("shuffle", True))
        known = PYDATASETS.get(dataset)
        if known is not None:
            start, pending, passes = known
        elif self.resumed and saved.get("kind") == "PyDataset":
            start = int(saved.get("position", 0))
            pending = {k: v for k, v in saved.items() if k == user_state.STATE_KEY} or None
            passes = py_dataset.saved_pass(saved.get("pass"), batch)
        else:  # a new run, or a checkpoint without it: from the batch
            start, pending, passes = batch, None, py_dataset.PassState(batch)
        if self.resumed and known is None and py_dataset.overrides_on_epoch_end(dataset) and not (
                user_state.has_protocol(dataset)):
            self._say(dataset, TRAIN, "its on_epoch_end may reorder its batches, and resumable cannot save "
                                      "that: give it get_state() and set_state() (see the docs), or leave "
                                      "shuffling to fit (shuffle=True)")
        role = PyDatasetRole(dataset, shuffle, start, pending, epoch, self.epoch_rng, passes, self)
        steps, count = self.arguments.get("steps_per_epoch"), role.count
        if self.resumed and role.per_epoch and count is not None and steps is not None and steps < count:
            self._say(dataset, TRAIN, f"with workers and steps_per_epoch={steps} below its {count} "
                                      "batches, Keras' worker queue carries batches prepared in one epoch "
                                      "into later ones, which a new session cannot refill: pass "
                                      "steps_per_epoch >= its batches, or workers=0, for an exact resume")
        elif batch and role.shuffles and passes.rng is None and "python" not in self.epoch_rng:
            self._say(dataset, TRAIN, f"the checkpoint does not hold the random state epoch {epoch + 1}'s "
                                      "order was drawn from, so the rest of that epoch is read in another "
                                      "order (the epochs after it are exact)")
        elif batch and role.shuffles and "order_seed" in saved:
            self._say(dataset, TRAIN, "its checkpoint was written by an older resumable, which drew the "
                                      "batch order from a seed of its own: this epoch's rest is read in "
                                      "fit's order (the epochs after it are exact)")
        PYDATASETS[dataset] = (start, pending, passes)
        return role

    def _check(self, dataset: Any, role: str) -> None:
        problem = tf_data.problem(dataset)
        if problem is not None:
            self._say(dataset, role, problem)

    def _say(self, x: Any, role: str, problem: str) -> None:
        """Once per input and Run.fit: why the resumed run will not read what an unbroken one reads."""
        message = printable(f"resumable: the {ROLE_NAMES[role]} ({describe(x)}) cannot be replayed exactly: "
                            f"{problem}")
        self.problems.append(message)
        if self.resumed:
            user_warnings.warn(message)
        else:
            logger.info("%s", message)

    # ------------------------------------------------------------------ what each fit reads

    def arguments_for(self, limit: int | None = None, skip: int = 0) -> dict[str, Any]:
        """``model.fit``'s arguments (without epochs and callbacks) with the inputs replaced by
        what a fit of at most ``limit`` batches per epoch (None: all) reads, ``skip`` batches of
        its first pass left out."""
        arguments = dict(self.arguments)
        arguments[TRAIN] = self.roles[TRAIN].for_fit(limit, skip)
        arguments.update(self.roles[TRAIN].overrides())
        if VALIDATION in self.roles:
            arguments[VALIDATION] = self.roles[VALIDATION].for_fit(None, 0)
        return arguments

    def rest_of_epoch_ends_pass(self, batch: int) -> bool:
        """True when the rest of an epoch resumed at ``batch`` ends a pass of the training input
        (a PyDataset read across epochs, `PyDatasetRole`): Keras starts its next pass there, as
        an unbroken run does."""
        role, steps = self.roles[TRAIN], self.arguments.get("steps_per_epoch")
        return isinstance(role, PyDatasetRole) and role.ends_pass(None if steps is None else steps - batch)

    @property
    def positions_rest_of_epoch(self) -> bool:
        """True when the training input is skipped here (not by `positioning`) mid-epoch."""
        return not isinstance(self.roles[TRAIN], Unchanged)

    def build_model(self, model: keras.Model) -> None:
        """Build the model as ``fit`` would from its first batch, without reading one: on JAX and
        torch ``fit`` reads a batch of an unbuilt model's input, which would take a batch from a
        stream and puts Keras' PyDataset queue a batch behind (`compat.build_for_fit`). What that
        read draws is drawn here as ``fit`` draws it: a shuffled PyDataset's order of the pass
        (Python's RNG) and, on torch, the seed of the DataLoader it starts (torch's RNG, which
        Dropout also draws from). Call after `arguments_for`."""
        if keras.backend.backend() == "tensorflow":  # its fit reads no batch (but under a strategy)
            return
        role = self.roles[TRAIN]
        if not role.samples:  # fit reads a batch itself (arrays, generators)
            return
        reads = compat.fit_reads_to_build(model)
        if reads and isinstance(role, PyDatasetRole) and role.per_epoch and not self._said_workers:
            self._said_workers = True
            user_warnings.warn(
                f"resumable: run.fit reads the {describe(role.dataset)} as a plain model.fit would not "
                f"on {keras.backend.backend()}: there model.fit reads a batch of it with its workers to "
                "build the model, which leaves Keras' worker queue a batch behind for the whole fit; "
                "run.fit builds the model first, so every epoch reads its own pass, an order a resumed "
                "run can read again")
        if reads and keras.backend.backend() == "torch":  # the loader starts before it reads
            torch_backend.loader_starts()
        batch = role.build_read() if reads else role.sample()
        if batch is not None and not compat.build_for_fit(model, batch):
            logger.info("resumable: %s", compat.unsupported("Trainer._symbolic_build"))

    def rng_ready(self) -> None:
        """The epoch's random states are set (a resumed fit's put back by the checkpoint callback,
        which runs after this Feed): an input drawing its order from them draws it now, before
        Keras starts the epoch's pass."""
        role = self.roles[TRAIN]
        if isinstance(role, PyDatasetRole):
            role.draw_order()

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        role = self.roles[TRAIN]
        if isinstance(role, DatasetStream) and role.stream.pulled != self._pulled_at_fit:
            self._say(role.stream.dataset, TRAIN, "Keras read a batch of it to build the model before "
                                                  "training (under a tf.distribute strategy), a batch the "
                                                  "run never trains on")

    def fit_starts(self) -> None:
        """A ``model.fit`` of this Run.fit is about to start."""
        role = self.roles[TRAIN]
        self._pulled_at_fit = role.stream.pulled if isinstance(role, DatasetStream) else 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._fit_epoch = epoch
        self.roles[TRAIN].before_epoch(epoch)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if VALIDATION in self.roles:
            self.roles[VALIDATION].before_epoch(self._fit_epoch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.roles[TRAIN].batch_done(batch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        for role in self.roles.values():  # the validation's pass is over too
            role.epoch_done()

    def fit_done(self) -> None:
        """A ``model.fit`` of this Run.fit returned or raised."""
        for role in self.roles.values():
            done = getattr(role, "fit_done", None)
            if done is not None:
                done()

    def state(self) -> dict[str, Any]:
        """What a checkpoint records of the inputs (``state.json``'s ``inputs``)."""
        return {name: state for name, role in self.roles.items() if (state := role.state())}


def plain_fit_problem(x: Any) -> str | None:
    """Why a plain ``model.fit`` (not `Run.fit`) of a resumed run does not read what an unbroken
    run reads from ``x``, ending with what to do; None when it does."""
    advice = "use run.fit from resumable.resume() for the order an unbroken run has"
    if tf_data.is_dataset(x) and tf_data.reshuffles(x):
        return f"model.fit reads its shuffle from the first epoch's order in a new session: {advice}"
    if isinstance(x, Iterator) and not isinstance(x, (list, tuple, dict)):
        return f"model.fit reads it from its first batch in a new session: {advice}"
    if isinstance(x, keras.utils.PyDataset) and py_dataset.overrides_on_epoch_end(x):
        return f"its on_epoch_end may reorder its batches, and resumable cannot save that: {advice}"
    return None


def _saved_position(saved: dict[str, Any], kind: str, epoch: int, steps: int | None, batch: int) -> int:
    """The stream position a checkpoint recorded; for an older checkpoint, where the epoch and
    batch put it (every epoch ``steps_per_epoch`` batches)."""
    if saved.get("kind") == kind and saved.get("mode") == "stream":
        return int(saved["position"])
    return epoch * (steps or 0) + batch


def _bind(model: keras.Model, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``model.fit``'s arguments by name (as the user passed them: Keras' defaults are not added)."""
    bound = inspect.signature(model.fit).bind_partial(*args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.update(arguments.pop("kwargs", {}))
    return arguments


__all__ = ["Feed", "describe", "plain_fit_problem"]
