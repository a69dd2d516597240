"""A ``keras.utils.PyDataset`` read in an order resumable sets, so a resumed run reads the same.

``model.fit(shuffle=True)`` shuffles a PyDataset's batch indices with Python's global ``random``
as each pass begins (`compat.pydataset_epoch_order`), from a worker thread when the dataset has
``workers``. `Run.fit` makes that same draw, from the same RNG, as the epoch begins (after the
checkpoint callback has put back a resumed run's random states, before Keras starts the pass),
and hands Keras the batches in that order (``shuffle=False`` for Keras): the order is known to
resumable, so a mid-epoch resume reads the rest of it, and Keras' workers never race the draw.
`Ordered` does the handing, from a given batch on in a resumed epoch.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import keras


class Ordered(keras.utils.PyDataset):
    """``inner``'s batches: of a finite one, those of the pass ``order`` from batch ``start`` of
    the pass on (a fit resumed inside a pass reads its rest first); of an endless one (``order``
    None), from ``offset`` on. Runs with ``inner``'s workers, multiprocessing and queue size;
    passes its epoch hooks on."""

    def __init__(self, inner: Any, order: list[int] | None, offset: int = 0, start: int = 0) -> None:
        super().__init__(workers=inner.workers, use_multiprocessing=inner.use_multiprocessing,
                         max_queue_size=inner.max_queue_size)
        self.inner = inner
        self.order = order
        self.offset = offset
        self.start = start

    def new_pass(self, order: list[int]) -> None:
        self.order, self.start = order, 0

    @property
    def num_batches(self) -> int | None:
        return None if self.order is None else len(self.order) - self.start

    def __len__(self) -> int:
        return len(self.order) - self.start if self.order is not None else sys.maxsize

    def __getitem__(self, index: int) -> Any:
        if self.order is None:
            return self.inner[index + self.offset]
        return self.inner[self.order[self.start + index]]

    def on_epoch_begin(self) -> None:
        self.inner.on_epoch_begin()

    def on_epoch_end(self) -> None:
        self.inner.on_epoch_end()


class PassState(NamedTuple):
    """Where a PyDataset's pass stands when ``steps_per_epoch`` is below its length and Keras
    reads one pass across epochs: ``at`` batches of it read; ``rng``: Python's random state its
    order was drawn from (None: unknown)."""

    at: int = 0
    rng: list[Any] | None = None

    def saved(self, count: int) -> dict[str, Any]:
        """For a checkpoint: nothing at a pass's start; else where it stands and how to redraw it."""
        if not 0 < self.at < count:
            return {}
        return {"pass": {"at": self.at, **({"rng": self.rng} if self.rng is not None else {})}}


def saved_pass(saved: Any, at: int) -> PassState:
    """The `PassState` a checkpoint recorded (its ``"pass"``); ``at`` batches into a fresh pass
    when it recorded none (a pass's start, or a checkpoint of an older resumable). Anything
    malformed counts as not recorded: state.json is read from a run folder."""
    if type(saved) is not dict or type(saved.get("at")) is not int or saved["at"] < 0:
        return PassState(at)
    rng = saved.get("rng")
    valid = type(rng) is list and len(rng) == 3 and type(rng[0]) is int and type(rng[1]) is list
    return PassState(saved["at"], rng if valid else None)


def batch_count(dataset: Any) -> int | None:
    """Batches per epoch (``num_batches``; ``len()`` in Keras versions without it); None: endless."""
    count = getattr(dataset, "num_batches", None) if hasattr(type(dataset), "num_batches") else len(dataset)
    return None if count is None else int(count)


def overrides_on_epoch_end(dataset: Any) -> bool:
    """True when the dataset's class has its own ``on_epoch_end`` (which may reorder it)."""
    return type(dataset).on_epoch_end is not keras.utils.PyDataset.on_epoch_end


__all__ = ["Ordered", "PassState", "batch_count", "overrides_on_epoch_end", "saved_pass"]
