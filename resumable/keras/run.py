"""`resume()`: continue a run from its newest good checkpoint, or start it."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import keras

from resumable.core import user_warnings
from resumable.core.display import printable
from resumable.core.errors import (
    CheckpointNotFoundError,
    LeaseLostError,
    ResumableError,
)
from resumable.keras import topology
from resumable.keras.callback.checkpoint_callback import CheckpointCallback
from resumable.keras.callback.interrupts import StopSignals, Witness, after_fit_error, finish_uploads
from resumable.keras.checkpoint import files_to_model, torch_backend, training_state
from resumable.keras.dropins import adopt
from resumable.keras.replay.inputs import Feed
from resumable.keras.replay.positioning import rest_of_epoch
from resumable.keras.resuming.continuity import csv_logs_continued, final_weights
from resumable.keras.resuming.newest_checkpoint import load_newest
from resumable.keras.resuming.restore import restore_checkpoint
from resumable.keras.resuming.tiers import from_local_tier, restore_newest_into
from resumable.manager import CheckpointInfo

logger = logging.getLogger("resumable")


class Run:
    """A run restored by `resume`: the model, where it stands, and a `fit` that continues it.

    Attributes:
        model: The restored model, or ``build_model()``'s for a new run.
        callback: The `CheckpointCallback` for the run folder, carrying the restored state.
        checkpoint: The checkpoint restored from (``.epoch``, ``.step``, ``.metrics``, ``.url``),
            or None for a new run.
        strategy: The ``tf.distribute`` strategy given to `resume`, or None.
        distribution: The ``keras.distribution`` given to `resume`, or None; `fit` runs under it.
    """

    def __init__(self, model: keras.Model, callback: CheckpointCallback, checkpoint: CheckpointInfo | None,
                 strategy: Any = None, distribution: Any = None,
                 build_model: Callable[[], keras.Model] | None = None,
                 adopted: Callable[[], adopt.Adopted | None] | None = None) -> None:
        self.model = model
        self.build_model = build_model
        self._adopted = adopted  # loads the adopted file again: where a rollback goes before any checkpoint
        self._adopted_name: str | None = None
        self._fitted = False
        self.callback = callback
        self.checkpoint = checkpoint
        self.strategy = strategy
        self.distribution = distribution

    def __repr__(self) -> str:
        source = self.checkpoint.name if self.checkpoint else (
            f"adopted {self._adopted_name}" if self._adopted_name else "new run")
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

        From a mid-epoch checkpoint (batch k of an epoch), the rest of that epoch runs first, on
        its remaining batches (NumPy arrays, ``tf.data`` datasets, ``keras.utils.PyDataset``,
        Python generators), then the next epochs: two ``model.fit`` calls whose histories are
        merged. Inputs that cannot be positioned replay the epoch from its first batch, with a
        warning.

        Ctrl-C (SIGINT) or SIGTERM during training stops at the next batch end; a
        KeyboardInterrupt from a callback stops at once. Either way the state reached is saved
        as a mid-epoch checkpoint, committed, and its URL printed before the interrupt goes on
        (SIGTERM exits with status 143). A second signal acts at once, without saving.

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
            return self._done(f"stopped early after epoch {self.initial_epoch}; nothing to do; "
                              f"{self._final_weights(own)}", kwargs)
        if self.initial_epoch == epochs:
            return self._done(f"complete: {self.initial_epoch} of {epochs} epochs done; "
                              f"{self._final_weights(own)}", kwargs)
        if self.initial_epoch > epochs:
            return self._done(
                f"the run already has {self.initial_epoch} epochs; nothing to train for epochs={epochs} "
                "(epochs counts the run's total: pass more than "
                f"{self.initial_epoch} to train longer)", kwargs)
        self._roll_back_if_ahead()
        # The feed first: before Keras creates an epoch's iterators, it brings the inputs to where
        # an unbroken run has them; checkpoints record their positions. The witness next sees each
        # epoch and batch end before the others: a later callback raising there cannot lose that
        # checkpoint (see interrupts.after_fit_error).
        feed = Feed(self.model, args, kwargs, epoch=self.initial_epoch, batch=self.callback.resume_batch,
                    saved=self.callback.restored_state.inputs,
                    epoch_rng=self.callback.restored_state.epoch_rng)
        if feed.ran_out is not None:
            return self._done(feed.ran_out, kwargs)
        everything = [feed, Witness(self.callback)] + [c for c in own if c is not self.callback] + [
            self.callback]
        self._fitted = True
        self.callback.feed = feed
        self.callback.callbacks = everything
        self.callback.strategy = self.strategy
        stops = StopSignals(self.callback)
        try:
            with stops, topology.scope(None, self.distribution), csv_logs_continued(own, self.initial_epoch):
                try:
                    history = self._fit(feed, epochs, everything)
                except BaseException as e:
                    # Interrupted (KeyboardInterrupt, SIGTERM, an error in a batch): Keras skips
                    # on_train_end, so save an interrupt's state and land the checkpoints before
                    # the exception goes on; never mask it.
                    after_fit_error(self.callback, e, stops)
                    if isinstance(e, LeaseLostError):  # one line, not a traceback from deep inside fit
                        raise LeaseLostError(str(e)) from None
                    raise
        finally:
            self.callback.callbacks = None
            self.callback.feed = None
            self.callback.manager.release()  # Keras skips on_train_end when an exception leaves fit
            self.callback.local_saves.end()
        finish_uploads(self.callback, quiet=False)
        if stops.received is not None:  # the signal came after the last batch: act on it now
            raise SystemExit(128 + signal.SIGTERM) if stops.received == signal.SIGTERM else KeyboardInterrupt
        return history

    def _fit(self, feed: Feed, epochs: int,
             callbacks: list[keras.callbacks.Callback]) -> keras.callbacks.History:
        """The rest of a restored mid-epoch checkpoint's epoch, if any, then the next epochs.

        The inputs come from ``feed``: datasets and generators brought to where an unbroken run
        has them.
        """
        batch = self.callback.resume_batch
        histories = []
        if batch:
            steps = feed.arguments.get("steps_per_epoch")
            remaining = steps - batch if steps is not None and steps > batch else None
            partial = rest_of_epoch(self.model, (), feed.arguments_for(limit=remaining, skip=batch), batch,
                                    self.callback.restored_state.epoch_rng or {},
                                    positioned=feed.positions_rest_of_epoch)
            if isinstance(partial, str):
                where = self.checkpoint.url if self.checkpoint else self.callback.filepath
                message = (f"resumable: {where} was saved {batch} batches into epoch "
                           f"{self.initial_epoch + 1}, but {partial}; that epoch restarts from its "
                           "first batch")
                if feed.problems:  # the input's problem was said: once is enough
                    logger.info("%s", message)
                else:
                    user_warnings.warn(message)
                self.callback.restored_state.replay_epoch()
            else:
                if feed.arguments.get("verbose", 1):
                    print(f"resumable: epoch {self.initial_epoch + 1} continues at batch {batch + 1}")
                logger.info("resumable: epoch %d continues at batch %d", self.initial_epoch + 1, batch + 1)
                self.callback.restored_state.begin_partial_epoch(batch, self.model)
                # Keras' header would read "Epoch E/E" for this fit of one epoch: show the run's total.
                headers = [] if any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks) else [
                    _RunEpochs(epochs)]
                feed.build_model(self.model)
                feed.fit_starts()
                # Keras reads one stream on, unless the epoch's rest ends a PyDataset's pass (as unbroken)
                stream = bool(steps) and not feed.rest_of_epoch_ends_pass(batch)
                try:
                    histories.append(self.model.fit(
                        epochs=self.initial_epoch + 1, initial_epoch=self.initial_epoch,
                        callbacks=[*torch_backend.epoch_rest_ends(stream), *callbacks, *headers,
                                   *torch_backend.continued_stream(True)], **partial,
                    ))
                finally:
                    feed.fit_done()
                if self.callback.stopped_early or self.initial_epoch >= epochs:
                    return _merge(histories, self.model)
                self.callback.restored_state.carry_over(callbacks)  # Keras resets them
        arguments = feed.arguments_for()
        # With steps_per_epoch, Keras reads one stream across epochs: a resumed fit starts it anew.
        continued = (self.checkpoint is not None and self.initial_epoch > 0
                     and bool(arguments.get("steps_per_epoch")))
        feed.build_model(self.model)
        feed.fit_starts()
        # After the rest of an epoch, the random state is already the unbroken run's: kept from here
        as_now = bool(histories)
        try:
            histories.append(self.model.fit(
                epochs=epochs, initial_epoch=self.initial_epoch,
                callbacks=[*callbacks, *torch_backend.continued_stream(continued, as_now=as_now)], **arguments
            ))
        finally:
            feed.fit_done()
        return _merge(histories, self.model)

    def _roll_back_if_ahead(self) -> None:
        """After an exception ended an earlier fit of this Run mid-epoch, the model holds training
        no checkpoint has: go back to the newest good checkpoint of either tier (the local tier's
        when `from_local_tier` takes it, as resume() does; its line says which tier and why), or a
        new model, so no batch is trained twice."""
        if not self._fitted:
            return
        step = training_state.iterations(self.model)
        saved = self.callback.builder.last_saved_step or 0
        if step == saved:
            return
        finish_uploads(self.callback, quiet=True)
        latest = restore_newest_into(self.model, self.callback, self.build_model, self.strategy,
                                     self.distribution)
        if latest is not None:
            self.checkpoint = latest
            saved = int(latest.step or 0)
            where = f"{latest.url} (epoch {latest.epoch}, step {latest.step})"
        elif self._adopted is not None and (again := self._adopted()) is not None:
            self.model = again.model
            _adopt_into(self.callback, again)
            where = f"{again.file.name} again (epoch {again.epochs_done})"
        elif self.build_model is not None:
            with topology.scope(self.strategy, self.distribution):
                self.model = files_to_model.build(self.build_model)
            self.callback.start_over()
            where = "a new model from build_model()"
        else:
            raise ResumableError(
                f"the model trained {step - saved} steps past the newest checkpoint of "
                f"{self.callback.filepath} "
                "before an exception ended run.fit; call resumable.resume() again to continue from it"
            )
        message = (f"resumable: the last run.fit ended with an exception {step - saved} steps after the "
                   f"newest checkpoint; continuing from {where}")
        print(message, flush=True)
        logger.info("%s", message)

    def _final_weights(self, callbacks: list[keras.callbacks.Callback]) -> str:
        """A run that is over: the model as an unbroken run ends it (EarlyStopping's best weights)."""
        return final_weights(self.model, callbacks, self.callback.restored_state.give_state,
                             self.initial_epoch)

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
    distribution: Any = None,
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
            Defaults to None: load the saved ``.keras`` model as it is (a checkpoint saved with
            ``save_weights_only`` or ``save_trainable_only`` needs it).
        strategy: A ``tf.distribute`` strategy to build and load the model under (TensorFlow).
            Defaults to None.
        distribution: A ``keras.distribution`` (``DataParallel``, ``ModelParallel``; JAX) to
            build and load the model under, and to train under in `Run.fit`. Defaults to None:
            the distribution set with ``keras.distribution.set_distribution``, if any.
        **callback_args: Any `CheckpointCallback` argument (``monitor``, ``keep_last``, ...),
            for `Run.callback`. ``takeover=True`` lets `Run.fit` take the run over from another
            process holding the run folder's writer lease; without it, `resume` warns when one
            does (its loading needs no lease). With ``local_tier``, the local tier's newest
            checkpoint is taken when it is this run's, newer and good; one line says which tier.

    Returns:
        A `Run`.

    Raises:
        CheckpointNotFoundError: No checkpoint can be restored and no ``build_model`` was given.
        CheckpointMismatchError: The checkpoint does not fit ``build_model``'s model.
    """
    topology.check_distribution(strategy, distribution)
    callback = CheckpointCallback(filepath, **callback_args)
    callback.strategy = strategy
    manager = callback.manager
    # Before a download that fit would waste; only the process that will write says it.
    lease = callback.fit_lease.lease_note() if topology.is_chief(None, strategy) else None
    reads = files_to_model.ReadOnce()
    tier = from_local_tier(callback, build_model, strategy, distribution, reads)  # #55: a newer local one
    if tier.line:
        _say_once(tier.line)
    loaded = tier.found or load_newest(manager, build_model, strategy, distribution, callback.barrier_timeout,
                                       reads)
    if loaded is not None:
        info, local, model = loaded
        restore_checkpoint(callback, info, local, reads)
        if tier.found is not None:  # the durable tier's newest is what its next commit follows
            manager.resumed_from(tier.durable, manager.damaged)
        _say_once(_resumed_line(callback, info, lease))
        return Run(model, callback, info, strategy, distribution, build_model)
    if manager.damaged:
        manager.resumed_from(None, manager.damaged)
    def adopt_newest() -> adopt.Adopted | None:
        return adopt.load_newest(manager.storage.url, build_model, strategy=strategy,
                                 distribution=distribution, storage_options=callback.options.storage_options)

    adopted = adopt_newest()
    if adopted is not None:
        _adopt_into(callback, adopted)
        _say_once(adopted.line(printable(manager.storage.url)) + (f" ({lease})" if lease else ""))
        run = Run(adopted.model, callback, None, strategy, distribution, build_model, adopted=adopt_newest)
        run._adopted_name = adopted.file.name
        return run
    if build_model is None:
        raise CheckpointNotFoundError(
            f"{manager.storage.url}: no checkpoint to resume from; pass build_model=<a function returning "
            "the compiled model> to start the run"
        )
    with topology.scope(strategy, distribution):
        model = files_to_model.build(build_model)
    _say_once(f"resumable: starting a new run in {printable(manager.storage.url)}"
              + (f" ({lease})" if lease else ""))
    return Run(model, callback, None, strategy, distribution, build_model)


def _adopt_into(callback: CheckpointCallback, adopted: adopt.Adopted) -> None:
    """The callback continues from an adopted file: its epochs done, and its record's best value."""
    details = adopted.file.details
    callback.adopt(adopted.epochs_done, training_state.iterations(adopted.model), details.get("best"),
                   details.get("monitor"))


def _resumed_line(callback: CheckpointCallback, info: CheckpointInfo, lease: str | None) -> str:
    """The one line of a resume: the folder, the checkpoint and its monitored value, where training
    continues (the batch too, mid-epoch); in brackets, a backend switched since (a switched Colab
    runtime) and what happens to another process' lease."""
    value = info.metrics.get(callback.monitor) if callback.monitor else None
    metric = f" ({callback.monitor} {value:.4g})" if isinstance(value, (int, float)) else ""
    batch = f", batch {callback.resume_batch + 1}" if callback.resume_batch else ""
    url = callback.manager.storage.url
    line = (f"resumable: resumed {url} from {info.name}{metric}: training continues at "
            f"epoch {callback.epochs_done + 1}{batch}")
    notes = "; ".join(note for note in (_other_backend(info), lease) if note)
    return printable(line) + (f" ({notes})" if notes else "")


def _say_once(message: str) -> None:
    """A line every resume shows where users look: stderr, which a notebook shows (and the log)."""
    print(message, file=sys.stderr, flush=True)
    logger.info("%s", message)


_BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch", "numpy": "NumPy",
                  "openvino": "OpenVINO"}


def _other_backend(info: CheckpointInfo) -> str | None:
    """A few words when the checkpoint was written on another Keras backend (a switched Colab runtime)."""
    written = info.manifest.state.get("backend") if info.manifest is not None else None
    current = keras.backend.backend()
    if not isinstance(written, str) or written == current:
        return None
    return printable(  # the backend's name is read from the run folder
        f"written with {_BACKEND_NAMES.get(written, written)}, on {_BACKEND_NAMES.get(current, current)}: "
        "epochs and state continue exactly, floating point does not")


class _RunEpochs(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, with the run's epoch total in its "Epoch E/N" header."""

    def __init__(self, epochs: int) -> None:
        super().__init__()
        self.run_epochs = epochs

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params({**params, "epochs": self.run_epochs})


def _merge(histories: list[keras.callbacks.History], model: keras.Model) -> keras.callbacks.History:
    """One History for the fits of one Run.fit, as a single model.fit would return."""
    if len(histories) == 1:
        return histories[0]
    merged = keras.callbacks.History()
    merged.set_model(model)
    merged.epoch = [e for h in histories for e in h.epoch]
    merged.history = {}
    for h in histories:
        for key, values in h.history.items():
            merged.history.setdefault(key, []).extend(values)
    merged.params = histories[-1].params
    model.history = merged
    return merged


__all__ = ["Run", "resume"]
