"""What Keras' torch backend needs beyond TensorFlow and JAX for an exact resume.

On torch, ``model.fit`` feeds arrays through a ``torch.utils.data.DataLoader``: each epoch its
``RandomSampler`` draws the shuffle's seed, and the loader its workers' base seed, from torch's
global RNG. That state is saved and restored with Python's and NumPy's (`training_state.rng_state`),
and a mid-epoch resume replays the draws of the epoch's start to find its order
(`positioning.rest_of_epoch`). torch is only touched where it is already imported.
"""

from __future__ import annotations

import base64
import binascii
import logging
import sys
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("resumable")

STATE_KEY = "torch"  # in state.json's rng and epoch_rng: torch.get_rng_state()'s bytes, base64
STATE_LIMIT = 2**16  # characters: the CPU generator's state is 5056 bytes


def _torch() -> Any:
    return sys.modules.get("torch")


def rng_state() -> str | None:
    """torch's global (CPU) RNG state as base64 text; None when torch is not imported."""
    torch = _torch()
    if torch is None:
        return None
    return base64.b64encode(bytes(torch.get_rng_state().numpy())).decode("ascii")


def is_rng_state(text: Any) -> bool:
    """Whether ``text`` is what `rng_state` writes (its bytes are checked by torch when restored)."""
    if type(text) is not str or len(text) > STATE_LIMIT:
        return False
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def set_rng_state(text: str) -> None:
    """Restore torch's global RNG from `rng_state` text; nothing when torch is not imported (a
    checkpoint of a torch run resumed on another backend). One warning if torch refuses it."""
    torch = _torch()
    if torch is None:
        return
    state = torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
    try:
        torch.set_rng_state(state)
    except RuntimeError as e:  # another torch's generator layout
        logger.warning("resumable: torch's random state not restored (%s); the data order after "
                       "this resume may differ from an uninterrupted run's", " ".join(str(e).split()))


def loader_starts() -> None:
    """Draw what starting a ``DataLoader`` draws from torch's global RNG (its base seed), as
    Keras' torch trainer does when it reads a first batch to build the model: a real loader, of
    nothing, is started, so whatever this torch draws is drawn. Nothing when torch is not
    imported."""
    torch = _torch()
    if torch is None:
        return

    class Nothing(torch.utils.data.IterableDataset):  # type: ignore[name-defined]
        def __iter__(self) -> Iterator[Any]:
            return iter(())

    iter(torch.utils.data.DataLoader(Nothing(), batch_size=None))


def rest_of_epoch_batches(adapter: Any, batch: int, epoch_rng: dict[str, Any], total: int) -> Any:
    """The batches of an epoch after ``batch``, in the order Keras' torch trainer draws them from
    ``adapter`` (Keras' ``ArrayDataAdapter``), as a DataLoader ``model.fit`` takes as ``x``.

    Each time the loader is iterated (``fit`` may look at a first batch, then start again),
    torch's RNG is set to the epoch's start (``epoch_rng``) and the adapter's DataLoader is
    started as ``fit`` starts it: the same seeds are drawn, so the same order; then torch's RNG
    is put back as it was. The loader itself draws its seed as the adapter's does, from torch's
    global RNG, and has a length: at the epoch's end Keras starts it again as it starts the
    adapter's, drawing what an uninterrupted run draws there. Its draw at the start is undone
    by `continued_stream`.
    """
    torch = _torch()
    assert torch is not None  # the torch backend imported it

    def positioned() -> Iterator[Any]:
        saved = torch.get_rng_state()
        try:
            if STATE_KEY in epoch_rng:
                set_rng_state(epoch_rng[STATE_KEY])
            batches = iter(adapter.get_torch_dataloader())
            for _ in range(batch):
                next(batches)
        finally:
            torch.set_rng_state(saved)
        for _ in range(total - batch):
            yield next(batches)

    dataset = torch.utils.data.IterableDataset

    class Remaining(dataset):  # type: ignore[misc, valid-type]
        def __iter__(self) -> Iterator[Any]:
            return positioned()

        def __len__(self) -> int:
            return total - batch

    return torch.utils.data.DataLoader(Remaining(), batch_size=None)


def continued_stream(continues: bool, as_now: bool = False) -> list[Any]:
    """Callbacks for a ``fit`` that ``continues`` a data stream an uninterrupted run was reading
    (the rest of an epoch; a resumed fit whose ``steps_per_epoch`` makes Keras keep one
    iterator across epochs). [] when it does not, and off the torch backend. ``as_now``: the
    RNG is already where the uninterrupted run has it (after the rest of an epoch), so what
    ``fit`` draws before its first epoch begins is undone too."""
    import keras

    if not continues or keras.backend.backend() != "torch":
        return []

    class RngAsFitBegan(keras.callbacks.Callback):
        """Keras' torch trainer starts a DataLoader for the new fit, which draws a seed from torch's
        global RNG that an uninterrupted run drew when its stream began; unseeded Dropout, which
        draws from that RNG at every step, would then drop other units. The RNG as the first
        epoch began (after the checkpoint callback, earlier in the list, restored it) is put back
        when its first batch begins."""

        def __init__(self) -> None:
            super().__init__()
            self.state: Any = _torch().get_rng_state() if as_now else None
            self.started = as_now

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if not self.started:
                self.started = True
                self.state = _torch().get_rng_state()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.state is not None:
                _torch().set_rng_state(self.state)
                self.state = None

    return [RngAsFitBegan()]


def epoch_rest_ends(stream: bool) -> list[Any]:
    """A callback to put first in the list of a ``fit`` of the rest of an epoch of a ``stream``
    (``steps_per_epoch`` given: Keras reads one iterator across epochs). Keras' torch trainer
    starts that fit's DataLoader again once its last batch is read, drawing a seed from torch's
    global RNG that an uninterrupted run, still inside its stream, never draws: the RNG as the
    last batch left it is put back before validation starts, or before any other callback sees
    the epoch end (the checkpoint callback saves it there). Without ``steps_per_epoch`` an
    uninterrupted run starts its DataLoader again there too: []. [] off torch."""
    import keras

    if not stream or keras.backend.backend() != "torch":
        return []

    class RngAsLastBatchLeft(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.state: Any = None

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.state = _torch().get_rng_state()

        def _put_back(self) -> None:
            if self.state is not None:
                _torch().set_rng_state(self.state)
                self.state = None

        def on_test_begin(self, logs: Any = None) -> None:
            self._put_back()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._put_back()

    return [RngAsLastBatchLeft()]
