"""When `CheckpointCallback` saves: "is a save due?" at a batch end (``save_freq`` steps, the
``save_interval`` timer) and at an epoch end (``save_best_only``, the best value of ``monitor``).

Numbers in, yes or no out: no model, no Keras; the clock is passed in, so it is tested with
plain numbers (tests/keras/test_save_schedule.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from resumable.core import user_warnings
from resumable.core.policy import is_better


class SaveSchedule:
    """Decides the saves of one callback and keeps the best value of ``monitor`` so far.

    Args:
        save_freq: ``"epoch"``, or N to save when the optimizer's step passes a multiple of N.
        save_interval: Seconds of training after which a batch end saves; None: never.
        monitor: The metric that defines the best checkpoint.
        mode: ``"min"`` or ``"max"``.
        save_best_only: Save at an epoch end only when ``monitor`` improves.
        keep_best: How many best checkpoints retention keeps (a warning names a monitor not logged).
        initial_best: The value ``monitor`` must beat to count as the first best.
        clock: Seconds, monotonic. Defaults to ``time.monotonic``.
    """

    def __init__(self, save_freq: str | int, save_interval: float | None, monitor: str, mode: str, *,
                 save_best_only: bool = False, keep_best: int = 0, initial_best: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.save_freq = save_freq
        self.save_interval = save_interval
        self.monitor = monitor
        self.mode = mode
        self.save_best_only = save_best_only
        self.keep_best = keep_best
        self.initial_best = initial_best
        self.best = initial_best
        self._clock = clock
        self._step = 0  # the optimizer step at the last batch end seen
        self._last_save = clock()
        self._monitor_warned = False

    # ------------------------------------------------------------------ batch ends

    def restart_clock(self) -> None:
        """The interval counts from now: a fit's start, a save (training time, not saving time)."""
        self._last_save = self._clock()

    def epoch_begins(self, step: int) -> None:
        """The optimizer's step at the start of an epoch (or of the rest of a restored one)."""
        self._step = step

    def due_at_batch(self, step: int) -> bool:
        """Whether the batch end that brought the optimizer to ``step`` saves: a multiple of
        ``save_freq`` was reached or passed since the last batch end (``steps_per_execution``
        moves several at once), or ``save_interval`` seconds went by since the last save."""
        due = False
        if self.save_freq != "epoch":
            every = int(self.save_freq)
            due = step // every > self._step // every
        self._step = step
        if self.save_interval is not None and self._clock() - self._last_save >= self.save_interval:
            due = True
        return due

    # ------------------------------------------------------------------ the best value

    def keeps(self, epoch: int, logs: dict[str, float], *, mid_epoch: bool) -> bool:
        """Whether a checkpoint with these ``logs`` is saved, taking its value as the new best
        when it improves. A mid-epoch value is a running average of part of an epoch: never a
        best. With ``save_best_only``, a ``monitor`` that fit does not log is said at once."""
        current = logs.get(self.monitor) if not mid_epoch else None
        if current is None and not mid_epoch and self.save_best_only:
            _check_monitor_logged(self.monitor, epoch, logs)
        elif current is None and not mid_epoch and self.keep_best and not self._monitor_warned:
            self._monitor_warned = True
            logged = ", ".join(sorted(logs)) or "nothing"
            user_warnings.warn(
                f"resumable: monitor={self.monitor!r} is not among the metrics fit logged at the end of "
                f"epoch {epoch} ({logged}), so keep_best={self.keep_best} protects no checkpoint; "
                "pass monitor= one of those (Keras 3 logs 'val_accuracy', not 'val_acc')",
            )
        improved = current is not None and is_better(current, self.best, self.mode)
        if self.save_best_only and not improved:
            return False
        if improved:
            self.best = current
        return True

    def restore_best(self, best: Any, history: list[dict[str, float]], monitor: str | None,
                     mode: str | None, *, source: str) -> None:
        """Take the best value of a restored checkpoint (``source`` names it). One that tracked
        another ``monitor`` or ``mode`` gives the best over the run's ``history`` instead, said
        in a warning (none when there was no best then and there is none in the history)."""
        self.best = None if best is None else float(best)
        if monitor is None or (monitor, mode) == (self.monitor, self.mode):
            return
        self.best = self.best_in_history(history)
        if (best, self.best) != (None, None):
            user_warnings.warn(
                f"resumable: {source} tracked the best {monitor!r} (mode {mode!r}); this run monitors "
                f"{self.monitor!r} (mode {self.mode!r}), so its best is taken from the run's history: "
                f"{self.best}",
            )

    def best_in_history(self, history: list[dict[str, float]]) -> float | None:
        """The best value of ``monitor`` over a run's epochs (a run that monitored another metric)."""
        best = self.initial_best
        for logs in history:
            value = logs.get(self.monitor)
            if value is not None and is_better(value, best, self.mode):
                best = value
        return best


def _check_monitor_logged(monitor: str, epoch: int, logs: dict[str, float]) -> None:
    """With save_best_only, a monitor that fit does not log means no checkpoint, ever: say so at once.

    A ``val_`` metric in an epoch without validation (no validation_data, or validation_freq)
    is a warning; a name that is not among the metrics logged is an error, at the first epoch.
    """
    logged = ", ".join(sorted(logs)) or "nothing"
    if monitor.startswith("val_") and not any(key.startswith("val_") for key in logs):
        user_warnings.warn(
            f"resumable: monitor={monitor!r} is not logged without validation and save_best_only=True "
            f"saves no checkpoint until it is; pass validation_data to fit (logged: {logged})",
        )
        return
    raise ValueError(
        f"Invalid value for argument `monitor`. Received: monitor={monitor!r}, which fit did not log at "
        f"the end of epoch {epoch}: with save_best_only=True no checkpoint would ever be saved. "
        f"Expected one of: {logged}."
    )


__all__ = ["SaveSchedule"]
