"""A drop-in fit that continues from a saved model (``model.fit(initial_epoch=N)`` after
`load_newest_model`): what it restores and what restarts, said in one line at its first epoch.

A model file holds the weights and the optimizer state (so the learning rate ReduceLROnPlateau
set), not the callbacks' counters, nor the data order an unbroken fit would have drawn. The
ModelCheckpoint's own best value is in its files' checksum records: taken back from the newest
record of its template. Under `run.fit` none of this is said: resume() restores every callback's
state itself.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import keras

from resumable.core.display import printable
from resumable.keras import compat
from resumable.keras.dropins import adopt

logger = logging.getLogger("resumable")


def say_what_restarts(checkpoint: keras.callbacks.ModelCheckpoint, epoch: int,
                      storage_options: dict[str, Any] | None) -> None:
    """At the first epoch of a fit: if it continues (``epoch > 0``) outside `run.fit`, take the
    ModelCheckpoint's best value back from its records and print one line saying what restarts."""
    if epoch <= 0:
        return
    callbacks = compat.running_fit_callbacks(checkpoint)
    if any(type(c).__name__ == "CheckpointCallback" and type(c).__module__.startswith("resumable.")
           for c in callbacks):
        return  # run.fit: restored from the run's checkpoint
    restored = _best_from_records(checkpoint, epoch, storage_options)
    restarts = [what for c in callbacks if (what := _restarting(c))]
    if checkpoint.save_best_only and restored is None:
        restarts.append(f"this ModelCheckpoint's best {checkpoint.monitor}")
    restarts.append("the data order (shuffles are drawn anew)")
    kept = (f"; its best {checkpoint.monitor} ({restored[1]:.4g}) is taken from {restored[0]}'s record"
            if restored is not None else "")
    line = printable(
        f"resumable: fit continues at epoch {epoch + 1} from the saved model's weights and optimizer "
        f"state{kept}; as in a new fit, {_listed(restarts)} restart (resumable.resume() and run.fit "
        "carry them)")
    print(line, file=sys.stderr, flush=True)
    logger.info("%s", line)


def _restarting(callback: keras.callbacks.Callback) -> str | None:
    if isinstance(callback, keras.callbacks.EarlyStopping):
        weights = " and best weights" if callback.restore_best_weights else ""
        return f"EarlyStopping's wait, best {callback.monitor}{weights}"
    if isinstance(callback, keras.callbacks.ReduceLROnPlateau):
        return f"ReduceLROnPlateau's wait, cooldown and best {callback.monitor}"
    if isinstance(callback, keras.callbacks.CSVLogger) and not callback.append:
        return f"CSVLogger's file {callback.filename} (append=False: written anew)"
    return None


def _best_from_records(checkpoint: keras.callbacks.ModelCheckpoint, epoch: int,
                       storage_options: dict[str, Any] | None) -> tuple[str, float] | None:
    """The best value the newest record of this template (epochs up to ``epoch``, this monitor)
    holds, set as the callback's; None when there is none, or the callback has a best already."""
    if checkpoint.best is not None and math.isfinite(float(checkpoint.best)):
        return None  # initial_value_threshold, or a best of this fit's own
    folder, _, name = str(checkpoint.filepath).replace("\\", "/").rpartition("/")
    try:
        files = adopt.candidates(folder or ".", template=name, storage_options=storage_options)
    except Exception as e:  # noqa: BLE001 - a listing that fails costs the best value, never the fit
        logger.info("resumable: %s: the records were not read (%s)", folder, e)
        return None
    for file in files:  # newest first
        best = file.details.get("best")
        if (file.kind == adopt.RESUMABLE_FILE and not file.problem and file.epochs_done is not None
                and file.epochs_done <= epoch and file.details.get("monitor") == checkpoint.monitor
                and isinstance(best, (int, float)) and math.isfinite(best)):
            checkpoint.best = float(best)
            return file.name, float(best)
    return None


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{'; '.join(items[:-1])} and {items[-1]}"


__all__ = ["say_what_restarts"]
