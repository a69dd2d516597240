"""Ctrl-C and SIGTERM during `Run.fit`: save a checkpoint at the next batch end, then stop.

Colab's "stop cell" is a SIGINT; a VM being recycled may send SIGTERM first. Either way the
work since the last checkpoint is saved before training stops (`StopSignals`), or where the
interrupt left the fit (`save_interrupted`). And an exception from another callback: `Witness`
tells the checkpoint callback of each epoch and batch end first, so that the checkpoint of the
hook the exception left is still saved (`save_after_error`). After any exception left the fit
(`after_fit_error`): those saves, the uploads waited for, one line saying where to resume.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import keras

from resumable.core import user_warnings
from resumable.core.errors import LeaseLostError, ResumableError
from resumable.keras import compat
from resumable.keras.checkpoint import training_state

if TYPE_CHECKING:
    from resumable.keras.callback.checkpoint_callback import CheckpointCallback

logger = logging.getLogger("resumable")


class StopSignals:
    """During Run.fit: SIGTERM and SIGINT ask the callback to save and stop at the next batch end.

    A second signal gets the previous behaviour at once (KeyboardInterrupt, or death by SIGTERM).
    Only the main thread can install handlers; elsewhere nothing changes.
    """

    def __init__(self, callback: CheckpointCallback) -> None:
        self.callback = callback
        self.received: int | None = None  # asked, not yet acted on by the callback
        self.handled: int | None = None  # the first signal
        self.abandoned = False  # a second signal: stop without saving
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                current = signal.getsignal(signum)
                if current is None or current == signal.SIG_IGN:
                    continue  # ignored on purpose, or a handler Python could not put back
                try:
                    self._previous[signum] = signal.signal(signum, self._handle)
                except (ValueError, OSError):  # not settable here (embedded interpreters)
                    continue
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self.callback.position.take_stop_request() is None:
            self.received = None  # the callback acted on it

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A process forked during training (a PyDataset's multiprocessing worker, which Keras
            # stops with SIGTERM) inherited this handler: it saves nothing, so act as before us.
            self._act_as_before(signum, frame)
            return
        if self.handled is not None:
            self.abandoned = True
            self._act_as_before(signum, frame)
            return
        self.handled = self.received = signum
        name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        print(f"\nresumable: {name}: saving a checkpoint at the end of this batch, then stopping "
              f"(send it again to stop at once)", file=sys.stderr, flush=True)
        self.callback.position.request_stop(signum)

    def _act_as_before(self, signum: int, frame: FrameType | None) -> None:
        """What the handler in place before ours does: put it back and run it."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)  # Python's default SIGINT handler raises KeyboardInterrupt
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            os.kill(os.getpid(), signum)  # SIG_DFL: die by the signal, as without us


class Witness(keras.callbacks.Callback):
    """First among Run.fit's callbacks: tells the checkpoint callback of each epoch and batch end
    before any other callback runs, so an exception raised by one of them still leaves that
    epoch's or step's checkpoint to save (`save_after_error`)."""

    def __init__(self, owner: CheckpointCallback) -> None:
        super().__init__()
        self.owner = owner

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.owner.position.witnessed = ("epoch", epoch, logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.owner.position.witnessed = ("batch", batch, logs)
        # the others then see the epoch's running metrics
        self.owner.restored_state.add_metrics(self.owner.model, logs)


def save_interrupted(callback: CheckpointCallback) -> str | None:
    """Save where an interrupted fit stands: a mid-epoch checkpoint at the batch reached.

    Called by `Run.fit` when a KeyboardInterrupt or SIGTERM leaves ``model.fit``. The batch
    comes from the optimizer's iterations, so an interrupt raised by a callback that runs
    before ``callback`` is placed right. Nothing is saved when that step is already saved.
    Returns why nothing was saved, or None.
    """
    if callback.manager.job is not None:  # #36
        return ("a model split across processes is saved where every process saves (save_freq, "
                "epoch ends), never after an interrupt of one process: not saved")
    position = callback.position
    if position.pending_logs is not None:
        callback.save_owed()
        return None
    model = callback.model  # on JAX, reading it syncs the training state into the variables
    if not position.in_epoch or model is None:
        return None
    step = training_state.iterations(model)
    batch = position.batch_at(step)
    if batch <= 0 or step == callback.builder.last_saved_step:
        return None
    steps = (callback.params or {}).get("steps")
    if steps is not None and batch >= steps + callback.restored_state.batch_offset:
        return (f"interrupted after the last batch of epoch {callback.epochs_done + 1}, before its end "
                "(validation, callbacks): not saved")
    if callback.save_best_only:
        return "save_best_only=True saves only improvements at epoch ends: not saved"
    callback.save_checkpoint(batch, training_state.logs_to_floats(training_state.metrics_so_far(model)))
    return None


def save_after_error(callback: CheckpointCallback) -> None:
    """An exception from another callback ended fit in a hook ``callback`` had not reached yet:
    save what it would have saved there (as Keras' ModelCheckpoint before it would)."""
    seen = callback.position.take_witnessed()
    if seen is None or callback.model is None or callback.manager.job is not None:  # #36: as above
        return
    kind, index, logs = seen
    if kind == "epoch":
        callback.on_epoch_end(index, logs)
    elif callback.position.in_epoch:
        callback.on_train_batch_end(index, logs)
    callback.save_owed()


def after_fit_error(callback: CheckpointCallback, error: BaseException, stops: StopSignals) -> None:
    """After an exception left model.fit: save an interrupt's state, wait for uploads, say where."""
    callback.lines.print_lines(fit_ended=True)
    compat.flush_tensorboard(callback.callbacks or [])  # Keras skips their on_train_end
    interrupt = isinstance(error, KeyboardInterrupt) or (
        isinstance(error, SystemExit) and stops.handled == signal.SIGTERM
    )
    if not stops.abandoned:
        try:  # another callback raised before ours ran in that hook: save what Keras' would have
            save_after_error(callback)
        except Exception as e:  # noqa: BLE001 - never mask the exception
            user_warnings.warn(f"resumable: could not save after the error: {e}")
    if not interrupt or stops.abandoned:
        finish_uploads(callback, quiet=True)
        return
    note = None
    try:
        note = save_interrupted(callback)
    except Exception as e:  # noqa: BLE001 - never mask the interrupt
        note = f"could not save the interrupted state: {e}"
    finish_uploads(callback, quiet=True)
    latest = callback.manager.last_checkpoint
    where = f"{latest.url} (epoch {latest.epoch}" if latest else None
    if where and latest and latest.manifest is not None and latest.manifest.batch:
        where += f" + {latest.manifest.batch} batches"
    if note:
        message = f"resumable: {note}; the newest checkpoint is {where + ')' if where else 'none'}"
    elif where:
        message = f"resumable: interrupted; saved {where}); run the same code again to resume there"
    else:
        message = "resumable: interrupted before any checkpoint was saved"
    print(message, flush=True)
    logger.info("%s", message)


def finish_uploads(callback: CheckpointCallback, quiet: bool) -> None:
    """Wait for the uploads; ``quiet``: their error a warning (an exception already ends the fit)."""
    try:
        callback.wait_for_uploads()
    except ResumableError as e:
        if not quiet:
            raise
        if isinstance(e, LeaseLostError):  # said once, by the error that ends the fit
            logger.info("resumable: %s", e)
            return
        user_warnings.warn(f"resumable: {e}")


__all__ = ["StopSignals", "Witness", "after_fit_error", "finish_uploads", "save_after_error",
           "save_interrupted"]
