"""resumable: Keras training that survives Colab disconnects.

Storage and the CLI work without TensorFlow; the Keras-facing names (`CheckpointCallback`,
`resume`, `Run`, `ModelCheckpoint`, `BackupAndRestore`, `save_model`, `load_model`,
`load_newest_model`, ...) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resumable._keras_floor import warn_if_too_old
from resumable._version import __version__
from resumable.core.errors import (
    BarrierTimeoutError,
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    DriveNotMountedError,
    LeaseHeldError,
    LeaseLostError,
    NoSpaceError,
    NotAFolderError,
    NotAuthenticatedError,
    ResumableError,
    RunNotFoundError,
    StorageError,
    StoragePermissionError,
    UnsupportedFormatError,
)
from resumable.core.manifest import Manifest
from resumable.storage import CheckpointInfo, RunStorage, Status
from resumable.storage.retry import RetryPolicy

warn_if_too_old()

if TYPE_CHECKING:
    from resumable.keras.callback.checkpoint_callback import CheckpointCallback
    from resumable.keras.dropins.backup_and_restore import BackupAndRestore
    from resumable.keras.dropins.model_checkpoint import ModelCheckpoint
    from resumable.keras.dropins.newest_model import load_newest_model
    from resumable.keras.dropins.save_and_load import load_model, load_weights, save_model, verify_file
    from resumable.keras.run import Run, resume
    from resumable.manager.tiers import LocalTier

# `resume` lives in resumable.keras.run: a submodule named resumable.resume would replace the function
# `resumable.resume` with the module as soon as anything imported it.
_LAZY = {
    "BackupAndRestore": "resumable.keras.dropins.backup_and_restore",
    "CheckpointCallback": "resumable.keras.callback.checkpoint_callback",
    "LocalTier": "resumable.manager.tiers",
    "ModelCheckpoint": "resumable.keras.dropins.model_checkpoint",
    "load_model": "resumable.keras.dropins.save_and_load",
    "load_newest_model": "resumable.keras.dropins.newest_model",
    "load_weights": "resumable.keras.dropins.save_and_load",
    "save_model": "resumable.keras.dropins.save_and_load",
    "verify_file": "resumable.keras.dropins.save_and_load",
    "resume": "resumable.keras.run",
    "Run": "resumable.keras.run",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'resumable' has no attribute {name!r}")


__all__ = [
    "BackupAndRestore",
    "BarrierTimeoutError",
    "CheckpointCallback",
    "CheckpointExistsError",
    "CheckpointInfo",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "DriveNotMountedError",
    "LeaseHeldError",
    "LeaseLostError",
    "LocalTier",
    "Manifest",
    "ModelCheckpoint",
    "NoSpaceError",
    "NotAFolderError",
    "NotAuthenticatedError",
    "ResumableError",
    "RetryPolicy",
    "Run",
    "RunNotFoundError",
    "RunStorage",
    "Status",
    "StorageError",
    "StoragePermissionError",
    "UnsupportedFormatError",
    "__version__",
    "load_model",
    "load_newest_model",
    "load_weights",
    "resume",
    "save_model",
    "verify_file",
]
