"""Where a running fit stands, for `CheckpointCallback`: the epoch and batch, and what is owed.

A checkpoint records the batch it was taken at and the RNG states that ordered its epoch's
data; an interrupt saves at the optimizer step reached. Two saves can be owed: an epoch end's,
held until the callbacks after the checkpoint callback have updated their state, and the hook
end that Run.fit's witness saw before an exception from another callback left it. And a stop:
a signal that asked to save and stop at the next batch end (`interrupts.StopSignals`).
"""

from __future__ import annotations

import signal
from typing import Any

import keras

from resumable.keras.callback.restored_state import RestoredState
from resumable.keras.checkpoint import training_state


class FitPosition:
    """The epoch and batch a fit is at, kept from the Keras hooks of one checkpoint callback."""

    def __init__(self) -> None:
        self.first_epoch = True  # the fit's first on_epoch_begin is still to come
        self.in_epoch = False
        self.batch = 0  # batches of the current epoch done, restored ones included
        self.start_step = 0  # optimizer iterations when the current epoch began
        self.epoch_rng: dict[str, Any] = {}  # the RNG states at the epoch's start: its data order
        self.pending_logs: dict[str, Any] | None = None  # the epoch's logs dict, shared by all callbacks
        self.witnessed: tuple[str, int, Any] | None = None  # a hook end seen first by the witness
        self.stop_signal: int | None = None  # a SIGINT/SIGTERM asked to save and stop

    @property
    def batches_in_epoch(self) -> int:
        """Batches of the current epoch done, restored ones included; 0 between epochs."""
        return self.batch if self.in_epoch else 0

    def fit_begins(self) -> None:
        self.first_epoch = True
        self.in_epoch = False
        self.pending_logs = None
        self.witnessed = None

    def epoch_begins(self, model: keras.Model, restored: RestoredState) -> int:
        """An epoch of ``model`` begins, ``restored.batch_offset`` batches in; the optimizer step now."""
        offset = restored.batch_offset
        step = training_state.iterations(model)
        self.batch = offset
        self.start_step = step - offset
        # The rest of a restored epoch: its data order came from the RNG states at its start.
        self.epoch_rng = restored.start_epoch(model)
        self.in_epoch = True
        return step

    def batch_ends(self, batch: int, offset: int) -> int:
        """Batch ``batch`` of this fit ended, ``offset`` batches into the epoch; the step it reached."""
        self.witnessed = None
        self.batch = offset + batch + 1
        return self.start_step + self.batch

    def epoch_ends(self) -> None:
        self.witnessed = None
        self.in_epoch = False

    def batch_at(self, step: int) -> int:
        """The batch of the current epoch that optimizer step ``step`` ends (0 or less: none yet)."""
        return step - self.start_step

    def take_pending(self) -> dict[str, Any] | None:
        """The logs of the epoch end whose save is owed, if any; it is no longer owed."""
        logs, self.pending_logs = self.pending_logs, None
        return logs

    def request_stop(self, signum: int) -> None:
        """Stop at the next batch end (Run.fit's signal handlers); Run.fit then saves."""
        self.stop_signal = signum

    def take_stop_request(self) -> int | None:
        """The signal that asked to stop and was not acted on yet; clears it."""
        signum, self.stop_signal = self.stop_signal, None
        return signum

    def stop_if_asked(self) -> None:
        """Stop as the signal that asked would have: SIGTERM exits with 128 + its number, SIGINT
        interrupts (`Run.fit` saves on the way out)."""
        signum = self.take_stop_request()
        if signum == signal.SIGTERM:
            raise SystemExit(128 + signal.SIGTERM)
        if signum is not None:
            raise KeyboardInterrupt

    def take_witnessed(self) -> tuple[str, int, Any] | None:
        """The hook end the witness saw that this callback had not reached, if any."""
        seen, self.witnessed = self.witnessed, None
        return seen


def runs_last(callback: keras.callbacks.Callback, callbacks: list[keras.callbacks.Callback]) -> bool:
    """True when no callback that keeps state runs after this one (Keras' History and progress bar don't)."""
    after = callbacks[callbacks.index(callback) + 1:] if callback in callbacks else []
    passive = (keras.callbacks.History, keras.callbacks.ProgbarLogger)
    return all(isinstance(c, passive) for c in after)


__all__ = ["FitPosition", "runs_last"]
