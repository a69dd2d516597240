"""`resumable.BackupAndRestore`: ``keras.callbacks.BackupAndRestore`` on resumable's commit protocol.

Keras' semantics: in a plain ``model.fit(..., callbacks=[...])`` it restores the model's weights,
its optimizer state and the epoch in ``on_train_begin`` (``fit`` then starts at that epoch), saves
a backup at every epoch end (or every ``save_freq`` batches) and deletes it when training ends
normally. The backup folder is a resumable run folder: each backup is a checkpoint committed by
its manifest (see docs/format.md), so a process killed mid-save leaves the previous one intact, a
damaged one is skipped for the one before it, and it works on ``gs://``, under the writer lease,
with the other callbacks' state carried over. `resumable.resume(backup_dir, ...)` reads the same
folder, and its ``run.fit`` continues a mid-epoch backup at the saved batch.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from pathlib import Path
from typing import Any

from resumable.core import user_warnings
from resumable.keras import compat
from resumable.keras.callback.checkpoint_callback import CheckpointCallback
from resumable.keras.checkpoint import files_to_model, snapshot
from resumable.keras.multihost import split_job
from resumable.keras.resuming.restore import restore_checkpoint
from resumable.manager import DEFAULT_TIMEOUT, CheckpointInfo
from resumable.manager.job_commit import DEFAULT_BARRIER_TIMEOUT

logger = logging.getLogger("resumable")


class BackupAndRestore(CheckpointCallback):
    """``keras.callbacks.BackupAndRestore``, whose backups survive a kill mid-save, on any storage.

    The first four arguments are Keras 3's, in its order, with its defaults and meaning: swap
    ``keras.callbacks.BackupAndRestore(`` for ``resumable.BackupAndRestore(``. In a plain
    ``model.fit`` it restores the model (weights and optimizer state) and the epoch at
    ``on_train_begin`` and training continues there; at a normal end of training the backup
    is deleted (``delete_checkpoint=True``). A backup taken mid-epoch restarts that epoch from
    its first batch, as Keras does; ``resumable.resume(backup_dir, build_model=...)`` and
    ``run.fit`` continue it at the saved batch instead.

    On top of Keras: each backup is committed by a manifest written last (a kill mid-save leaves
    the previous backup), every file has a CRC32C and a damaged backup is skipped for the one
    before it (kept with ``double_checkpoint=True``), ``gs://`` and any fsspec URL, the writer
    lease (a second process writing the same folder stops with one line), and the state of
    EarlyStopping, ReduceLROnPlateau and ModelCheckpoint in the same fit.

    Args:
        backup_dir: The backup folder: local, ``/content/drive/...``, ``gs://bucket/prefix``.
        save_freq: ``"epoch"``, or an int N to also back up every N batches. Defaults to "epoch".
        double_checkpoint: Keep the previous backup too, restored when the newest is damaged.
            Defaults to False.
        delete_checkpoint: Delete the backups when training ends normally. Defaults to True.
        save_interval: Also back up mid-epoch once this much training time has passed (seconds
            or a ``timedelta``). Defaults to None.
        verbose: 1 prints a line per backup, 0 is silent; ``"auto"`` is 1. Defaults to 0.
        staging_dir: As for `CheckpointCallback`.
        storage_options: As for `CheckpointCallback`.
        async_upload: As for `CheckpointCallback`.
        takeover: As for `CheckpointCallback`.
        lease_timeout: As for `CheckpointCallback`.
        when_behind: As for `CheckpointCallback`.
        barrier_timeout: As for `CheckpointCallback`.
        snapshot_memory: As for `CheckpointCallback`: the host memory a backup may copy (bytes,
            or "auto"); a bigger one is written while training waits, a variable at a time.
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike[str],
        save_freq: str | int = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
        *,
        save_interval: float | datetime.timedelta | None = None,
        verbose: int | str = 0,
        staging_dir: str | Path | None = None,
        storage_options: dict[str, Any] | None = None,
        async_upload: bool = True,
        takeover: bool = False,
        lease_timeout: float | datetime.timedelta = DEFAULT_TIMEOUT,
        when_behind: str = "skip",
        barrier_timeout: float | datetime.timedelta = DEFAULT_BARRIER_TIMEOUT,
        snapshot_memory: int | str = "auto",
    ) -> None:
        if not backup_dir:
            raise ValueError("Empty `backup_dir` argument passed")
        if save_freq != "epoch" and not isinstance(save_freq, int):
            raise ValueError(
                "Invalid value for argument `save_freq`. "
                f"Received: save_freq={save_freq}. Expected either 'epoch' or an integer value."
            )
        # Keras backs up at every batch for save_freq 0 (and False): so does this.
        freq: str | int = save_freq if save_freq == "epoch" else max(int(save_freq), 1)
        self.backup_dir = os.fspath(backup_dir)
        self.double_checkpoint = bool(double_checkpoint)
        self.delete_checkpoint = bool(delete_checkpoint)
        super().__init__(
            self.backup_dir, monitor="loss", save_freq=freq, save_interval=save_interval,
            keep_last=2 if self.double_checkpoint else 1, keep_best=0, save_weights_only=True,
            verbose=verbose, staging_dir=staging_dir, storage_options=storage_options,
            async_upload=async_upload, takeover=takeover, lease_timeout=lease_timeout,
            when_behind=when_behind, barrier_timeout=barrier_timeout, snapshot_memory=snapshot_memory,
        )

    epoch_from_fit = True  # no backup: fit's own initial_epoch, as in Keras
    saves_where_listed = True  # back up at this callback's place in the list, as Keras does

    def __repr__(self) -> str:
        return f"BackupAndRestore({self.backup_dir!r}, epochs_done={self.epochs_done})"

    # ------------------------------------------------------------------ what Keras' tests look at

    @property
    def _current_epoch(self) -> int:
        """Epochs done (Keras' attribute)."""
        return self.epochs_done

    @property
    def _last_batch_seen(self) -> int:
        """The last batch seen in the current epoch, 0 between epochs (Keras' attribute)."""
        seen = self.position.batches_in_epoch
        return seen - 1 if seen else 0

    def _backup_file(self, index: int, rel: str) -> str:
        """A file of the newest (0) or previous (1) backup, after the pending uploads landed."""
        with contextlib.suppress(Exception):
            self.manager.wait(message=False)
        backups = [info for info in self.storage.list(check_files=False) if info.manifest is not None]
        backups.sort(key=lambda info: (info.epoch or 0, info.step or 0), reverse=True)
        name = backups[index].name if index < len(backups) else "none"
        return f"{self.storage.url}/{name}/{rel}"

    @property
    def _weights_path(self) -> str:
        return self._backup_file(0, snapshot.WEIGHTS_FILE)

    @property
    def _training_metadata_path(self) -> str:
        return self._backup_file(0, "manifest.json")

    @property
    def _prev_weights_path(self) -> str:
        return self._backup_file(1, snapshot.WEIGHTS_FILE)

    @property
    def _prev_training_metadata_path(self) -> str:
        return self._backup_file(1, "manifest.json")

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if not model.built:
            raise ValueError(
                "To use the BackupAndRestore callback, you model must be built before you call `fit()`. "
                f"Model {model} is unbuilt. You can build it beforehand by calling it on a batch of data."
            )
        self.manager.finish(quiet=True)  # an earlier fit an exception ended: its backups land first
        self.forget_run()
        reads = files_to_model.ReadOnce()
        found = self._newest_restored(model, reads)
        if found is not None:
            info, local = found
            restore_checkpoint(self, info, local, reads)
            compat.set_fit_initial_epoch(model, info.epoch)
            if self.resume_batch:
                logger.info("resumable: %s was saved %d batches into epoch %d; model.fit restarts that epoch "
                            "(resumable.resume() and run.fit continue at the batch)", info.url,
                            self.resume_batch, (info.epoch or 0) + 1)
                self.restored_state.replay_epoch()
            if self.verbose:
                print(f"resumable: restored {info.url} (epoch {info.epoch})")
        else:
            if self.manager.damaged:
                self.manager.resumed_from(None, self.manager.damaged)
            compat.set_fit_initial_epoch(model, None)
        super().on_train_begin(logs)

    def _newest_restored(self, model: Any,
                         reads: files_to_model.ReadOnce) -> tuple[CheckpointInfo, Path] | None:
        """The newest backup that loads, loaded into ``model``, and its folder; None if none.
        ``reads``: its state.json and arrays.npz, read once for the load and the restore."""
        def warn(problem: str) -> None:
            user_warnings.warn(f"resumable: {problem}")

        if split_job.split_across_processes(model):  # #36: every process its part, of the same backup
            job = split_job.JobResume(self.manager, timeout=self.barrier_timeout)
            return job.restore_into(model, warn=warn, reads=reads)
        found = self.manager.fetch_newest(warn=warn, check=reads.check)  # damaged: skipped
        if found is not None:
            files_to_model.load_into(model, found[1], found[0].url, reads=reads)
        return found

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        try:
            super().on_train_end(logs)
        finally:
            with contextlib.suppress(Exception):
                compat.set_fit_initial_epoch(self.model, None)  # Keras leaves it set; a later fit starts anew
        if self.delete_checkpoint and self.is_chief():
            self.delete_backup()

    def delete_backup(self) -> None:
        """Delete every backup, then the folder when nothing else is in it (Keras deletes the folder)."""
        # each delete, the index's included, after the lease check
        self.manager.writer.delete_every_checkpoint()

__all__ = ["BackupAndRestore"]
