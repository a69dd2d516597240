"""What a restored checkpoint hands to the fits that continue it (`CheckpointCallback.restore`).

The other callbacks' states and the RNG states, given at the next fit's first epoch (Keras
resets callbacks when a fit begins); and for a checkpoint taken mid-epoch: the batch it was
taken at, the RNG states at the start of its epoch (they decide the epoch's data order), its
metrics' running totals and its optimizer's learning rate. Also where the inputs stood, for
`Run.fit`'s Feed.
"""

from __future__ import annotations

import logging
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


__all__ = ["RestoredState"]
