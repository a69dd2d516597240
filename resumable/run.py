"""`resume()`: continue a run from its newest good checkpoint, or start it."""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras

from resumable import keras_io
from resumable.callback import CheckpointCallback
from resumable.errors import CheckpointNotFoundError, CorruptCheckpointError, ResumableError
from resumable.storage import CheckpointInfo

logger = logging.getLogger("resumable")


class Run:
    """A run restored by `resume`: the model, where it stands, and a `fit` that continues it.

    Attributes:
        model: The restored model, or ``build_model()``'s for a new run.
        callback: The `CheckpointCallback` for the run folder, carrying the restored state.
        checkpoint: The checkpoint restored from (``.epoch``, ``.step``, ``.metrics``, ``.url``),
            or None for a new run.
        strategy: The ``tf.distribute`` strategy given to `resume`, or None.
    """

    def __init__(self, model: keras.Model, callback: CheckpointCallback, checkpoint: CheckpointInfo | None,
                 strategy: Any = None) -> None:
        self.model = model
        self.callback = callback
        self.checkpoint = checkpoint
        self.strategy = strategy

    def __repr__(self) -> str:
        source = self.checkpoint.name if self.checkpoint else "new run"
        return f"Run({self.callback.filepath!r}, initial_epoch={self.initial_epoch}, from={source})"

    @property
    def initial_epoch(self) -> int:
        """Epochs done so far (0 for a new run); the next fit starts there."""
        return self.callback.epochs_done

    @property
    def history(self) -> dict[str, list[float]]:
        """Per-epoch logs of every epoch so far, across sessions, as in ``keras.callbacks.History``."""
        merged: dict[str, list[float]] = {}
        for epoch, logs in enumerate(self.callback.history):
            for key, value in logs.items():
                merged.setdefault(key, [float("nan")] * epoch).append(value)
            for values in merged.values():
                values.extend([float("nan")] * (epoch + 1 - len(values)))
        return merged

    @property
    def complete(self) -> bool:
        """True when EarlyStopping ended the run in an earlier session."""
        return self.callback.stopped_early

    def fit(self, *args: Any, epochs: int = 1, callbacks: Sequence[keras.callbacks.Callback] | None = None,
            initial_epoch: int | None = None, **kwargs: Any) -> keras.callbacks.History:
        """``model.fit`` from ``initial_epoch`` with `callback` added to ``callbacks``.

        Returns at once, saying so, when the run already has ``epochs`` epochs or was stopped
        early. Other arguments go to ``model.fit`` unchanged.

        Args:
            *args: Passed to ``model.fit`` (``x``, ``y``, ...).
            epochs: Total epochs of the run, counting those already done. Defaults to 1.
            callbacks: Your own callbacks; EarlyStopping and ReduceLROnPlateau among them get
                their saved state back. Defaults to None.
            initial_epoch: Must equal `initial_epoch` if given. Defaults to None.
            **kwargs: Passed to ``model.fit``.
        """
        if initial_epoch is not None and initial_epoch != self.initial_epoch:
            raise ValueError(
                f"Invalid value for argument `initial_epoch`. Received: initial_epoch={initial_epoch}. "
                f"Expected {self.initial_epoch} (the epochs this run has done) or None."
            )
        own = list(callbacks or [])
        if self.callback.stopped_early:
            return self._done(f"stopped early after epoch {self.initial_epoch}; nothing to do", kwargs)
        if self.initial_epoch >= epochs:
            return self._done(f"complete: {self.initial_epoch} of {epochs} epochs done", kwargs)
        everything = [c for c in own if c is not self.callback] + [self.callback]
        self.callback.callbacks = everything
        self.callback.strategy = self.strategy
        try:
            history = self.model.fit(
                *args, epochs=epochs, initial_epoch=self.initial_epoch, callbacks=everything, **kwargs
            )
        except BaseException:
            # Interrupted (KeyboardInterrupt, an error in a batch): Keras skips on_train_end, so
            # land the checkpoints already saved before the exception goes on; never mask it.
            self._finish_uploads(quiet=True)
            raise
        finally:
            self.callback.callbacks = None
        self._finish_uploads(quiet=False)
        return history

    def _finish_uploads(self, quiet: bool) -> None:
        try:
            self.callback.wait_for_uploads()
        except ResumableError as e:
            if not quiet:
                raise
            warnings.warn(f"resumable: {e}", stacklevel=3)

    def _done(self, message: str, kwargs: dict[str, Any]) -> keras.callbacks.History:
        if kwargs.get("verbose", 1):
            print(f"resumable: {self.callback.filepath}: {message}")
        logger.info("resumable: %s: %s", self.callback.filepath, message)
        history = keras.callbacks.History()
        history.set_model(self.model)
        history.history = {}
        return history


def resume(
    filepath: str,
    build_model: Callable[[], keras.Model] | None = None,
    *,
    strategy: Any = None,
    **callback_args: Any,
) -> Run:
    """Continue the run in ``filepath`` from its newest good checkpoint, or start a new one.

    Checkpoints are tried newest first; one whose files disagree with its manifest is skipped
    with a warning. The chosen one is downloaded to a local cache, checked and loaded (under
    ``strategy.scope()`` when a strategy is given).

    Example:

    ```python
    run = resumable.resume("gs://bucket/runs/exp1", build_model=make_model, monitor="val_loss")
    run.fit(x, y, epochs=20, validation_data=(x_val, y_val))
    ```

    Args:
        filepath: The run folder (local, Google Drive mount, ``gs://...`` or another fsspec URL).
        build_model: A function returning the compiled model. With a checkpoint, its model
            receives the saved weights and optimizer state; without one, it starts the run.
            Defaults to None: load the saved ``.keras`` model as it is.
        strategy: A ``tf.distribute`` strategy to build and load the model under.
            Defaults to None.
        **callback_args: Any `CheckpointCallback` argument (``monitor``, ``keep_last``, ...),
            for `Run.callback`.

    Returns:
        A `Run`.

    Raises:
        CheckpointNotFoundError: No checkpoint can be restored and no ``build_model`` was given.
        CheckpointMismatchError: The checkpoint does not fit ``build_model``'s model.
    """
    callback = CheckpointCallback(filepath, **callback_args)
    callback.strategy = strategy
    storage = callback.storage
    damaged: set[str] = set()
    cache_root = callback.staging_dir / "cache"
    for info in storage.newest_first():
        cache = cache_root / info.name
        try:
            local = storage.fetch(info, cache, progress=bool(callback.verbose))
        except CorruptCheckpointError as e:
            warnings.warn(f"resumable: {e}", stacklevel=2)
            damaged.add(info.name)
            continue
        model = keras_io.load_model(local, build_model, strategy=strategy, where=info.url)
        callback.restore(info, keras_io.read_state(local), keras_io.read_arrays(local), damaged)
        _keep_only(cache_root, info.name)
        logger.info("resumable: resumed %s at epoch %d, step %d", info.url, info.epoch, info.step)
        if info.manifest is not None and info.manifest.batch:
            logger.warning(
                "resumable: %s was saved %d batches into epoch %d; that epoch restarts from its first batch",
                info.url, info.manifest.batch, info.manifest.epoch + 1,
            )
        return Run(model, callback, info, strategy)
    if build_model is None:
        raise CheckpointNotFoundError(
            f"{storage.url}: no checkpoint to resume from; pass build_model=<a function returning "
            "the compiled model> to start the run"
        )
    with keras_io.scope(strategy):
        model = keras_io.build(build_model)
    if damaged:
        callback.restore_nothing(damaged)
    return Run(model, callback, None, strategy)


def _keep_only(cache_root: Path, name: str) -> None:
    """The cache holds one checkpoint: the one restored (its files are reused by a later resume)."""
    if cache_root.is_dir():
        for child in cache_root.iterdir():
            if child.name != name:
                shutil.rmtree(child, ignore_errors=True)


__all__ = ["Run", "resume"]
