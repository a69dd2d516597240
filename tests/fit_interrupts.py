"""A Keras callback that interrupts a fit at a chosen batch, as Ctrl-C would (shared by tests)."""

from __future__ import annotations

from typing import Any

import keras


class InterruptAt(keras.callbacks.Callback):
    """Raise KeyboardInterrupt after batch ``batch`` (1-based) of epoch ``epoch`` (0-based):
    run.fit then saves a mid-epoch checkpoint there."""

    def __init__(self, epoch: int, batch: int) -> None:
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = -1

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if (self.epoch, batch + 1) == self.at:
            raise KeyboardInterrupt
