"""resumable: Keras training that survives Colab disconnects.

Storage and the CLI work without TensorFlow; the Keras-facing names (`CheckpointCallback`,
`resume`, `Run`) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resumable.errors import (
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
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
from resumable.manifest import Manifest
from resumable.retry import RetryPolicy
from resumable.storage import CheckpointInfo, RunStorage, Status

__version__ = "0.1.0"

if TYPE_CHECKING:
    from resumable.callback import CheckpointCallback
    from resumable.run import Run, resume

# `resume` lives in resumable.run: a submodule named resumable.resume would replace the function
# `resumable.resume` with the module as soon as anything imported it.
_LAZY = {"CheckpointCallback": "resumable.callback", "resume": "resumable.run", "Run": "resumable.run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'resumable' has no attribute {name!r}")


__all__ = [
    "CheckpointCallback",
    "CheckpointExistsError",
    "CheckpointInfo",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "LeaseHeldError",
    "LeaseLostError",
    "Manifest",
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
    "resume",
]
