"""Stock callbacks whose effects outlive ``fit``, continued across sessions by `Run.fit`.

- ``CSVLogger``: a resumed run appends to its file, after the rows of the epochs the checkpoint
  holds; rows of epochs a lost session logged after its newest checkpoint are dropped first,
  so the file ends as an unbroken run's does: one row per epoch.
- ``EarlyStopping(restore_best_weights=True)``: at the end of training Keras puts the best
  epoch's weights into the model. Running a finished run's notebook again must leave the model
  as the run ended, not with the last checkpoint's weights: `final_weights` does what Keras did.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np

from resumable.core.display import printable

logger = logging.getLogger("resumable")


@contextlib.contextmanager
def csv_logs_continued(callbacks: Sequence[keras.callbacks.Callback], epochs_done: int) -> Iterator[None]:
    """Inside: each ``CSVLogger`` appends (a resumed run: ``epochs_done`` > 0), its file holding
    only rows of the first ``epochs_done`` epochs. Its ``append`` is put back after."""
    loggers = [c for c in callbacks if isinstance(c, keras.callbacks.CSVLogger)] if epochs_done else []
    saved = [c.append for c in loggers]
    for csv_logger in loggers:
        _drop_rows_from(csv_logger.filename, csv_logger.sep, epochs_done)
        csv_logger.append = True
    try:
        yield
    finally:
        for csv_logger, append in zip(loggers, saved, strict=True):
            csv_logger.append = append


def _drop_rows_from(path: str, separator: str, epoch: int) -> None:
    """Cut the file's trailing rows whose epoch is ``epoch`` or later (a lost session's)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return  # no file yet (a new runtime's disk): CSVLogger starts one, with a header
    cut = len(data)
    lines = data.splitlines(keepends=True)
    for line in reversed(lines[1:]):  # never the header
        first = line.split(separator.encode(), 1)[0].strip()
        if not first.isdigit() or int(first) < epoch:
            break
        cut -= len(line)
    if cut == len(data):
        return
    dropped = sum(1 for _ in data[cut:].splitlines())
    with open(path, "r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    logger.info("resumable: %s: dropped %d rows of epochs after the checkpoint's (a lost session's)",
                printable(path), dropped)


def final_weights(model: keras.Model, callbacks: Sequence[keras.callbacks.Callback],
                  give_state: Callable[[Sequence[keras.callbacks.Callback]], Any], last_epoch: int) -> str:
    """After a run that is over (complete or stopped early): the weights an unbroken run ends with,
    put into ``model``, and which epoch's they are, in words.

    ``give_state`` restores the checkpoint's callback states into ``callbacks``; each
    ``EarlyStopping`` with ``restore_best_weights`` then ends training as Keras does
    (``on_train_end``, which restores its best weights in Keras 3.x).
    """
    stoppers = [c for c in callbacks if isinstance(c, keras.callbacks.EarlyStopping)
                and getattr(c, "restore_best_weights", False)]
    if stoppers:
        give_state(callbacks)
    for stopper in stoppers:
        best = getattr(stopper, "best_weights", None)
        if best is None:
            continue
        stopper.set_model(model)
        stopper.on_train_end()
        if all(np.array_equal(a, b) for a, b in zip(model.get_weights(), best, strict=True)):
            return (f"run.model holds the weights of epoch {int(stopper.best_epoch) + 1}, the best "
                    f"{stopper.monitor} (EarlyStopping restore_best_weights=True)")
    return f"run.model holds the weights of epoch {last_epoch}, the last"


__all__ = ["csv_logs_continued", "final_weights"]
