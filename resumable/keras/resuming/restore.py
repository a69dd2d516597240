"""A checkpoint restored into a run: what resume(), a Run rolled back after an exception and
BackupAndRestore do once they have the checkpoint's folder.

The model's weights and optimizer state are loaded (already, by resume(), which builds the
model from them), then the callback takes over the training state (epochs done, best, history,
callbacks', metrics' and RNG states) and the cache keeps that checkpoint alone. ``state.json``
and ``arrays.npz`` are read once for all of it (`files_to_model.ReadOnce`): by the check before
loading, the load and the callback's restore.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import keras

from resumable.keras.checkpoint import files_to_model
from resumable.keras.multihost import split_job
from resumable.manager import CheckpointInfo

if TYPE_CHECKING:
    from resumable.keras.callback.checkpoint_callback import CheckpointCallback


def restore_checkpoint(callback: CheckpointCallback, info: CheckpointInfo, folder: Path,
                       reads: files_to_model.ReadOnce, *, into: keras.Model | None = None,
                       only_cached: bool = True) -> None:
    """Restore checkpoint ``info``, fetched to ``folder``: its weights and optimizer state into
    ``into`` (None: loaded already), its training state into ``callback``; then, with
    ``only_cached``, the local cache holds it alone (a later resume reuses its files).

    ``reads`` holds what the check and the load read of the folder, so nothing is read twice.
    The newer checkpoints found damaged (``callback.manager.damaged``) stay named for training
    to replace.
    """
    if into is not None:
        load = split_job.load_into if split_job.holds(info) else files_to_model.load_into  # #36: split model
        load(into, folder, info.url, reads=reads)
    callback.restore(info, reads.state(folder, info.url), reads.arrays(folder, info.url),
                     callback.manager.damaged)
    reads.clear()  # the callback holds what it restores from; nothing else is read again
    if only_cached:
        callback.manager.keep_only_cached(info.name)
