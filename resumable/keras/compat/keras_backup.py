"""The files ``keras.callbacks.BackupAndRestore`` writes in its ``backup_dir``, for `resume()` to adopt.

Keras 3 names them in private attributes of the callback (``_weights_path``,
``_training_metadata_path``, ``_prev_weights_path``, ``_prev_training_metadata_path``): read from
an instance, so a Keras that renames them is followed; Keras 3.0 to 3.15's names otherwise.
The metadata is ``{"epoch": epochs done, "batch": the last batch seen in the next epoch}``.
"""

from __future__ import annotations

from typing import NamedTuple

import keras

_FALLBACK = ("latest.weights.h5", "training_metadata.json")


class BackupNames(NamedTuple):
    """File names inside a backup folder: the newest backup, then the previous one (double_checkpoint)."""

    weights: str
    metadata: str
    previous_weights: str
    previous_metadata: str


def backup_names() -> BackupNames:
    """The names Keras' BackupAndRestore gives its files in its folder."""
    weights, metadata = _FALLBACK
    try:
        callback = keras.callbacks.BackupAndRestore(backup_dir="backup")  # writes nothing until fit
        weights = _basename(callback._weights_path) or weights
        metadata = _basename(callback._training_metadata_path) or metadata
        previous = (_basename(getattr(callback, "_prev_weights_path", "")) or f"{weights}.bkp",
                    _basename(getattr(callback, "_prev_training_metadata_path", "")) or f"{metadata}.bkp")
    except Exception:  # noqa: BLE001 - an unknown Keras: its 3.x names
        previous = (f"{weights}.bkp", f"{metadata}.bkp")
    return BackupNames(weights, metadata, *previous)


def _basename(path: object) -> str:
    return str(path).replace("\\", "/").rsplit("/", 1)[-1] if isinstance(path, str) and path else ""


__all__ = ["BackupNames", "backup_names"]
