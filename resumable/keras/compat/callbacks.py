"""Keras callbacks' private parts: TensorBoard's step counters and writers, and what
resumable.ModelCheckpoint overrides and calls of ``keras.callbacks.ModelCheckpoint``.

Reaches ``TensorBoard._global_train_batch``, ``_global_test_batch`` and ``_writers``, and
``ModelCheckpoint._save_model``, ``_get_file_path``, ``_should_save_model`` (Keras 3.10+;
before, its decision is made here as those versions make it), ``monitor_op`` and ``best``; and
``keras.src.utils.io_utils.print_msg``, the print of Keras' callbacks (no public name for it);
and whether ``_save_model``'s source prints a "finished saving" line.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from typing import Any

import keras
import numpy as np

from resumable.keras.compat.messages import unsupported

# keras.callbacks.TensorBoard's step counters: the step of each batch-level summary (and of the
# validation's). on_train_begin sets the first to 0, so a resumed run would write its batches'
# summaries over the first session's; saved and restored like EarlyStopping's fields.
TENSORBOARD_COUNTERS = ("_global_train_batch", "_global_test_batch")


def flush_tensorboard(callbacks: list[keras.callbacks.Callback]) -> None:
    """Write out what each ``keras.callbacks.TensorBoard`` holds in its writers' queues (its
    ``_writers``): an interrupted fit never calls its ``on_train_end``, and the summaries of the
    batches before the interrupt would be lost. Nothing without ``_writers``."""
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.TensorBoard):
            for writer in list(getattr(callback, "_writers", {}).values()):
                with contextlib.suppress(Exception):  # a writer already closed
                    writer.flush()


# What resumable.ModelCheckpoint overrides or calls of keras.callbacks.ModelCheckpoint, with the
# parameters each must take. `_should_save_model` is Keras 3.10's: before, `_save_model` decided inline.
_MODEL_CHECKPOINT_METHODS = {
    "_save_model": ("epoch", "batch", "logs"),
    "_should_save_model": ("epoch", "batch", "logs", "filepath"),
    "_get_file_path": ("epoch", "batch", "logs"),
}
_OPTIONAL_METHODS = ("_should_save_model",)


@functools.cache
def model_checkpoint_internals() -> str | None:
    """None when ``keras.callbacks.ModelCheckpoint`` has the private methods resumable.ModelCheckpoint
    overrides (``_save_model``) and calls (``_get_file_path``; ``_should_save_model`` where it
    exists, see `should_save_model`), with their parameters; else one line naming the Keras
    version and what is missing."""
    base = keras.callbacks.ModelCheckpoint
    for name, params in _MODEL_CHECKPOINT_METHODS.items():
        method = getattr(base, name, None)
        if method is None and name in _OPTIONAL_METHODS:
            continue
        try:
            found = tuple(inspect.signature(method).parameters)[1:] if method is not None else None
        except (TypeError, ValueError):
            found = None
        if found != params:
            return unsupported(f"keras.callbacks.ModelCheckpoint.{name}{params}") + (
                "; use keras.callbacks.ModelCheckpoint, or a Keras version resumable supports")
    return None


@functools.cache
def says_finished_saving() -> bool:
    """Whether Keras' ModelCheckpoint prints "Epoch N: finished saving model to ..." after each
    save with verbose (Keras 3.13 does; 3.8 and 3.10 do not): read in ``_save_model``'s source.
    Where the source cannot be read, as the newest Keras does."""
    try:
        return "finished saving" in inspect.getsource(keras.callbacks.ModelCheckpoint._save_model)
    except (OSError, TypeError, AttributeError):
        return True


def should_save_model(callback: keras.callbacks.ModelCheckpoint, epoch: int, batch: int | None,
                      logs: dict[str, Any] | None, filepath: str) -> bool:
    """Whether Keras' ModelCheckpoint would save now (printing and warning as it does; the new
    best kept in ``callback.best``): its ``_should_save_model`` (Keras 3.10+); on Keras 3.8 and
    3.9, which decide inside ``_save_model``, the decision those versions make there."""
    if getattr(keras.callbacks.ModelCheckpoint, "_should_save_model", None) is not None:
        return bool(callback._should_save_model(epoch, batch, logs, filepath))
    return _decided_as_keras_3_8(callback, epoch, logs or {}, filepath)


def _decided_as_keras_3_8(callback: keras.callbacks.ModelCheckpoint, epoch: int, logs: dict[str, Any],
                          filepath: str) -> bool:
    """Keras 3.8's and 3.9's save decision: without a monitored value, skip (3.10 saves); a
    value that is no scalar, save as if not save_best_only; else save on an improvement."""
    import warnings

    say = print_msg if callback.verbose > 0 else (lambda message: None)
    if not callback.save_best_only:
        say(f"\nEpoch {epoch + 1}: saving model to {filepath}")
        return True
    current = logs.get(callback.monitor)
    if current is None:
        warnings.warn(f"Can save best model only with {callback.monitor} available, skipping.", stacklevel=4)
        return False
    if (isinstance(current, np.ndarray) or keras.ops.is_tensor(current)) and len(current.shape) > 0:
        warnings.warn("Can save best model only when `monitor` is a scalar value. Received: "
                      f"{current}. Falling back to `save_best_only=False`.", stacklevel=4)
        return True
    if callback.monitor_op(current, callback.best):
        say(f"\nEpoch {epoch + 1}: {callback.monitor} improved from {callback.best:.5f} to {current:.5f}, "
            f"saving model to {filepath}")
        callback.best = current
        return True
    say(f"\nEpoch {epoch + 1}: {callback.monitor} did not improve from {callback.best:.5f}")
    return False


def print_msg(message: str) -> None:
    """Print one line as Keras' callbacks print theirs: Keras' ``print_msg`` (stdout, or absl's log
    when interactive logging is off). ``keras.utils.io_utils`` is no public name: Keras 3.8 has
    none (``keras.api.utils`` holds no ``io_utils``), so it is reached in ``keras.src``; without it,
    stdout under the same public switch."""
    try:
        from keras.src.utils.io_utils import print_msg as keras_print_msg
    except ImportError:
        keras_print_msg = None
    if keras_print_msg is not None:
        keras_print_msg(message)
    elif keras.config.is_interactive_logging_enabled():
        sys.stdout.write(f"{message}\n")
        sys.stdout.flush()
