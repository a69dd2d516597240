"""`resumable.ModelCheckpoint`: ``keras.callbacks.ModelCheckpoint``, with files never half-written.

A subclass of Keras' callback: the arguments, their checks, warnings and errors, the best value,
``save_freq`` and the file names are Keras' own. Only the write differs: the model is saved to a
local staging file, then lands at its final name whole (locally and on a Drive mount through a
temporary file and ``os.replace``; on ``gs://`` an object appears when its upload completes) with
a checksum record beside it, in a background thread (`resumable.manager.file_writer`). The end of
``fit`` waits for the last file. `load_model` and `load_weights` check a file against its record.
"""

from __future__ import annotations

import datetime
import itertools
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import keras
from absl import logging as absl_logging

from resumable.core.errors import ResumableError
from resumable.keras import compat
from resumable.keras.checkpoint import state_file, training_state
from resumable.keras.dropins import continuing_fit, hdf5_files, save_and_load
from resumable.keras.dropins.save_and_load import load_model, load_weights, save_model, verify_file
from resumable.manager import FileTarget, check_drive_mounted, split_url
from resumable.manager.file_writer import FileJob, FileWriter

_counter = itertools.count()


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint``, whose files are never half-written, on any storage.

    The first eight arguments are Keras 3's, in its order, with its defaults and meaning: swap
    ``keras.callbacks.ModelCheckpoint(`` for ``resumable.ModelCheckpoint(``. On top of Keras:

    - a file never appears half-written at its final name, on a local folder, a Google Drive
      mount or ``gs://bucket/...`` (any fsspec URL), even when the process is killed mid-save;
    - a checksum record ``.<name>.resumable.json`` beside each file (size, CRC32C, epoch, metrics),
      checked by `resumable.load_model` and `resumable.load_weights`;
    - the upload runs in a background thread while training goes on; the end of ``fit`` waits;
    - with `resumable.resume` and ``run.fit``, the best value is carried across sessions;
    - optional retention (``keep_last``).

    File names: ``.keras`` and ``.weights.h5`` are written as Keras writes them. ``.h5`` and
    ``.hdf5`` names not ending in ``.weights.h5`` (the names Keras 2 notebooks and older articles
    use) hold Keras' legacy HDF5 format, as Keras 2 wrote them: the whole model, or with
    ``save_weights_only=True`` Keras 2's weights file. `resumable.load_model` reads a model file
    back compiled, with its optimizer state (Keras 3's own loader drops it), so
    ``fit(initial_epoch=N)`` continues; ``model.load_weights(path)`` reads both kinds.

    Example:

    ```python
    cb = resumable.ModelCheckpoint("/content/drive/MyDrive/ckpt/weights-{epoch:02d}-{val_accuracy:.3f}.hdf5",
                                   monitor="val_accuracy", verbose=1, mode="max")
    model.fit(x, y, epochs=20, validation_data=(x_val, y_val), callbacks=[cb])
    ```

    Args:
        filepath: The file to write: a fixed name (``"best.keras"``) or a template with
            ``{epoch}``, ``{batch}`` and any logged metric (``"w-{epoch:02d}-{val_loss:.2f}.keras"``);
            local, ``/content/drive/...``, ``gs://bucket/...`` or another fsspec URL.
        monitor: As in Keras. Defaults to ``"val_loss"``.
        verbose: As in Keras: 0 is silent, 1 prints Keras' lines ("Epoch 3: saving model to
            ...", and where this Keras prints it, "... finished saving model to ..." once the file
            has landed);
            ``"auto"`` means 1. Defaults to 0.
        save_best_only: As in Keras. Defaults to False.
        save_weights_only: As in Keras. Defaults to False.
        mode: As in Keras. Defaults to ``"auto"``.
        save_freq: As in Keras. Defaults to ``"epoch"``.
        initial_value_threshold: As in Keras. Defaults to None.
        keep_last: Keep only the newest N files this callback wrote (and their records); None
            keeps every file, as Keras does. Defaults to None.
        async_upload: Write files in a background thread; False writes inside the save.
            Defaults to True.
        staging_dir: Local folder to serialize into before the upload. Defaults to a folder
            under the system's temporary folder.
        storage_options: Passed to the fsspec filesystem, e.g. ``{"token": "anon"}``.
    """

    def __init__(
        self,
        filepath: str | os.PathLike[str],
        monitor: str = "val_loss",
        verbose: int | str = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        *,
        keep_last: int | None = None,
        async_upload: bool = True,
        staging_dir: str | Path | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        problem = compat.model_checkpoint_internals()
        if problem is not None:
            raise ResumableError(problem)
        text = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else filepath
        # The names Keras 3 refuses but articles use: checked by Keras as the name it accepts.
        legacy = isinstance(text, str) and hdf5_files.is_legacy_name(text)
        checked = text + (".weights.h5" if save_weights_only else ".keras") if legacy else text
        super().__init__(checked, monitor=monitor, verbose=_check_verbose(verbose),
                         save_best_only=save_best_only, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq, initial_value_threshold=initial_value_threshold)
        self.filepath = text
        if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool)
                                      or keep_last < 1):
            raise ValueError(f"Invalid value for argument `keep_last`. Received: keep_last={keep_last!r}. "
                             "Expected a positive int or None.")
        if not isinstance(async_upload, bool):
            raise ValueError("Invalid value for argument `async_upload`. "
                             f"Received: async_upload={async_upload!r}. Expected True or False.")
        _check_drive(text)
        self.keep_last = keep_last
        self.async_upload = async_upload
        self.storage_options = storage_options
        self.staging_dir = Path(staging_dir) if staging_dir is not None else (
            Path(tempfile.gettempdir()) / "resumable-cache" / "files")
        self.writer = FileWriter(background=async_upload)
        self.written: list[str] = []  # URLs written by this callback, oldest first (for keep_last)
        self._targets: dict[str, FileTarget] = {}
        # Keras' "finished saving" lines, once the file landed, printed by the training thread
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()
        self._fit_started = False  # the first epoch of a fit not seen yet

    def __repr__(self) -> str:
        return f"ModelCheckpoint({self.filepath!r}, monitor={self.monitor!r})"

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)
        self._fit_started = True
        if hdf5_files.is_legacy_name(self.filepath) and not self.save_weights_only:
            _check_legacy_model(self.model, self.filepath)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        self.print_lines()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        if self._fit_started:  # fit(initial_epoch=N): what restarts, once
            self._fit_started = False
            continuing_fit.say_what_restarts(self, epoch, self.storage_options)
        self.print_lines()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)
        try:
            self.wait_for_uploads()
        finally:
            self.print_lines()

    def wait_for_uploads(self, timeout: float | None = None) -> bool:
        """Block until the files saved so far are written; raises the last failure. False on timeout."""
        return self.writer.wait(timeout)

    def print_lines(self) -> None:
        """Print the "finished saving" lines of the files landed since (the training thread only)."""
        with self._lines_lock:
            lines, self._lines = self._lines, []
        for line in lines:
            _print_msg(line)

    # ------------------------------------------------------------------ the write (Keras' _save_model)

    def _save_model(self, epoch: int, batch: int | None, logs: dict[str, Any] | None) -> None:
        """Keras' decision and name; the file staged locally, then landed whole in the background."""
        filepath = self._get_file_path(epoch, batch, logs)
        if not compat.should_save_model(self, epoch, batch, logs, filepath):
            return
        target = self._target(filepath)
        if target.is_dir():
            raise OSError(  # as Keras says it
                "Please specify a non-directory filepath for ModelCheckpoint. Filepath used is an "
                f"existing directory: {filepath}"
            )
        local = self.staging_dir / f"{os.getpid()}-{next(_counter)}" / hdf5_files.staged_name(target.name)
        save_and_load.save_file(self.model, local, weights_only=bool(self.save_weights_only))
        floats = training_state.logs_to_floats(logs)
        details = state_file.jsonable({
            "epoch": epoch + 1, "batch": None if batch is None else batch + 1,
            "step": training_state.iterations(self.model), "monitor": self.monitor,
            "mode": _mode_of(self), "best": None if self.best is None else float(self.best),
            "metrics": floats, "weights_only": bool(self.save_weights_only), "keras": keras.__version__,
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        })
        said = self.verbose and compat.says_finished_saving()  # as this Keras' own ModelCheckpoint
        line = f"\nEpoch {epoch + 1}: finished saving model to {filepath}" if said else None
        job = FileJob(local, target, details, on_landed=lambda _: self._landed(target, line))
        self.writer.write_later(job)
        if not self.async_upload:
            self.print_lines()  # written inside the save: said where Keras says it

    def _target(self, url: str) -> FileTarget:
        if url not in self._targets:
            self._targets[url] = FileTarget(url, storage_options=self.storage_options)
        return self._targets[url]

    def _landed(self, target: FileTarget, line: str | None) -> None:
        """After each file landed (in the writer's thread): its line, then retention (``keep_last``)."""
        if line is not None:
            with self._lines_lock:
                self._lines.append(line)
        if target.url in self.written:
            self.written.remove(target.url)
        self.written.append(target.url)
        if self.keep_last is None:
            return
        while len(self.written) > self.keep_last:
            old = self.written.pop(0)
            try:
                self._target(old).delete()
            except Exception as e:  # noqa: BLE001 - a failed delete never stops training
                warnings.warn(f"resumable: could not delete {old}: {e}", stacklevel=1)


def _check_verbose(verbose: Any) -> int:
    """Keras' 0 and 1 (any int >= 0, as Keras compares ``verbose > 0``); ``"auto"`` is 1, as for fit."""
    if verbose == "auto":
        return 1
    if isinstance(verbose, int) and verbose >= 0:
        return verbose
    raise ValueError(
        f"Invalid value for argument `verbose`. Received: verbose={verbose!r}. Expected 0, 1 or 'auto'."
    )


def _check_drive(filepath: Any) -> None:
    """A file under ``/content/drive`` while Drive is not mounted: refused now, not after an epoch."""
    if isinstance(filepath, str) and "://" not in filepath:
        folder, _ = split_url(filepath)
        if "{" not in folder:
            check_drive_mounted(filepath, folder)


def _check_legacy_model(model: keras.Model, filepath: str) -> None:
    """Keras' HDF5 model file needs the model's config: say so before the first epoch, not after it."""
    try:
        model.get_config()
    except NotImplementedError:
        raise ValueError(
            f"resumable.ModelCheckpoint: {filepath} names a Keras 2 HDF5 model file, which cannot hold "
            f"{type(model).__name__} (a subclassed model without get_config()); name the file .keras, "
            "or pass save_weights_only=True to write Keras 2's weights file"
        ) from None


def _mode_of(callback: keras.callbacks.ModelCheckpoint) -> str | None:
    """'min' or 'max' as Keras resolved ``mode`` (``monitor_op`` is set at the first epoch end)."""
    op = getattr(callback, "monitor_op", None)
    if op is None:
        return None
    return "min" if op is keras.ops.less else "max" if op is keras.ops.greater else None


def _print_msg(message: str) -> None:
    """As Keras prints its callbacks' lines: stdout with interactive logging, else absl's log."""
    if keras.config.is_interactive_logging_enabled():
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    else:
        absl_logging.info(message)


__all__ = ["ModelCheckpoint", "load_model", "load_weights", "save_model", "verify_file"]
