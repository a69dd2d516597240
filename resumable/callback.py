"""`CheckpointCallback`: a Keras callback that commits resumable checkpoints to a run folder."""

from __future__ import annotations

import hashlib
import inspect
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import keras

from resumable import keras_io
from resumable.display import human_size
from resumable.errors import CheckpointExistsError, ResumableError
from resumable.manifest import Manifest
from resumable.naming import DEFAULT_TEMPLATE
from resumable.policy import Retention, is_better, plan, resolve_mode
from resumable.storage import CheckpointInfo, RunStorage
from resumable.uploader import Uploader

logger = logging.getLogger("resumable")

_MODEL_FILE_SUFFIXES = (".keras", ".h5", ".weights.h5")


class CheckpointCallback(keras.callbacks.Callback):
    """Save resumable checkpoints of a Keras model to a run folder, keeping the last and the best.

    Each checkpoint is serialized to a local staging folder, copied to the run folder (a local
    path, a Google Drive mount, ``gs://bucket/prefix``, any fsspec URL) and committed by writing
    its manifest last, so a run killed at any moment leaves every committed checkpoint intact.
    A checkpoint holds the model and its optimizer state, the epoch and step, the history,
    this callback's best value and the state of EarlyStopping and ReduceLROnPlateau in the same
    fit. Continue a run with `resumable.resume`, which returns a callback carrying that state.

    The arguments follow `keras.callbacks.ModelCheckpoint`, except that ``filepath`` is the run
    folder and ``filename`` names the checkpoints inside it.

    Example:

    ```python
    cb = resumable.CheckpointCallback("/content/drive/MyDrive/runs/exp1", monitor="val_loss",
                                      keep_last=3, keep_best=1)
    model.fit(x, y, epochs=20, validation_split=0.1, callbacks=[cb])
    ```

    Args:
        filepath: The run folder: a local folder, ``/content/drive/MyDrive/...``,
            ``gs://bucket/prefix`` or another fsspec URL.
        monitor: The metric that defines the best checkpoint (for ``keep_best`` and
            ``save_best_only``). Defaults to ``"val_loss"``.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (max for accuracy-like names). Defaults to "auto".
        save_best_only: Commit a checkpoint only when ``monitor`` improves. A resumed run then
            continues from the best checkpoint, not from the last epoch. Defaults to False.
        save_weights_only: Save ``model.weights.h5`` (weights and optimizer state) instead of
            the whole ``.keras`` model; `resumable.resume` then needs ``build_model``.
            Defaults to False.
        save_freq: ``"epoch"`` to save at the end of every epoch, or an int N to also save
            every N batches (mid-epoch checkpoints). Defaults to ``"epoch"``.
        keep_last: Keep the newest N checkpoints; None keeps all. Defaults to 3.
        keep_best: Also keep the best N by ``monitor``. Defaults to 1.
        keep_every: Also keep every checkpoint whose epoch is a multiple of N. Defaults to None.
        filename: Checkpoint folder name template with ``{epoch}``; may use ``{step}`` and
            metric names. Defaults to ``"ckpt-{epoch:06d}"``.
        verbose: 1 prints a line per checkpoint, 0 is silent. Defaults to 0.
        initial_value_threshold: The value ``monitor`` must beat to count as the first best.
            Defaults to None.
        staging_dir: Local folder for serializing before the upload and for downloads on
            resume. Defaults to ``<tempdir>/resumable-cache/<hash of filepath>``.
        storage_options: Passed to the fsspec filesystem, e.g. ``{"token": "anon"}``.
            Defaults to None.
        async_upload: Upload in a background thread while training goes on: a save only
            blocks training for the local serialization. At most one upload runs and one
            waits; a newer checkpoint replaces the waiting one. The end of training (and an
            exception leaving `Run.fit`, and interpreter exit) waits for the last upload.
            False uploads inside the save. Defaults to True.
    """

    def __init__(
        self,
        filepath: str,
        monitor: str = "val_loss",
        mode: str = "auto",
        save_best_only: bool = False,
        save_weights_only: bool = False,
        save_freq: str | int = "epoch",
        keep_last: int | None = 3,
        keep_best: int = 1,
        keep_every: int | None = None,
        filename: str = DEFAULT_TEMPLATE,
        verbose: int = 0,
        initial_value_threshold: float | None = None,
        staging_dir: str | Path | None = None,
        storage_options: dict[str, Any] | None = None,
        async_upload: bool = True,
    ) -> None:
        super().__init__()
        _check_filepath(filepath)
        _check_save_freq(save_freq)
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(
                f"Invalid value for argument `monitor`. Received: monitor={monitor!r}. "
                "Expected a metric name such as 'val_loss'."
            )
        self.retention = Retention(keep_last=keep_last, keep_best=keep_best, monitor=monitor, mode=mode,
                                   keep_every=keep_every)
        if verbose not in (0, 1, 2, True, False):
            raise ValueError(
                f"Invalid value for argument `verbose`. Received: verbose={verbose!r}. Expected 0 or 1."
            )
        if not isinstance(async_upload, bool):
            raise ValueError(
                f"Invalid value for argument `async_upload`. Received: async_upload={async_upload!r}. "
                "Expected True or False."
            )
        self.filepath = str(filepath)
        self.async_upload = async_upload
        self.monitor = monitor
        self.mode = resolve_mode(monitor, mode)
        self.save_best_only = bool(save_best_only)
        self.save_weights_only = bool(save_weights_only)
        self.save_freq = save_freq
        self.verbose = int(verbose)
        self.storage = RunStorage(self.filepath, filename=filename, storage_options=storage_options)
        self.staging_dir = Path(staging_dir) if staging_dir else default_staging_dir(self.storage.url)
        # The newest committed checkpoint's files stay in staging_dir/committed; resume() does not
        # read them (it checks the run folder's copy), they are a local copy to recover by hand.
        self.uploader = Uploader(self.storage, commit=self._commit, on_commit=self._committed,
                                 cache_dir=self.staging_dir / "committed", verbose=bool(verbose))
        self.best: float | None = None if initial_value_threshold is None else float(initial_value_threshold)
        self.history: list[dict[str, float]] = []  # per-epoch logs of every epoch of the run
        self.epochs_done = 0
        self.stopped_early = False
        self.last_checkpoint: CheckpointInfo | None = None
        self.strategy: Any = None
        self.callbacks: list[keras.callbacks.Callback] | None = None  # the fit's callbacks, set by Run.fit
        self._restored: CheckpointInfo | None = None
        self._damaged: set[str] = set()  # newer checkpoints resume() found corrupt and skipped
        self._pending_restore: dict[str, Any] | None = None
        self._pending_arrays: dict[str, Any] = {}
        self._pending_save: dict[str, Any] | None = None  # the epoch's logs dict, shared by all callbacks
        self._siblings: list[keras.callbacks.Callback] = []
        self._last = True
        self._first_epoch = True
        self._batches = 0
        self._batch_in_epoch = 0
        self._epoch = 0
        self._save_started = time.monotonic()

    def __repr__(self) -> str:
        return (
            f"CheckpointCallback({self.filepath!r}, monitor={self.monitor!r}, "
            f"epochs_done={self.epochs_done})"
        )

    # ------------------------------------------------------------------ restoring (used by resume)

    def restore(self, checkpoint: CheckpointInfo, state: dict[str, Any], arrays: dict[str, Any],
                damaged: set[str] | None = None) -> None:
        """Carry the state of a restored checkpoint: epochs done, best, history, other callbacks.

        ``damaged`` names newer checkpoints that failed verification; training replaces them.
        """
        manifest = checkpoint.manifest
        assert manifest is not None
        self._restored = checkpoint
        self._damaged = set(damaged or ())
        self.last_checkpoint = checkpoint
        self.epochs_done = manifest.epoch
        best = state.get("best")
        self.best = None if best is None else float(best)
        self.history = [{k: float(v) for k, v in logs.items()} for logs in state.get("history", [])]
        self.stopped_early = bool(state.get("stopped_early", False))
        self._pending_restore = {"callbacks": state.get("callbacks", {}), "rng": state.get("rng", {})}
        self._pending_arrays = arrays

    def restore_nothing(self, damaged: set[str]) -> None:
        """A new run in a folder whose only checkpoints are damaged: training replaces them."""
        self._damaged = set(damaged)

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._siblings = list(self.callbacks) if self.callbacks is not None else _fit_callbacks(self)
        self._last = _runs_last(self, self._siblings)
        self._first_epoch = True
        self._pending_save = None
        if self._chief():
            self._check_run_folder()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._save_pending()
        if self._first_epoch:
            self._first_epoch = False
            self._start(epoch)
        self._epoch = epoch
        self._batch_in_epoch = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_in_epoch = batch + 1
        if self.save_freq == "epoch":
            return
        self._batches += 1
        last_batch = (self.params or {}).get("steps") == self._batch_in_epoch  # the epoch-end save follows
        if self._batches % int(self.save_freq) == 0 and not last_batch:
            self._save(self.epochs_done, self._batch_in_epoch, keras_io.logs_to_floats(logs))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        floats = keras_io.logs_to_floats(logs)
        del self.history[epoch:]  # an epoch re-run after a mid-epoch restore replaces its entry
        self.history.append(floats)
        self.epochs_done = epoch + 1
        if self._last:  # every other callback has run its on_epoch_end: the state is this epoch's
            self.stopped_early = bool(self.model.stop_training)
            self._save(self.epochs_done, 0, floats)
        else:
            # Saved at the next on_epoch_begin (or on_train_end), once the callbacks after this
            # one have updated their counters, the learning rate and the logs (ReduceLROnPlateau
            # adds `learning_rate` to them).
            self._pending_save = logs if logs is not None else {}

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._pending_save is not None and self.model.stop_training:
            self.stopped_early = True
        self._save_pending()
        self.wait_for_uploads()

    def wait_for_uploads(self, timeout: float | None = None) -> bool:
        """Block until the checkpoints saved so far are committed (or ``timeout`` seconds pass).

        Prints what it waits for when ``verbose``. Raises the upload's error when the newest
        checkpoint could not be committed; its local copy is kept and the next save retries.
        Returns False on timeout.
        """
        return self.uploader.wait(timeout)

    # ------------------------------------------------------------------ saving

    def _start(self, epoch: int) -> None:
        if epoch != self.epochs_done:
            raise ResumableError(
                f"model.fit started at epoch {epoch} but {self.filepath} has {self.epochs_done} epochs done; "
                f"pass initial_epoch={self.epochs_done} to fit, or use run.fit() from resumable.resume()"
            )
        if self._pending_restore is not None:
            restored = keras_io.restore_callback_states(
                self._siblings, self._pending_restore["callbacks"], self._pending_arrays
            )
            keras_io.set_rng_state(self._pending_restore["rng"])
            if restored:
                logger.info("resumable: restored the state of %s", ", ".join(restored))
            self._pending_restore = None
            self._pending_arrays = {}

    def _save_pending(self) -> None:
        if self._pending_save is not None:
            logs = keras_io.logs_to_floats(self._pending_save)
            self._pending_save = None
            self.history[self.epochs_done - 1] = logs
            self._save(self.epochs_done, 0, logs)

    def _save(self, epoch: int, batch: int, logs: dict[str, float]) -> None:
        current = logs.get(self.monitor)
        improved = current is not None and is_better(current, self.best, self.mode)
        if self.save_best_only and not improved:
            return
        if improved:
            self.best = current
        if not self._chief():
            return
        started = time.monotonic()
        step = keras_io.iterations(self.model)
        name = self.storage.template.format(epoch, step, logs, mid_epoch=batch > 0)
        logger.info("resumable: saving %s", name)
        staging = self.staging_dir / "staging" / name
        if self.uploader.in_progress(name):
            self.uploader.wait()  # the same name again (a re-run epoch): never rewrite files in flight
        shutil.rmtree(staging, ignore_errors=True)
        callback_states, arrays = keras_io.callback_states(self._siblings)
        state = self._state(callback_states, step, batch)
        keras_io.save(self.model, staging, weights_only=self.save_weights_only, state=state, arrays=arrays)
        manifest = Manifest(
            epoch=epoch, step=step, batch=batch, metrics=logs, versions=keras_io.versions(),
            state=self._summary(callback_states),
        )
        self._save_started = started
        if self.async_upload:
            self.uploader.submit(staging, name, manifest)
            logger.info("resumable: staged %s in %.2f s; uploading in the background", name,
                        time.monotonic() - started)
        else:
            self.uploader.commit_now(staging, name, manifest)

    def _committed(self, info: CheckpointInfo) -> None:
        """After each commit, in the uploader's thread when uploading in the background."""
        self.last_checkpoint = info
        logger.info("resumable: saved %s", info.url)
        self._apply_retention()
        if self.verbose:
            size = info.manifest.total_size if info.manifest else 0
            print(f"\nEpoch {info.epoch}: saved {info.url} ({human_size(size)}, "
                  f"{time.monotonic() - self._save_started:.1f} s)")

    def _commit(self, staging: Path, name: str, manifest: Manifest) -> CheckpointInfo:
        try:
            return self.storage.commit(staging, name, manifest)
        except CheckpointExistsError:
            # Only a checkpoint resume() found damaged may be replaced, and only if it still is.
            if name not in self._damaged or not self.storage.verify(name):
                raise
        logger.warning("resumable: replacing damaged checkpoint %s", name)
        self.storage.delete(name)
        self._damaged.discard(name)
        return self.storage.commit(staging, name, manifest)

    def _state(self, callback_states: dict[str, Any], step: int, batch: int) -> dict[str, Any]:
        return {
            "epoch": self.epochs_done,
            "step": step,
            "batch": batch,
            "monitor": self.monitor,
            "mode": self.mode,
            "best": self.best,
            "stopped_early": self.stopped_early,
            "epochs_planned": (self.params or {}).get("epochs"),
            "history": self.history[: self.epochs_done],
            "callbacks": callback_states,
            "optimizer": keras_io.optimizer_summary(self.model),
            "rng": keras_io.rng_state(),
        }

    def _summary(self, callback_states: dict[str, Any]) -> dict[str, Any]:
        """What `resumable inspect` shows: small, JSON only."""
        return keras_io.jsonable({
            "monitor": self.monitor,
            "mode": self.mode,
            "best": self.best,
            "stopped_early": self.stopped_early,
            "epochs_planned": (self.params or {}).get("epochs"),
            "format": "weights" if self.save_weights_only else "keras",
            "backend": keras.backend.backend(),
            "optimizer": keras_io.optimizer_summary(self.model),
            "callbacks": callback_states,
        })

    def _apply_retention(self) -> None:
        """Delete what retention drops; a failed delete only costs space, so it does not stop training."""
        try:
            decisions = plan(self.storage.list(), self.retention)
        except ResumableError as e:
            logger.warning("resumable: retention skipped: %s", e)
            return
        for decision in decisions:
            if decision.keep or (self.last_checkpoint and decision.name == self.last_checkpoint.name):
                continue
            try:
                self.storage.delete(decision.name)
            except ResumableError as e:
                logger.warning("resumable: could not delete %s: %s", decision.name, e)

    # ------------------------------------------------------------------ checks

    def _chief(self) -> bool:
        return keras_io.is_chief(self.model, self.strategy)

    def _check_run_folder(self) -> None:
        """Refuse to mix a new training run into a folder that already holds one."""
        latest = next((c for c in self.storage.newest_first() if c.name not in self._damaged), None)
        if latest is None:
            return
        if self._restored is not None and latest.name == self._restored.name:
            return
        if self.last_checkpoint is not None and latest.name == self.last_checkpoint.name:
            return  # a second fit in the same session
        if self._restored is None and latest.step == keras_io.iterations(self.model) and latest.step:
            # the user restored this model themselves; continue from that checkpoint
            self.epochs_done = latest.epoch or 0
            return
        if self._restored is not None:
            raise CheckpointExistsError(
                f"{latest.url} is newer than the checkpoint this run resumed from ({self._restored.name}): "
                "another process is training into this folder; stop it, then call resumable.resume() again"
            )
        raise CheckpointExistsError(
            f"{self.filepath} already holds a run (latest {latest.name}, {latest.epoch} epochs); "
            "continue it with `run = resumable.resume(filepath, build_model=...)` and `run.fit(...)`, "
            "or write to a new folder"
        )


def default_staging_dir(url: str) -> Path:
    """``<tempdir>/resumable-cache/<hash of the run URL>``: one local folder per run folder."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "resumable-cache" / digest


def _fit_callbacks(callback: keras.callbacks.Callback) -> list[keras.callbacks.Callback]:
    """The other callbacks of the running fit, found on the caller's stack.

    Keras does not tell a callback about its siblings; model.fit keeps them in a local
    CallbackList. Run.fit passes them explicitly; this covers a plain model.fit.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            for value in frame.f_locals.values():
                if isinstance(value, keras.callbacks.CallbackList) and callback in value.callbacks:
                    return list(value.callbacks)
            frame = frame.f_back
    finally:
        del frame
    return [callback]


def _runs_last(callback: keras.callbacks.Callback, callbacks: list[keras.callbacks.Callback]) -> bool:
    """True when no callback that keeps state runs after this one (Keras' History and progress bar don't)."""
    after = callbacks[callbacks.index(callback) + 1:] if callback in callbacks else []
    passive = (keras.callbacks.History, keras.callbacks.ProgbarLogger)
    return all(isinstance(c, passive) for c in after)


def _check_filepath(filepath: Any) -> None:
    text = str(filepath) if isinstance(filepath, (str, Path)) else ""
    if not text or text.endswith(_MODEL_FILE_SUFFIXES) or "{" in text:
        raise ValueError(
            f"Invalid value for argument `filepath`. Received: filepath={filepath!r}. "
            "Expected a run folder such as '/content/drive/MyDrive/runs/exp1' or 'gs://bucket/runs/exp1'; "
            "checkpoint names come from `filename`."
        )


def _check_save_freq(save_freq: Any) -> None:
    if save_freq == "epoch":
        return
    if isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0:
        return
    raise ValueError(
        f"Invalid value for argument `save_freq`. Received: save_freq={save_freq!r}. "
        "Expected 'epoch' or a positive int."
    )


__all__ = ["CheckpointCallback", "default_staging_dir"]
