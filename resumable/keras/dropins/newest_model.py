"""`load_newest_model`: the newest good file a `resumable.ModelCheckpoint` (or Keras' own) wrote,
and the epoch to continue at, for the next session of a notebook that keeps its callbacks."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import keras

from resumable.core.errors import CheckpointNotFoundError
from resumable.keras.dropins import adopt
from resumable.keras.dropins.save_and_load import MODEL_FILE_SUFFIXES
from resumable.manager import split_url


def load_newest_model(filepath: str | os.PathLike[str], *,
                      build_model: Callable[[], keras.Model] | None = None,
                      storage_options: dict[str, Any] | None = None) -> tuple[keras.Model, int]:
    """The newest good model a `ModelCheckpoint` wrote, and the ``initial_epoch`` to fit from.

    ``filepath`` is the callback's own ``filepath`` (a template such as
    ``"/content/drive/MyDrive/ck/weights-{epoch:02d}-{val_acc:.3f}.keras"``: only the files it
    names count) or their folder. A file with a checksum record (`resumable.ModelCheckpoint`) is
    checked against it and gives its epoch; a file Keras' ModelCheckpoint wrote gives the number
    in its name's ``{epoch}`` field. Files are tried newest first: a damaged one, or one that does
    not load, is skipped with one warning line naming it. Files are only read.

    Example:

    ```python
    filepath = "/content/drive/MyDrive/ck/weights-{epoch:02d}-{val_acc:.3f}.keras"
    checkpoint = resumable.ModelCheckpoint(filepath, monitor="val_acc", mode="max")
    model, initial_epoch = resumable.load_newest_model(filepath)
    model.fit(x, y, epochs=20, initial_epoch=initial_epoch, callbacks=[checkpoint])
    ```

    Args:
        filepath: The callback's file template, or the folder holding its files.
        build_model: A function returning the compiled model, to receive the file's weights and
            optimizer state; needed for ``.weights.h5`` files (``save_weights_only=True``).
            Defaults to None: the model saved in the file, as `resumable.load_model` loads it.
        storage_options: Passed to the fsspec filesystem, e.g. ``{"token": "anon"}``.

    Returns:
        ``(model, initial_epoch)``: the model, and the epochs done when it was saved (a file saved
        mid-epoch counts the epochs before it: that epoch is trained again).

    Raises:
        CheckpointNotFoundError: No file is there, or none can be loaded (each said why).
    """
    text = os.fspath(filepath)
    folder, name = split_url(text)
    is_template = "{" in name or name.endswith(MODEL_FILE_SUFFIXES)
    if not is_template:
        folder, name = text, ""
    if "{" in folder:
        raise ValueError(f"Invalid value for argument `filepath`. Received: filepath={text!r}. Expected a "
                         "template with its {fields} in the file name only, or a folder.")
    adopted = adopt.load_newest(folder, build_model, template=name or None, storage_options=storage_options)
    if adopted is None:
        raise CheckpointNotFoundError(f"{text}: no model file there to continue from; train with the "
                                      "ModelCheckpoint first, or check the path")
    return adopted.model, adopted.epochs_done


__all__ = ["load_newest_model"]
