"""Each input of `Run.fit` as resumable replays it: a role per kind of input, used by `inputs.Feed`.

Arrays are left to Keras (`Unchanged`); a ``tf.data.Dataset`` is read one pass per epoch
(`DatasetPasses`) or as one stream across epochs (`DatasetStream`), as is a Python generator
(`IteratorStream`); a PyDataset is read in the order fit would draw (`PyDatasetRole`).
Each role tells where its input stands (`Role.state`, saved with each checkpoint) and what the
next ``model.fit`` reads from it (`Role.for_fit`). Where this session left generators and
PyDatasets is remembered for the next `Run.fit` of the same object.
"""

from __future__ import annotations

import itertools
import logging
import random
import weakref
from collections.abc import Iterator
from typing import Any

from resumable.core import user_warnings
from resumable.keras import compat
from resumable.keras.checkpoint import training_state, user_state
from resumable.keras.replay import py_dataset, tf_data

logger = logging.getLogger("resumable")

# state.json's "inputs": one entry per role
TRAIN = "x"
VALIDATION = "validation_data"


class Role:
    """One input of the fits (training or validation data), as resumable replays it."""

    kind = "other"
    samples = False  # `sample` gives shapes without moving the input on

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

    def build_read(self) -> Any:
        """`sample`, drawing what ``fit``'s read of a first batch to build the model draws."""
        return self.sample()

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind}


class Unchanged(Role):
    """Arrays and inputs resumable leaves to Keras (and to `positioning` mid-epoch)."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def for_fit(self, limit: int | None, skip: int) -> Any:
        return self.x

    def state(self) -> dict[str, Any]:
        return {}


class DatasetPasses(Role):
    """A ``tf.data.Dataset`` Keras reads one pass per epoch: each epoch reads the iterator an
    unbroken run reads then (`tf_data.Passes`)."""

    kind = "tf.data"
    samples = True

    def __init__(self, passes: tf_data.Passes, role: str) -> None:
        self.passes = passes
        self.role = role
        self.behind: str | None = None  # why an epoch could not get its iterator

    def before_epoch(self, epoch: int) -> None:
        if not self.passes.bring_to(self.passes.slot(epoch, self.role)) and self.behind is None:
            # Keras read it more than resumable expects (said once; the run goes on)
            self.behind = f"epoch {epoch + 1} found more of its iterators created than an unbroken run has"
            logger.warning("resumable: the %s (tf.data.Dataset): %s", ROLE_NAMES[self.role], self.behind)
        self.passes.pass_begins()

    def epoch_done(self) -> None:
        self.passes.settle()

    def fit_done(self) -> None:
        self.passes.abandon()

    def for_fit(self, limit: int | None, skip: int) -> Any:
        return self.passes.for_fit(skip)

    def sample(self) -> Any:
        return self.passes.dataset.element_spec

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": "passes"}


class Stream(Role):
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


class DatasetStream(Stream):
    kind = "tf.data"
    samples = True

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


class IteratorStream(Stream):
    """``ahead``: batches already read from ``iterator`` (to tell it has more), handed to fit first."""

    kind = "iterator"

    def __init__(self, iterator: Iterator[Any], start: int, ahead: list[Any] | None = None) -> None:
        super().__init__(start)
        self.iterator = iterator
        self._source = _ahead_first(ahead, iterator) if ahead else iterator

    def epoch_done(self) -> None:
        super().epoch_done()
        ITERATOR_POSITIONS[self.iterator] = self.position

    def for_fit(self, limit: int | None, skip: int) -> Any:
        # Keras reads a generator ahead (tf.data's prefetch): a fit of part of an epoch gets no
        # more than it trains on, so the next fit finds the rest.
        return self._source if limit is None else _limited(self._source, limit)


def _limited(iterator: Iterator[Any], limit: int) -> Iterator[Any]:
    yield from itertools.islice(iterator, limit)


def _ahead_first(ahead: list[Any], iterator: Iterator[Any]) -> Iterator[Any]:
    """A generator (Keras takes no other iterator): ``ahead``, then the rest of ``iterator``."""
    yield from ahead
    yield from iterator


class PyDatasetRole(Role):
    """A ``keras.utils.PyDataset``: its batches in the order ``fit(shuffle=True)`` would draw for
    each pass, drawn as Keras draws it (`py_dataset`, `compat.pydataset_epoch_order`); its own
    state through ``get_state``/``set_state`` when it has them, saved with each checkpoint and
    given back when a fit's first epoch begins (after the ``on_epoch_end`` Keras calls when
    ``fit`` starts).

    A pass is an epoch, but for ``steps_per_epoch`` below the dataset's length: Keras then reads
    one pass across epochs, an epoch ending early where the pass ends (`passes`). A fit resumed
    inside a pass reads the pass's rest, in the order drawn again from the random state the
    pass began with (an older checkpoint's: its epoch's, ``epoch_rng``), as its first pass.
    An endless one (no ``num_batches``) is read from index 0 on, across epochs, when Keras reads
    it in this thread; with workers Keras starts again at 0 each epoch. Either way, resumed, it
    starts where the unbroken run was.
    """

    kind = "PyDataset"
    samples = True

    def __init__(self, dataset: Any, shuffle: bool, start: int, pending: Any, epoch: int,
                 epoch_rng: dict[str, Any] | None, passes: py_dataset.PassState | None = None,
                 fit_callback: Any = None) -> None:
        self.dataset = dataset
        self.count = py_dataset.batch_count(dataset)
        self.shuffles = shuffle and self.count is not None  # Keras shuffles finite ones only
        # Keras' enqueuer restarts an endless dataset at index 0 each epoch; its own loop does not.
        # It starts a finite one's pass again (a new draw) at every epoch.
        self.per_epoch = dataset.workers > 1 or (dataset.workers > 0 and dataset.use_multiprocessing)
        self.stream = Stream(start)
        self.pending = pending  # a saved {"state": ...} to give back before the next epoch
        self.name = f"PyDataset {type(dataset).__name__}"
        self.epoch = epoch
        self.epoch_rng = epoch_rng or {}
        self.passes = passes or py_dataset.PassState()  # at: the pass's batches read before this epoch
        self.fit_callback = fit_callback  # to find the running fit (`compat.set_fit_pass_length`)
        self.fit_begins = False  # the next epoch is a fit's first
        self.draw_due = False  # the epoch begun still draws its order (`draw_order`)
        self.current: py_dataset.Ordered | None = None
        self.said = False  # that a fit resumed inside a pass reads its later passes otherwise

    def before_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        current, new_pass = self.current, self.passes.at == 0
        if current is not None and self.count is not None and not self.fit_begins and (
                new_pass or self.per_epoch):
            told = not current.start or self.per_epoch or compat.set_fit_pass_length(self.fit_callback,
                                                                                     self.count)
            if not told and not self.said:  # its later passes end where the first did
                self.said = True
                user_warnings.warn(f"resumable: the training input ({self.name}) cannot be replayed exactly: "
                                   "this Keras' fit cannot be told that its passes after the resumed one "
                                   f"have {self.count} batches")
            current.new_pass(list(range(self.count)))  # in order until `draw_order`
        if self.pending is not None:
            user_state.restore(self.dataset, self.name, self.pending)
            self.pending = None
        if self.per_epoch and current is not None and current.order is None and not self.fit_begins:
            current.offset = 0  # Keras' enqueuer counts from 0 again
        self.draw_due = self.shuffles and (new_pass or self.per_epoch) and not (
            self.fit_begins and self.passes.at)
        self.fit_begins = False

    def draw_order(self) -> None:
        """The random states are the pass's (a resumed fit's put back): draw its order now, as
        Keras would when it starts the pass."""
        if self.draw_due and self.current is not None and self.count is not None:
            version, internal, gauss = random.getstate()
            self.passes = self.passes._replace(rng=[version, list(internal), gauss])
            self.current.new_pass(compat.pydataset_epoch_order(self.count))
        self.draw_due = False

    def _pass_order(self) -> list[int] | None:
        """The order of the pass the next fit starts in: drawn again from the random state it
        began with when it began before; else in order until `draw_order` (Keras reads the first
        ones in order to learn the shapes)."""
        if self.count is None:
            return None
        if self.passes.at and self.shuffles:
            began = {"python": self.passes.rng} if self.passes.rng is not None else self.epoch_rng
            return compat.pydataset_epoch_order(self.count, training_state.python_random(began))
        return list(range(self.count))

    def ends_pass(self, batches: int | None) -> bool:
        """Whether reading ``batches`` more (None: to the end) ends the pass the next fit starts in."""
        return self.count is not None and (batches is None or self.passes.at + batches >= self.count)

    def build_read(self) -> Any:
        """What ``fit`` draws and reads when it reads a batch to build the model: the order of a
        pass (from Python's global RNG), and that pass's first batch."""
        if self.count is None:
            return self.sample()
        order = compat.pydataset_epoch_order(self.count) if self.shuffles else list(range(self.count))
        return self.dataset[order[0]] if order else None

    def batch_done(self, batch: int) -> None:
        self.stream.batch_done(batch)

    def epoch_done(self) -> None:
        at = self.passes.at + self.stream._in_epoch
        self.stream.epoch_done()
        if self.count is not None:
            self.passes = self.passes._replace(at=0 if at >= self.count or self.per_epoch else at)

    def fit_done(self) -> None:
        at = self.passes.at + self.stream._in_epoch  # an interrupt: where the pass stands
        self.stream.fit_done()
        if self.count is not None and not self.per_epoch:
            self.passes = self.passes._replace(at=at if at < self.count else 0)
        if user_state.has_protocol(self.dataset):
            self.pending = user_state.capture(self.dataset, self.name)
        PYDATASETS[self.dataset] = (self.stream.position, self.pending, self.passes)

    def for_fit(self, limit: int | None, skip: int) -> Any:
        if self.count is not None and self.per_epoch:
            self.passes = self.passes._replace(at=skip)  # the enqueuer starts each epoch's pass anew
        offset = skip if self.per_epoch else self.stream.position
        order = self._pass_order()
        self.current = py_dataset.Ordered(self.dataset, order, offset, self.passes.at if order else 0)
        self.fit_begins = True
        return self.current

    def overrides(self) -> dict[str, Any]:
        return {"shuffle": False}  # the order is ours

    def sample(self) -> Any:
        return self.current[0] if self.current is not None and len(self.current) else None

    def state(self) -> dict[str, Any]:
        saved = user_state.capture(self.dataset, self.name) if user_state.has_protocol(self.dataset) else None
        passes = self.passes._replace(at=self.passes.at + self.stream._in_epoch)
        return {"kind": self.kind, "position": self.stream.position, **(saved or {}),
                **(passes.saved(self.count) if self.count is not None and not self.per_epoch else {})}


class Remembered:
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


ROLE_NAMES = {TRAIN: "training input", VALIDATION: "validation data"}
# Where this session left Python iterators and PyDatasets given to run.fit.
ITERATOR_POSITIONS = Remembered()
# a PyDataset's (stream position, saved get_state(), py_dataset.PassState)
PYDATASETS = Remembered()


__all__ = ["ITERATOR_POSITIONS", "PYDATASETS", "ROLE_NAMES", "TRAIN", "VALIDATION", "DatasetPasses",
           "DatasetStream", "IteratorStream", "PyDatasetRole", "Remembered", "Role", "Stream", "Unchanged"]
