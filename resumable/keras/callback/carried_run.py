"""`CarriedRun`: what a `CheckpointCallback` carries of its run from one fit to the next.

The epochs done, the history of each epoch's logs, the best value of ``monitor``, whether
the run stopped early (and the checkpoint restored, and its batch), set in four ways:

1. `restore`: from a checkpoint `resume()` (or BackupAndRestore) restored, the reader told
   which checkpoint it was and which newer ones were found damaged (a commit may replace them);
2. `adopt`: from a model file the folder held before its first checkpoint;
3. `forget_run`: nothing restored (BackupAndRestore, before each fit of a callback it serves);
4. `start_over`: a new model, no epoch done (`Run`, after an exception with nothing saved).

A mixin of `CheckpointCallback`, whose parts (`restored_state`: a `fit_position.RestoredState`,
`schedule`, `builder`, `manager`) it sets; it touches none of the callback's private fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resumable.keras.callback.checkpoint_builder import CheckpointBuilder
    from resumable.keras.callback.fit_position import RestoredState
    from resumable.keras.callback.save_options import SaveOptions
    from resumable.keras.callback.save_schedule import SaveSchedule
    from resumable.manager import CheckpointInfo
    from resumable.manager.run_manager import RunManager


class CarriedRun:
    """Epochs done, history, best value and early stop of a callback's run (see the module docstring)."""

    options: SaveOptions
    manager: RunManager
    restored_state: RestoredState
    schedule: SaveSchedule
    builder: CheckpointBuilder
    epochs_done: int
    history: list[dict[str, float]]
    stopped_early: bool

    @property
    def restored(self) -> CheckpointInfo | None:
        """The checkpoint this run was restored from, or None."""
        return self.restored_state.checkpoint

    @property
    def resume_batch(self) -> int:
        """The batch the restored checkpoint was taken at, in its epoch (0: an epoch end)."""
        return self.restored_state.batch

    @property
    def best(self) -> float | None:
        """The best value of ``monitor`` so far (None: none yet)."""
        return self.schedule.best

    @best.setter
    def best(self, value: float | None) -> None:
        self.schedule.best = value

    def start_over(self) -> None:
        """The run begins again from a new model (Run, after an exception, with nothing saved):
        no epoch done, no history, the best as given at construction."""
        self.epochs_done = 0
        self.history = []
        self.best = self.schedule.initial_best

    def forget_run(self) -> None:
        """Before a fit of a callback that serves several (BackupAndRestore): nothing restored, no
        epoch done, no history, the best as given at construction; checkpoints found damaged stay so."""
        self.restored_state.forget()
        self.manager.resumed_from(None, self.manager.damaged)
        self.start_over()
        self.stopped_early = False
        self.builder.last_saved_step = None

    def restore(self, checkpoint: CheckpointInfo, state: dict[str, Any], arrays: dict[str, Any],
                damaged: set[str] | None = None) -> None:
        """Carry the state of a restored checkpoint: epochs done, best, history, other callbacks.

        ``damaged`` names newer checkpoints that failed verification; training replaces them.
        """
        manifest = checkpoint.manifest
        assert manifest is not None
        self.restored_state.take(checkpoint, state, arrays)
        self.manager.resumed_from(checkpoint, set(damaged or ()))
        self.epochs_done = manifest.epoch
        self.history = [{k: float(v) for k, v in logs.items()} for logs in state.get("history", [])]
        self.schedule.restore_best(state.get("best"), self.history, state.get("monitor"), state.get("mode"),
                                   source=checkpoint.url)
        self.stopped_early = bool(state.get("stopped_early", False))
        self.builder.last_saved_step = manifest.step

    def adopt(self, epochs_done: int, step: int, best: float | None, monitor: str | None) -> None:
        """Continue from a model file the folder held before its first checkpoint (`adopt`): its
        epochs done, and the best value its record kept when it monitored the same metric."""
        self.epochs_done = epochs_done
        self.history = [{} for _ in range(epochs_done)]  # epoch k's logs at index k, as a resumed run's
        if best is not None and monitor == self.options.monitor:
            self.best = float(best)
        self.builder.last_saved_step = step


__all__ = ["CarriedRun"]
