"""One model file on any storage, written whole with a checksum record, and read back checked.

`save_model` is ``model.save`` for a local path, a Google Drive folder, ``gs://bucket/...`` or
any fsspec URL: Keras serializes into a local temporary folder, then the file lands at its name
whole or not at all, with its checksum record beside it (`resumable.storage.single_file`), as
`resumable.ModelCheckpoint` writes each of its files. `load_model`, `load_weights` and
`verify_file` read such a file (or any model file) back, checked against its record.
"""

from __future__ import annotations

import datetime
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import keras

from resumable.core import user_warnings
from resumable.keras.checkpoint.model_to_files import no_tensorflow_import
from resumable.keras.checkpoint.state_file import jsonable
from resumable.keras.checkpoint.training_state import iterations
from resumable.keras.dropins import hdf5_files
from resumable.manager import FileRecord, FileTarget

MODEL_FILE_SUFFIXES = (".keras", ".weights.h5", *hdf5_files.LEGACY_SUFFIXES)


def save_model(model: keras.Model, filepath: str | os.PathLike[str], *, overwrite: bool = True,
               storage_options: dict[str, Any] | None = None, **kwargs: Any) -> FileRecord:
    """``model.save`` to a local path, ``/content/drive/...``, ``gs://bucket/...`` or any fsspec URL.

    The format comes from the name, as in Keras: ``.keras`` (the model with its optimizer
    state), ``.weights.h5`` (``model.save_weights``: the weights and the optimizer state),
    ``.h5`` or ``.hdf5`` (Keras' legacy HDF5 model file, which `load_model` reads back compiled,
    optimizer state included). The file lands whole or not at all (a process killed mid-save
    leaves the previous file), with a checksum record ``.<name>.resumable.json`` beside it that
    `load_model` checks. A path under ``/content/drive`` is refused while Google Drive is not
    mounted there.

    Example:

    ```python
    resumable.save_model(model, "gs://my-bucket/models/sentiment.keras")
    model = resumable.load_model("gs://my-bucket/models/sentiment.keras")
    ```

    Args:
        model: The model to save.
        filepath: Where: a file name ending in ``.keras``, ``.weights.h5``, ``.h5`` or ``.hdf5``.
        overwrite: Replace a file already there; False raises ``FileExistsError`` instead.
            Defaults to True.
        storage_options: Passed to the fsspec filesystem, e.g. ``{"token": "anon"}``.
        **kwargs: Passed to Keras' ``model.save`` (or ``save_weights``).

    Returns:
        The file's record: its size and CRC32C.
    """
    text = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else filepath
    if not isinstance(text, str) or not text.endswith(MODEL_FILE_SUFFIXES):
        raise ValueError(
            f"Invalid value for argument `filepath`. Received: filepath={filepath!r}. Expected a file name "
            "ending in .keras (the whole model), .weights.h5 (weights only), or .h5/.hdf5 (Keras 2's format)."
        )
    target = FileTarget(text, storage_options=storage_options)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "a folder is there; pass a file name such as model.keras", text)
    if not overwrite and target.exists():
        raise FileExistsError(errno.EEXIST, "a file is there already; pass overwrite=True to replace it",
                              text)
    staging = Path(tempfile.mkdtemp(prefix="resumable-save-"))
    try:
        local = staging / hdf5_files.staged_name(target.name)
        save_file(model, local, **kwargs)
        details = jsonable({
            "step": iterations(model), "weights_only": target.name.endswith(".weights.h5"),
            "keras": keras.__version__,
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        })
        return target.land(local, details)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def local_copy(filepath: str | os.PathLike[str], storage_options: dict[str, Any] | None, *,
               warn_unrecorded: bool = True) -> tuple[Path, FileRecord | None]:
    """A local file to load (locally: the file itself), checked against its record when it has one;
    a legacy HDF5 name staged under the suffix Keras reads it by."""
    target = FileTarget(os.fspath(filepath), storage_options=storage_options)
    cache = Path(tempfile.mkdtemp(prefix="resumable-load-"))
    path, record = target.fetch(cache)
    if record is None and warn_unrecorded:
        user_warnings.warn(f"resumable: {target.url} has no checksum record ({target.name} was not written "
                           "by resumable, or its writer was killed before the record): loaded unverified")
    if hdf5_files.is_legacy_name(path.name) and not path.name.endswith(".h5"):
        staged = cache / hdf5_files.staged_name(path.name)  # Keras reads legacy HDF5 by its suffix
        if path.parent == cache:
            path.rename(staged)
        else:
            shutil.copyfile(path, staged)
        path = staged
    return path, record


def load_model(filepath: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
               **kwargs: Any) -> keras.Model:
    """``keras.saving.load_model`` of a file `ModelCheckpoint` or `save_model` wrote, checked first.

    Works on local paths, Drive and ``gs://`` URLs. Raises `CorruptCheckpointError` when the file
    does not match its checksum record; warns when it has none. A ``.h5``/``.hdf5`` model file
    comes back compiled with its optimizer state, ready for ``fit(initial_epoch=...)`` (Keras 3's
    own loader drops that state). ``kwargs`` go to Keras.
    """
    path, _ = local_copy(filepath, storage_options)
    return load_file(path, **kwargs)


def load_weights(model: keras.Model, filepath: str | os.PathLike[str], *,
                 storage_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """``model.load_weights`` of a file `ModelCheckpoint` or `save_model` wrote, checked against its record.

    The optimizer is built first, so a compiled model gets the optimizer state of a
    ``.weights.h5`` or ``.h5``/``.hdf5`` file back too.
    """
    path, _ = local_copy(filepath, storage_options)
    load_weights_file(model, path, **kwargs)


def verify_file(filepath: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
                ) -> FileRecord | None:
    """Re-read a file `ModelCheckpoint` or `save_model` wrote and check it against its record.

    Returns the record (a `FileRecord`: ``size``, ``crc32c``, ``details``), or None when the
    file has none. Raises `CorruptCheckpointError` when the file does not match it.
    """
    return FileTarget(os.fspath(filepath), storage_options=storage_options).verify()


__all__ = ["MODEL_FILE_SUFFIXES", "load_model", "load_weights", "save_model", "verify_file"]


# ------------------------------------------------------------- one local model file, as Keras writes it


def save_file(model: keras.Model, path: Path, *, weights_only: bool = False, **kwargs: Any) -> None:
    """One model file as Keras writes it, by suffix: ``.keras`` (model.save), ``.weights.h5``
    (save_weights: weights and the optimizer's state once built), ``.h5`` (Keras' legacy HDF5
    file: the model, or with ``weights_only`` Keras 2's weights file; `legacy_h5`). ``kwargs``
    go to Keras' save."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".weights.h5"):
        model.save_weights(str(path), overwrite=True, **kwargs)
    elif hdf5_files.is_legacy_name(path.name):
        hdf5_files.save(model, path, weights_only=weights_only, **kwargs)
    else:
        model.save(str(path), overwrite=True, **kwargs)


def load_file(path: Path, **kwargs: Any) -> keras.Model:
    """``keras.saving.load_model`` of one local model file (resumable.load_model); a legacy HDF5
    file with its optimizer state (`legacy_h5`)."""
    with no_tensorflow_import():
        if hdf5_files.is_legacy_name(path.name):
            return hdf5_files.load_model(path, **kwargs)
        return keras.saving.load_model(str(path), **kwargs)


def load_weights_file(model: keras.Model, path: Path, **kwargs: Any) -> None:
    """``model.load_weights`` of one local file, the optimizer built first (resumable.load_weights)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built:
        optimizer.build(model.trainable_variables)  # Keras 3 skips optimizer variables otherwise
    if hdf5_files.is_legacy_name(path.name):
        hdf5_files.load_weights(model, path, **kwargs)
    else:
        model.load_weights(str(path), **kwargs)
