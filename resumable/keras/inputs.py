"""What `Run.fit` hands each ``model.fit``, so a resumed run reads the batches an unbroken run reads.

A run's data order is part of its state, as its weights are: epoch k of a seeded
``tf.data`` shuffle is the k-th iterator's order, a Python generator is k epochs further on, a
PyDataset may reorder itself in ``on_epoch_end``. A new session starts each of them anew.
`Feed` brings them where the unbroken run had them (`tf_data` for datasets; `py_dataset` for
PyDatasets, their order drawn from a saved seed and their ``get_state``/``set_state`` saved;
generators fast-forwarded), records in each checkpoint what a later session needs for that
(``state.json``'s ``inputs``), and when an input cannot be brought there says so once, naming
it and what to change.

NumPy arrays need none of this: Keras orders them from the RNG states the checkpoint holds
(`positioning` skips the batches of a resumed epoch).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import keras

from resumable.core.display import printable
from resumable.keras import compat, positioning, py_dataset, tf_data, user_state

logger = logging.getLogger("resumable")

# state.json's "inputs": one entry per role
TRAIN = "x"
VALIDATION = "validation_data"


def describe(x: Any) -> str:
    """How a message names an input: its kind, not its repr (a dataset's repr is its spec)."""
    if tf_data.is_dataset(x):
        return "tf.data.Dataset"
    if isinstance(x, keras.utils.PyDataset):
        return f"PyDataset {type(x).__name__}"
    if inspect.isgenerator(x):
        return f"generator {x.__name__}()"
    return type(x).__name__


class _Role:
    """One input of the fits (training or validation data), as resumable replays it."""

    kind = "other"

    def before_epoch(self, epoch: int) -> None:
        """The epoch begins (the training input), or its validation (the validation input)."""

    def batch_done(self, batch: int) -> None:
        """Keras finished batch ``batch`` (0-based in this fit's epoch; the last of a block of
        ``steps_per_execution``)."""

    def epoch_done(self) -> None:
        """The epoch's batches are done."""

    def for_fit(self, limit: int | None, skip: int) -> Any:
        """What this fit reads: at most ``limit`` batches (None: no limit), the first ``skip`` of
        the epoch's pass left out (a mid-epoch resume)."""
        raise NotImplementedError

    def overrides(self) -> dict[str, Any]:
        """Other arguments of ``model.fit`` this input changes."""
        return {}

    def sample(self) -> Any:
        """Something with the shapes and dtypes of a batch, read without moving the input on;
        None when there is no such thing (a generator)."""
        return None

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind}


class _Unchanged(_Role):
    """Arrays and inputs resumable leaves to Keras (and to `positioning` mid-epoch)."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def for_fit(self, limit: int | None, skip: int) -> Any:
        return self.x

    def state(self) -> dict[str, Any]:
        return {}


class _DatasetPasses(_Role):
    """A ``tf.data.Dataset`` Keras reads one pass per epoch: each epoch reads the iterator an
    unbroken run reads then (`tf_data.Passes`)."""

    kind = "tf.data"

    def __init__(self, passes: tf_data.Passes, role: str) -> None:
        self.passes = passes
        self.role = role
        self.behind: str | None = None  # why an epoch could not get its iterator

    def before_epoch(self, epoch: int) -> None:
        if not self.passes.bring_to(self.passes.slot(epoch, self.role)) and self.behind is None:
            # Keras read it more than resumable expects (said once; the run goes on)
            self.behind = f"epoch {epoch + 1} found more of its iterators created than an unbroken run has"
            logger.warning("resumable: the %s (tf.data.Dataset): %s", _ROLE_NAMES[self.role], self.behind)

    def for_fit(self, limit: int | None, skip: int) -> Any:
        return self.passes.wrapper(skip)

    def sample(self) -> Any:
        return self.passes.dataset.element_spec

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "passes"}


class _Stream(_Role):
    """An input Keras reads as one stream across epochs: a ``tf.data.Dataset`` with
    ``steps_per_epoch``, or a Python generator or iterator. ``position`` counts the batches
    trained on since the run began reading it."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.consumed = 0  # batches trained on from it in this session, epochs done
        self._in_epoch = 0  # and in the current epoch

    @property
    def position(self) -> int:
        return self.start + self.consumed + self._in_epoch

    def batch_done(self, batch: int) -> None:
        self._in_epoch = batch + 1

    def epoch_done(self) -> None:
        self.consumed += self._in_epoch
        self._in_epoch = 0

    def fit_done(self) -> None:
        """A fit ended (its last epoch may have been cut short by an interrupt)."""
        self.epoch_done()

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "stream", "position": self.position}


class _DatasetStream(_Stream):
    kind = "tf.data"

    def __init__(self, stream: tf_data.Stream) -> None:
        super().__init__(stream.position)
        self.stream = stream

    def epoch_done(self) -> None:
        super().epoch_done()
        self.stream.consumed = self.position - self.stream.start

    def for_fit(self, limit: int | None, skip: int) -> Any:
        return self.stream.wrapper(limit)

    def sample(self) -> Any:
        return self.stream.dataset.element_spec


class _IteratorStream(_Stream):
    kind = "iterator"

    def __init__(self, iterator: Iterator[Any], start: int) -> None:
        super().__init__(start)
        self.iterator = iterator

    def epoch_done(self) -> None:
        super().epoch_done()
        _ITERATOR_POSITIONS[self.iterator] = self.position

    def for_fit(self, limit: int | None, skip: int) -> Any:
        # Keras reads a generator ahead (tf.data's prefetch): a fit of part of an epoch gets no
        # more than it trains on, so the next fit finds the rest.
        return self.iterator if limit is None else _limited(self.iterator, limit)


def _limited(iterator: Iterator[Any], limit: int) -> Iterator[Any]:
    yield from itertools.islice(iterator, limit)


class _PyDataset(_Role):
    """A ``keras.utils.PyDataset``: its batches in an order `Run.fit` draws (`py_dataset`), from a
    seed saved with the checkpoints; its own state through ``get_state``/``set_state`` when it has
    them, saved with each checkpoint and given back when a fit's first epoch begins (after the
    ``on_epoch_end`` Keras calls when ``fit`` starts).

    An endless one (no ``num_batches``) is read from index 0 on, across epochs, when Keras reads
    it in this thread; with workers Keras starts again at 0 each epoch. Either way, resumed, it
    starts where the unbroken run was.
    """

    kind = "PyDataset"

    def __init__(self, dataset: Any, seed: int, shuffle: bool, start: int, pending: Any, epoch: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.shuffle = shuffle
        self.count = py_dataset.batch_count(dataset)
        # Keras' enqueuer restarts an endless dataset at index 0 each epoch; its own loop does not
        self.per_epoch = dataset.workers > 1 or (dataset.workers > 0 and dataset.use_multiprocessing)
        self.stream = _Stream(start)
        self.pending = pending  # a saved {"state": ...} to give back before the next epoch
        self.name = f"PyDataset {type(dataset).__name__}"
        self.epoch = epoch
        self.skip = 0
        self.current: py_dataset.Ordered | None = None

    def before_epoch(self, epoch: int) -> None:
        if self.pending is not None:
            user_state.restore(self.dataset, self.name, self.pending)
            self.pending = None
        self.epoch = epoch
        if self.current is not None:
            self.current.order = self._order(epoch, self.skip)
            if self.per_epoch:  # Keras' enqueuer counts from 0 again; its own loop counts on
                self.current.offset = self.skip
        self.skip = 0  # only the fit's first epoch, the resumed one, starts mid-way

    def _order(self, epoch: int, skip: int) -> list[int] | None:
        if self.count is None:
            return None
        return py_dataset.epoch_order(self.seed, epoch, self.count, self.shuffle)[skip:]

    def batch_done(self, batch: int) -> None:
        self.stream.batch_done(batch)

    def epoch_done(self) -> None:
        self.stream.epoch_done()

    def fit_done(self) -> None:
        self.stream.fit_done()
        if user_state.has_protocol(self.dataset):
            self.pending = user_state.capture(self.dataset, self.name)
        _PYDATASETS[self.dataset] = (self.seed, self.stream.position, self.pending)

    def for_fit(self, limit: int | None, skip: int) -> Any:
        self.skip = skip
        offset = skip if self.per_epoch else self.stream.position
        self.current = py_dataset.Ordered(self.dataset, self._order(self.epoch, skip), offset)
        return self.current

    def overrides(self) -> dict[str, Any]:
        return {"shuffle": False}  # the order is ours

    def sample(self) -> Any:
        return self.current[0] if self.current is not None and len(self.current) else None

    def state(self) -> dict[str, Any]:
        saved = user_state.capture(self.dataset, self.name) if user_state.has_protocol(self.dataset) else None
        return {"kind": self.kind, "order_seed": self.seed, "position": self.stream.position, **(saved or {})}


class _Remembered:
    """What this session knows of each input object: weakly held where the object allows it
    (a ``list_iterator`` does not: kept alive then, as the fit that reads it does)."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._strong: dict[int, tuple[Any, Any]] = {}

    def get(self, key: Any) -> Any:
        try:
            return self._weak.get(key)
        except TypeError:
            found = self._strong.get(id(key))
            return found[1] if found is not None and found[0] is key else None

    def __setitem__(self, key: Any, value: Any) -> None:
        try:
            self._weak[key] = value
        except TypeError:
            self._strong[id(key)] = (key, value)


_ROLE_NAMES = {TRAIN: "training input", VALIDATION: "validation data"}
# Where this session left Python iterators and PyDatasets given to run.fit.
_ITERATOR_POSITIONS = _Remembered()
# a PyDataset's (order seed, stream position, saved get_state())
_PYDATASETS = _Remembered()


class Feed(keras.callbacks.Callback):
    """The inputs of one `Run.fit` call: what each of its ``model.fit`` calls reads, the hooks that
    keep them in step (first among the fit's callbacks: before Keras creates an epoch's iterator),
    and what checkpoints record of them (`state`).

    ``epoch`` and ``batch`` are where the run stands (a mid-epoch checkpoint: ``batch`` > 0);
    ``saved`` is the restored checkpoint's ``inputs`` ({} for a new run or an older checkpoint).
    """

    def __init__(self, model: keras.Model, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                 epoch: int, batch: int, saved: dict[str, Any]) -> None:
        super().__init__()
        self.model_fitted = model
        self.arguments = _bind(model, args, kwargs)
        self.epoch = epoch
        self.resumed = epoch > 0 or batch > 0
        self.problems: list[str] = []
        steps = self.arguments.get("steps_per_epoch")
        self.roles: dict[str, _Role] = {
            TRAIN: self._train(self.arguments.get("x"), steps, saved.get(TRAIN) or {}, epoch, batch),
        }
        validation = self.arguments.get("validation_data")
        if tf_data.is_dataset(validation) and self.arguments.get("validation_steps") is None:
            self.roles[VALIDATION] = self._dataset_passes(validation, VALIDATION)
        self._fit_epoch = epoch
        self._pulled_at_fit = 0

    @functools.cached_property
    def order_seed(self) -> int:
        """The seed of the batch orders `Run.fit` draws for a PyDataset of a new run."""
        return py_dataset.new_seed()

    # ------------------------------------------------------------------ choosing a replay

    def _train(self, x: Any, steps: int | None, saved: dict[str, Any], epoch: int, batch: int) -> _Role:
        if tf_data.is_dataset(x):
            count = tf_data.cardinality(x)
            if steps is None or 0 <= count <= steps:
                return self._dataset_passes(x, TRAIN)
            if count >= 0:
                self._say(x, TRAIN, f"steps_per_epoch={steps} is less than its {count} batches, so Keras "
                                    "carries it over from epoch to epoch; resumable replays whole passes "
                                    "only: pass steps_per_epoch >= its batches, or .repeat() it")
                return _Unchanged(x)
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
        return _Unchanged(x)

    def _dataset_passes(self, dataset: Any, role: str) -> _Role:
        passes = tf_data.REGISTRY.passes_of(dataset)
        passes.add_role(role)  # training before validation: the same dataset may be both
        replay = _DatasetPasses(passes, role)
        if passes.iterators == 0:  # never read by run.fit: positioned from its start
            if self.resumed:
                self._check(dataset, role)
        elif passes.iterators >= passes.slot(self.epoch, role):
            replay.behind = (f"this session already read epoch {self.epoch + 1}'s pass of it: build the "
                             "dataset again (run the cell that makes it) for an exact resume")
            self._say(dataset, role, replay.behind)
        return replay

    def _dataset_stream(self, dataset: Any, saved: dict[str, Any], epoch: int, steps: int | None,
                        batch: int) -> _Role:
        known = tf_data.REGISTRY.streams.get(dataset)
        target = _saved_position(saved, "tf.data", epoch, steps, batch)
        if known is None:
            if self.resumed:
                self._check(dataset, TRAIN)
            known = tf_data.REGISTRY.streams[dataset] = tf_data.Stream(dataset, target)
        elif known.position != target:
            self._say(dataset, TRAIN, f"this session already read it {known.position} batches into the run, "
                                      f"and the checkpoint is at batch {target}: build the dataset again "
                                      "(run the cell that makes it) for an exact resume")
        return _DatasetStream(known)

    def _iterator(self, iterator: Iterator[Any], saved: dict[str, Any], epoch: int, steps: int | None,
                  batch: int) -> _Role:
        target = _saved_position(saved, "iterator", epoch, steps, batch)
        known = _ITERATOR_POSITIONS.get(iterator)
        if known is None:
            if self.resumed and not (inspect.isgenerator(iterator)
                                     and inspect.getgeneratorstate(iterator) == inspect.GEN_CREATED):
                self._say(iterator, TRAIN, f"resumable cannot tell where this {describe(iterator)} starts; "
                                           f"it skips {target} batches of it, as if it started where it did "
                                           "in the session that saved the checkpoint: pass a new generator "
                                           "(a generator function's call) for an exact resume")
            known = self._fast_forward(iterator, target)
        elif known != target:
            self._say(iterator, TRAIN, f"this session already read {known} batches of it, and the checkpoint "
                                       f"is at batch {target}: pass a new generator for an exact resume")
        return _IteratorStream(iterator, known)

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
        _ITERATOR_POSITIONS[iterator] = count
        return count

    def _pydataset(self, dataset: Any, saved: dict[str, Any], epoch: int, batch: int) -> _Role:
        shuffle = bool(self.arguments.get("shuffle", True))
        known = _PYDATASETS.get(dataset)
        if known is not None:
            seed, start, pending = known
        elif self.resumed and saved.get("kind") == "PyDataset":
            seed, start = int(saved.get("order_seed", 0)), int(saved.get("position", 0))
            pending = {k: v for k, v in saved.items() if k == user_state.STATE_KEY} or None
        else:
            # a new run, or a checkpoint without them: the order from the run's seed, from the batch
            seed, start, pending = self.order_seed, batch, None
        if self.resumed and known is None and py_dataset.overrides_on_epoch_end(dataset) and not (
                user_state.has_protocol(dataset)):
            self._say(dataset, TRAIN, "its on_epoch_end may reorder its batches, and resumable cannot save "
                                      "that: give it get_state() and set_state() (see the docs), or leave "
                                      "shuffling to fit (shuffle=True)")
        role = _PyDataset(dataset, seed, shuffle, start, pending, epoch)
        _PYDATASETS[dataset] = (seed, start, pending)
        return role

    def _check(self, dataset: Any, role: str) -> None:
        problem = tf_data.problem(dataset)
        if problem is not None:
            self._say(dataset, role, problem)

    def _say(self, x: Any, role: str, problem: str) -> None:
        """Once per input and Run.fit: why the resumed run will not read what an unbroken one reads."""
        message = printable(f"resumable: the {_ROLE_NAMES[role]} ({describe(x)}) cannot be replayed exactly: "
                            f"{problem}")
        self.problems.append(message)
        if self.resumed:
            warnings.warn(message, stacklevel=4)
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

    @property
    def positions_rest_of_epoch(self) -> bool:
        """True when the training input is skipped here (not by `positioning`) mid-epoch."""
        return not isinstance(self.roles[TRAIN], _Unchanged)

    def build_model(self, model: keras.Model) -> None:
        """Build the model as ``fit`` would from its first batch, without reading one: on JAX and
        torch ``fit`` reads a batch of an unbuilt model's input, which would take a batch from a
        stream and puts Keras' PyDataset queue a batch behind (`compat.build_for_fit`). Call after
        `arguments_for`."""
        if keras.backend.backend() == "tensorflow":  # its fit reads no batch (but under a strategy)
            return
        batch = self.roles[TRAIN].sample()
        if batch is not None and not compat.build_for_fit(model, batch):
            logger.info("resumable: %s", compat.unsupported("Trainer._symbolic_build"))

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        role = self.roles[TRAIN]
        if isinstance(role, _DatasetStream) and role.stream.pulled != self._pulled_at_fit:
            self._say(role.stream.dataset, TRAIN, "Keras read a batch of it to build the model before "
                                                  "training (under a tf.distribute strategy), a batch the "
                                                  "run never trains on")

    def fit_starts(self) -> None:
        """A ``model.fit`` of this Run.fit is about to start."""
        role = self.roles[TRAIN]
        self._pulled_at_fit = role.stream.pulled if isinstance(role, _DatasetStream) else 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._fit_epoch = epoch
        self.roles[TRAIN].before_epoch(epoch)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if VALIDATION in self.roles:
            self.roles[VALIDATION].before_epoch(self._fit_epoch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.roles[TRAIN].batch_done(batch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.roles[TRAIN].epoch_done()

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
