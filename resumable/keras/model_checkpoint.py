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
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import keras

from resumable.core.errors import ResumableError
from resumable.keras import compat, keras_io
from resumable.manager.file_writer import FileJob, FileWriter
from resumable.storage.single_file import FileRecord, FileTarget

_LEGACY_SUFFIXES = (".h5", ".hdf5")
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
    ``.hdf5`` names not ending in ``.weights.h5`` (the names older articles use) hold Keras'
    legacy HDF5 model file, with or without ``save_weights_only``: both
    ``keras.saving.load_model(path)`` and ``model.load_weights(path)`` read it back (Keras 3 itself
    refuses ``.hdf5``, and ``.h5`` with ``save_weights_only=True``).

    Args:
        filepath: The file to write: a fixed name (``"best.keras"``) or a template with
            ``{epoch}``, ``{batch}`` and any logged metric (``"w-{epoch:02d}-{val_loss:.2f}.keras"``);
            local, ``/content/drive/...``, ``gs://bucket/...`` or another fsspec URL.
        monitor: As in Keras. Defaults to ``"val_loss"``.
        verbose: As in Keras. Defaults to 0.
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
        verbose: int = 0,
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
        legacy = isinstance(text, str) and _legacy_name(text)
        checked = text + (".weights.h5" if save_weights_only else ".keras") if legacy else text
        super().__init__(checked, monitor=monitor, verbose=verbose, save_best_only=save_best_only,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq,
                         initial_value_threshold=initial_value_threshold)
        self.filepath = text
        if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool)
                                      or keep_last < 1):
            raise ValueError(f"Invalid value for argument `keep_last`. Received: keep_last={keep_last!r}. "
                             "Expected a positive int or None.")
        if not isinstance(async_upload, bool):
            raise ValueError("Invalid value for argument `async_upload`. "
                             f"Received: async_upload={async_upload!r}. Expected True or False.")
        self.keep_last = keep_last
        self.async_upload = async_upload
        self.storage_options = storage_options
        self.staging_dir = Path(staging_dir) if staging_dir is not None else (
            Path(tempfile.gettempdir()) / "resumable-cache" / "files")
        self.writer = FileWriter(background=async_upload)
        self.written: list[str] = []  # URLs written by this callback, oldest first (for keep_last)
        self._targets: dict[str, FileTarget] = {}

    def __repr__(self) -> str:
        return f"ModelCheckpoint({self.filepath!r}, monitor={self.monitor!r})"

    # ------------------------------------------------------------------ Keras hooks

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)
        self.wait_for_uploads()

    def wait_for_uploads(self, timeout: float | None = None) -> bool:
        """Block until the files saved so far are written; raises the last failure. False on timeout."""
        return self.writer.wait(timeout)

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
        local = self.staging_dir / f"{os.getpid()}-{next(_counter)}" / _staged_name(target.name)
        keras_io.save_file(self.model, local)
        floats = keras_io.logs_to_floats(logs)
        details = keras_io.jsonable({
            "epoch": epoch + 1, "batch": None if batch is None else batch + 1,
            "step": keras_io.iterations(self.model), "monitor": self.monitor,
            "best": None if self.best is None else float(self.best), "metrics": floats,
            "weights_only": bool(self.save_weights_only), "keras": keras.__version__,
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        })
        self.writer.submit(FileJob(local, target, details, on_landed=lambda _: self._landed(target)))
        if self.verbose > 0:
            where = "uploading in the background" if self.async_upload else "written"
            keras.utils.io_utils.print_msg(
                f"\nEpoch {epoch + 1}: finished saving model to {filepath} ({where})")

    def _target(self, url: str) -> FileTarget:
        if url not in self._targets:
            self._targets[url] = FileTarget(url, storage_options=self.storage_options)
        return self._targets[url]

    def _landed(self, target: FileTarget) -> None:
        """Retention after each file landed (in the writer's thread): keep the newest ``keep_last``."""
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


def _legacy_name(name: str) -> bool:
    """``.h5``/``.hdf5`` names Keras 3's ModelCheckpoint refuses or writes as legacy HDF5."""
    return name.endswith(_LEGACY_SUFFIXES) and not name.endswith(".weights.h5")


def _staged_name(name: str) -> str:
    """The local file name Keras is asked to write: the suffix picks the format."""
    if _legacy_name(name):
        return name.rsplit(".", 1)[0] + ".h5"  # Keras' legacy HDF5 model file
    return name


def _local_copy(filepath: str | os.PathLike[str], storage_options: dict[str, Any] | None
                ) -> tuple[Path, FileRecord | None]:
    target = FileTarget(os.fspath(filepath), storage_options=storage_options)
    cache = Path(tempfile.mkdtemp(prefix="resumable-load-"))
    path, record = target.fetch(cache)
    if record is None:
        warnings.warn(f"resumable: {target.url} has no checksum record ({target.name} was not written by "
                      "resumable, or its writer was killed before the record): loaded unverified",
                      stacklevel=3)
    if _legacy_name(path.name) and not path.name.endswith(".h5"):
        staged = cache / _staged_name(path.name)  # Keras reads legacy HDF5 by its suffix
        if path.parent == cache:
            path.rename(staged)
        else:
            shutil.copyfile(path, staged)
        path = staged
    return path, record


def load_model(filepath: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
               **kwargs: Any) -> keras.Model:
    """``keras.saving.load_model`` of a file `ModelCheckpoint` wrote, checked against its record.

    Works on local paths, Drive and ``gs://`` URLs. Raises `CorruptCheckpointError` when the file
    does not match its checksum record; warns when it has none. ``kwargs`` go to Keras.
    """
    path, _ = _local_copy(filepath, storage_options)
    return keras_io.load_file(path, **kwargs)


def load_weights(model: keras.Model, filepath: str | os.PathLike[str], *,
                 storage_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """``model.load_weights`` of a file `ModelCheckpoint` wrote, checked against its record.

    As in Keras, compile the model first to get the optimizer state of a ``.weights.h5`` back.
    """
    path, _ = _local_copy(filepath, storage_options)
    keras_io.load_weights_file(model, path, **kwargs)


def verify_file(filepath: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
                ) -> FileRecord | None:
    """Re-read a file `ModelCheckpoint` wrote and check it against its record; None without record."""
    return FileTarget(os.fspath(filepath), storage_options=storage_options).verify()


__all__ = ["ModelCheckpoint", "load_model", "load_weights", "verify_file"]
