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
from typing import Any

import keras


class Ordered(keras.utils.PyDataset):
    """``inner``'s batches: those of ``order`` (a finite dataset), or from ``offset`` on (an
    endless one). Runs with ``inner``'s workers, multiprocessing and queue size; passes its
    epoch hooks on."""

    def __init__(self, inner: Any, order: list[int] | None, offset: int = 0) -> None:
        super().__init__(workers=inner.workers, use_multiprocessing=inner.use_multiprocessing,
                         max_queue_size=inner.max_queue_size)
        self.inner = inner
        self.order = order
        self.offset = offset

    @property
    def num_batches(self) -> int | None:
        return None if self.order is None else len(self.order)

    def __len__(self) -> int:
        return len(self.order) if self.order is not None else sys.maxsize

    def __getitem__(self, index: int) -> Any:
        return self.inner[self.order[index] if self.order is not None else index + self.offset]

    def on_epoch_begin(self) -> None:
        self.inner.on_epoch_begin()

    def on_epoch_end(self) -> None:
        self.inner.on_epoch_end()


def batch_count(dataset: Any) -> int | None:
    """Batches per epoch (``num_batches``; ``len()`` in Keras versions without it); None: endless."""
    count = getattr(dataset, "num_batches", None) if hasattr(type(dataset), "num_batches") else len(dataset)
    return None if count is None else int(count)


def overrides_on_epoch_end(dataset: Any) -> bool:
    """True when the dataset's class has its own ``on_epoch_end`` (which may reorder it)."""
    return type(dataset).on_epoch_end is not keras.utils.PyDataset.on_epoch_end


__all__ = ["Ordered", "batch_count", "overrides_on_epoch_end"]
