"""Where a fit stands, for `CheckpointCallback`: the position a restored checkpoint hands to the
fits that continue it (`RestoredState`), and the one a running fit is at (`FitPosition`).

`RestoredState` (`CheckpointCallback.restore`): the other callbacks' states and the RNG states,
given at the next fit's first epoch (Keras resets callbacks when a fit begins); and for a
checkpoint taken mid-epoch: the batch it was taken at, the RNG states at the start of its epoch
(they decide the epoch's data order), its metrics' running totals and its optimizer's learning
rate. Also where the inputs stood, for `Run.fit`'s Feed.

`FitPosition`: the epoch and batch a running fit is at, and what is owed. A checkpoint records
the batch it was taken at and the RNG states that ordered its epoch's data; an interrupt saves
at the optimizer step reached. Two saves can be owed: an epoch end's, held until the callbacks
after the checkpoint callback have updated their state, and the hook end that Run.fit's witness
saw before an exception from another callback left it. And a stop: a signal that asked to save
and stop at the next batch end (`interrupts.StopSignals`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from typing import Any

import keras

from resumable.core import user_warnings
from resumable.keras.checkpoint import training_state
from resumable.keras.replay.inputs import describe, plain_fit_problem
from resumable.manager import CheckpointInfo

logger = logging.getLogger("resumable")


class RestoredState:
    """The restored checkpoint's state, held until the fit that continues it takes it."""

    def __init__(self) -> None:
        self.checkpoint: CheckpointInfo | None = None  # the checkpoint restored from
        self.batch = 0  # batches of its epoch done when it was taken (0: at an epoch end)
        self.epoch_rng: dict[str, Any] | None = None  # the RNG states at the start of that epoch
        # Streams' positions at the restored (then the newest saved) checkpoint, for Run.fit's Feed.
        self.inputs: dict[str, Any] = {}
        self.batch_offset = 0  # batches of the current epoch done before this fit (set by Run.fit)
        self._pending: dict[str, Any] | None = None  # other callbacks' states and the RNG's
        self._arrays: dict[str, Any] = {}
        self._metrics: dict[str, Any] = {}  # the epoch's metrics' running totals
        self._learning_rate: Any = None  # the optimizer's rate in a restored mid-epoch checkpoint
        self._said_plain_fit = False

    def take(self, checkpoint: CheckpointInfo, state: dict[str, Any], arrays: dict[str, Any]) -> None:
        """Hold checkpoint ``checkpoint``'s state.json ``state`` and arrays.npz ``arrays``."""
        manifest = checkpoint.manifest
        assert manifest is not None
        self.checkpoint = checkpoint
        self._pending = {"callbacks": state.get("callbacks", {}), "rng": state.get("rng", {})}
        self._arrays = arrays
        self.batch = int(manifest.batch or 0)
        self.epoch_rng = state.get("epoch_rng") if self.batch else None
        self.inputs = state.get("inputs") or {}
        self._metrics = {k: v for k, v in arrays.items() if k.startswith("metrics/")}

    def forget(self) -> None:
        """Nothing restored (BackupAndRestore, before each fit)."""
        self.checkpoint = None
        self._pending = None
        self._arrays = {}
        self.replay_epoch()

    def replay_epoch(self) -> None:
        """The restored mid-epoch checkpoint's epoch restarts from its first batch."""
        self.batch = 0
        self.epoch_rng = None
        self._metrics = {}

    def carry_over(self, callbacks: Sequence[keras.callbacks.Callback]) -> None:
        """Hand ``callbacks``' state to the next fit of this session (Keras resets it)."""
        states, arrays = training_state.callback_states(callbacks)
        self._pending = {"callbacks": states, "rng": {}}
        self._arrays = arrays

    def give_state(self, callbacks: Sequence[keras.callbacks.Callback]) -> None:
        """Restore the other callbacks' states into ``callbacks`` now, leaving them held."""
        if self._pending is not None:
            training_state.restore_callback_states(callbacks, self._pending["callbacks"], self._arrays)

    def hand_over(self, callbacks: Sequence[keras.callbacks.Callback], epoch: int, run: str) -> None:
        """A fit's first epoch, ``epoch`` of the run in folder ``run``: the other callbacks' states
        into ``callbacks``, the RNG states set; a mid-epoch checkpoint's epoch restarts from its
        first batch unless the fit starts at that batch (`begin_partial_epoch`)."""
        if self.batch and not self.batch_offset:
            user_warnings.warn(
                f"resumable: {self.checkpoint.url if self.checkpoint else run} was saved "
                f"{self.batch} batches into epoch {epoch + 1}; model.fit cannot start there, so "
                "that epoch restarts from its first batch (run.fit continues at the saved batch)"
            )
            self.replay_epoch()
        if self._pending is None:
            return
        restored = training_state.restore_callback_states(callbacks, self._pending["callbacks"], self._arrays)
        training_state.set_rng_state(self._pending["rng"])
        if restored:
            logger.info("resumable: restored the state of %s", ", ".join(restored))
        self._pending = None
        self._arrays = {}

    def begin_partial_epoch(self, batch: int, model: keras.Model) -> None:
        """The next fit of ``model`` runs the rest of the restored checkpoint's epoch, from ``batch``."""
        self.batch_offset = batch
        self._learning_rate = training_state.learning_rate(model)

    def start_epoch(self, model: keras.Model) -> dict[str, Any]:
        """An epoch begins (``batch_offset`` batches into it): the RNG states at its start."""
        if self.batch_offset:
            # Its on_epoch_begin ran in the session that saved it; callbacks that set the learning
            # rate there (LearningRateScheduler) just did it again: the checkpoint's rate stands.
            training_state.set_learning_rate(model, self._learning_rate)
            return self.epoch_rng or {}
        self._metrics = {}
        return training_state.rng_state()

    def end_epoch(self) -> None:
        """An epoch ended: the next one starts at its first batch."""
        self.batch_offset = 0
        self.batch = 0

    def say_if_plain_fit_cannot_replay(self, x: Any) -> None:
        """A resumed run trained by a plain ``model.fit`` on input ``x``: once, when that input is
        not read as an unbroken run reads it (`Run.fit` replays it)."""
        problem = None if x is None else plain_fit_problem(x)
        if problem is not None and not self._said_plain_fit:
            self._said_plain_fit = True
            user_warnings.warn(f"resumable: the training input ({describe(x)}) cannot be replayed exactly: "
                               f"{problem}")

    def add_metrics(self, model: keras.Model, logs: dict[str, Any] | None = None) -> None:
        """Once the first batch of a resumed epoch has built ``model``'s metrics, add the saved
        totals (once); and correct that batch's ``logs`` (the dict every callback after this
        call is given), which Keras computed from the one batch."""
        if not self._metrics:
            return
        saved, self._metrics = self._metrics, {}
        try:
            added = training_state.add_metrics(model, saved)
        except Exception as e:  # noqa: BLE001 - metrics are reporting; training goes on
            logger.warning("resumable: could not restore the epoch's metric totals: %s", e)
            added = True
        if not added:
            logger.warning("resumable: this epoch's metrics count from the resumed batch only "
                           "(the saved metric states do not fit)")
        if logs is not None:
            floats = training_state.logs_to_floats(training_state.metrics_so_far(model))
            logs.update({k: v for k, v in floats.items() if k in logs})



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


__all__ = ["FitPosition", "RestoredState", "runs_last"]
