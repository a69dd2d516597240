"""From a model and where its run stands to a checkpoint handed to the manager: the state
(state.json), the summary (the manifest's ``state``), the model's snapshot or its files in a
staging folder, and the manifest that `RunWriter.submit` commits.

Training waits only for a copy of the values into host memory; the files are written with the
upload, in the background (`model_to_files.snapshot`, written by `write_staged` in the uploader's
thread). Without Keras' internals for that, the model is serialized at once as before; so is a
trainable-only checkpoint, whose megabytes take less time to write than to hold. A checkpoint
over the save's memory budget (``snapshot_memory``, #54) is copied only in part: its live part
is written at once, one variable at a time, while training waits, and the copied tail after it
in a thread of its own (`tail_write`); nothing copied, it is written into staging at once. Either
is uploaded (or, in a local run, copied into the run folder) in the background. A full disk is
one warning and training goes on.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import keras

from resumable.core import user_warnings
from resumable.core.errors import NoSpaceError
from resumable.core.manifest import FileEntry, Manifest
from resumable.keras import topology
from resumable.keras.callback.commit_lines import CommitLines, no_space_line
from resumable.keras.callback.save_options import SaveOptions
from resumable.keras.checkpoint import (
    lora,
    model_to_files,
    snapshot,
    state_file,
    tail_write,
    trainable,
    training_state,
    user_state,
)
from resumable.keras.multihost import parts
from resumable.keras.replay.inputs import Feed
from resumable.manager import NO_SPACE_ERRNOS
from resumable.manager.run_manager import RunManager
from resumable.manager.run_writer import RunWriter

logger = logging.getLogger("resumable")


@dataclass(frozen=True)
class Progress:
    """Where the run stands at a save, as its checkpoint records it."""

    epochs_done: int
    best: float | None
    stopped_early: bool
    epochs_planned: int | None
    history: list[dict[str, float]]  # the epochs done's logs

    @classmethod
    def of(cls, run: Any) -> Progress:
        """Where the fit of ``run`` (a `CheckpointCallback`) stands now."""
        return cls(epochs_done=run.epochs_done, best=run.best, stopped_early=run.stopped_early,
                   epochs_planned=(run.params or {}).get("epochs"), history=run.history[: run.epochs_done])


class CheckpointBuilder:
    """Builds and submits the checkpoints of one callback (``options``) through ``manager``;
    ``shares``: each whole snapshot is kept for `take_shared` (the durable tier's, for a local tier)."""

    def __init__(self, options: SaveOptions, manager: RunManager, lines: CommitLines, *,
                 shares: bool = False) -> None:
        self.options = options
        self.manager = manager
        self.lines = lines
        self.last_saved_step: int | None = None  # the newest checkpoint saved or resumed from
        # the save just submitted, when its whole snapshot is in memory: for the local tier to
        # write too (`LocalTierSaver.share`), handed over once by `take_shared`
        self._shared: SharedSave | None = None
        self._shares = shares
        self._lora_layers: bool | None = None  # whether the fit's model has LoRA layers; None: not asked yet
        self._placement: topology.Placement | None = None  # where the fit runs; None: not asked yet

    def fit_begins(self) -> None:
        """A fit begins: where it runs and whether its model has LoRA layers are asked again, at
        its first save (``enable_lora`` may have been called since the last fit; never during one)."""
        self._lora_layers = None
        self._placement = None

    def placement(self, model: keras.Model, strategy: Any) -> topology.Placement:
        """Where the fit of ``model`` runs (`topology.Placement`), asked once per fit."""
        if self._placement is None:
            self._placement = topology.placement(model, strategy)
        return self._placement

    def has_lora_layers(self, model: keras.Model) -> bool:
        """Whether ``model`` has LoRA layers, asked once per fit (`lora.in_model`)."""
        if self._lora_layers is None:
            self._lora_layers = lora.in_model(model)
        return self._lora_layers

    def state(self, model: keras.Model, progress: Progress, callback_states: dict[str, Any], step: int,
              batch: int, feed: Feed | None) -> dict[str, Any]:
        """What state.json holds (the arrays go to arrays.npz)."""
        return {
            "epoch": progress.epochs_done,
            "step": step,
            "batch": batch,
            "monitor": self.options.monitor,
            "mode": self.options.mode,
            "best": progress.best,
            "stopped_early": progress.stopped_early,
            "epochs_planned": progress.epochs_planned,
            "history": progress.history,
            "callbacks": callback_states,
            "optimizer": training_state.optimizer_summary(model),
            "rng": training_state.rng_state(),
            **({"inputs": feed.state()} if feed is not None else {}),
        }

    def summary(self, model: keras.Model, progress: Progress,
                callback_states: dict[str, Any]) -> dict[str, Any]:
        """What `resumable inspect` shows: small, JSON only."""
        summary = {
            "monitor": self.options.monitor,
            "mode": self.options.mode,
            "best": progress.best,
            "stopped_early": progress.stopped_early,
            "epochs_planned": progress.epochs_planned,
            "format": "split" if self.manager.job is not None else self.options.file_format,
            "backend": keras.backend.backend(),
            "optimizer": training_state.optimizer_summary(model),
            # your own callbacks' get_state() may be large: state.json holds it, the manifest does not
            "callbacks": {k: v for k, v in callback_states.items() if user_state.STATE_KEY not in v},
        }
        if self.options.save_trainable_only:  # the base model the run trains on (cached: no second pass)
            summary["frozen"] = trainable.fingerprint(model).to_json()
        return state_file.jsonable(summary)

    def save(self, model: keras.Model, strategy: Any, *, step: int, batch: int, logs: dict[str, float],
             progress: Progress, callbacks: Sequence[keras.callbacks.Callback], feed: Feed | None,
             epoch_rng: dict[str, Any]) -> dict[str, Any] | None:
        """Stage the checkpoint of ``model`` at optimizer step ``step`` (``batch`` into its epoch, whose
        data order came from the RNG states ``epoch_rng``; 0 at an epoch end) with the state of the
        fit's ``callbacks``, and submit it: committed in the background or now. Returns where the
        inputs of ``feed`` stand in it, if known."""
        callback_states, arrays = training_state.callback_states(callbacks)
        state = self.state(model, progress, callback_states, step, batch, feed)
        if batch:
            state["epoch_rng"] = epoch_rng
            arrays.update(training_state.metric_arrays(model))
        name = self.manager.storage.template.format(progress.epochs_done, step, logs, mid_epoch=batch > 0,
                                                    batch=batch)
        self._stage_and_submit(model, strategy, name=name, step=step, batch=batch, logs=logs,
                               progress=progress, state=state, arrays=arrays, callback_states=callback_states)
        return state.get("inputs")

    def _stage_and_submit(self, model: keras.Model, strategy: Any, *, name: str, step: int, batch: int,
                          logs: dict[str, float], progress: Progress, state: dict[str, Any],
                          arrays: dict[str, Any], callback_states: dict[str, Any]) -> None:
        started = time.monotonic()
        logger.info("resumable: saving %s", name)
        staging = self.manager.writer.stage(name, drop_cached=False)  # dropped by the writer, or below
        taken: snapshot.ModelSnapshot | parts.PartSnapshot | None = None
        if self.manager.job is not None:  # #36: this process's part of a model split across processes
            with self.manager.writer.uploader.paused():
                taken = parts.snapshot(model, state=state, arrays=arrays)
        elif not self.options.save_trainable_only:
            budget = self.options.snapshot_memory.budget()  # #54: the memory left now, for "auto"
            with self.manager.writer.uploader.paused():
                taken = model_to_files.snapshot(model, weights_only=self.options.save_weights_only,
                                                state=state, arrays=arrays,
                                                max_shard_size=self.options.max_shard_size, budget=budget,
                                                copy_part=self.options.snapshot_memory.copies_part,
                                                lora_layers=self.has_lora_layers(model))
        files: SnapshotFiles | tail_write.TailWrite | None = (
            SnapshotFiles(taken, name, self) if taken is not None else None)
        payload: str | None
        if isinstance(taken, snapshot.ModelSnapshot) and taken.partial:
            files = self._write_partly(taken, staging, name)
            if files is None:
                return
            payload = taken.payload
        elif isinstance(taken, snapshot.ModelSnapshot) and taken.streamed:
            payload = self._write_streamed(taken, staging, name)
            files = None  # on disk in staging: committed like files Keras wrote there (commits.Staged)
        elif taken is not None:
            # said now, as a synchronous save would
            if not taken.fits_in(self._write_folder(staging)):
                self._no_room(name, None if self.manager.writes_in_place else self.manager.staging_dir)
                return
            payload = taken.payload
        else:
            payload = self._serialize(model, staging, name, state, arrays)
        if payload is None:
            return
        self.last_saved_step = step
        where = self.placement(model, strategy)
        manifest = Manifest(
            epoch=progress.epochs_done, step=step, batch=batch, metrics=logs, versions=dict(where.versions),
            state=self.summary(model, progress, callback_states), processes=where.processes,
            devices=where.devices, payload=payload,
        )
        self.lines.save_started = started
        writer: RunWriter = self.manager.writer
        writer.submit(staging, name, manifest, files=files)
        if (self._shares and isinstance(taken, snapshot.ModelSnapshot)
                and not (taken.partial or taken.streamed)):  # whole in memory
            self._shared = SharedSave(taken, name, manifest)
        if self.options.async_upload:
            logger.info("resumable: staged %s in %.2f s; uploading in the background", name,
                        time.monotonic() - started)

    def take_shared(self) -> SharedSave | None:
        """The save just submitted, if its snapshot is whole in memory, handed over once: kept no
        longer than the call that saved, so its memory is freed with its write."""
        shared, self._shared = self._shared, None
        return shared

    def submit_shared(self, shared: SharedSave) -> None:
        """Commit another tier's save into this builder's run folder: the same snapshot written
        again (no second copy in memory), under the same name, by this run folder's commit."""
        staging = self.manager.writer.stage(shared.name, drop_cached=False)
        if not shared.taken.fits_in(self._write_folder(staging)):
            self._no_room(shared.name, None if self.manager.writes_in_place else self.manager.staging_dir)
            return
        self.last_saved_step = shared.manifest.step
        logger.info("resumable: saving %s (the snapshot of the durable save)", shared.name)
        self.manager.writer.submit(staging, shared.name, replace(shared.manifest),
                                   files=SnapshotFiles(shared.taken, shared.name, self))

    def _write_streamed(self, taken: snapshot.ModelSnapshot, staging: Path, name: str) -> str | None:
        """A snapshot over its memory budget (#54), written into ``staging`` now, one variable at a
        time, while training waits; its payload file's name, or None (warned) when the disk is full.
        Its upload (or, in a local run, its copy into the run folder) goes on in the background."""
        self.manager.writer.uploader.drop_cached()  # written here now: the old copy goes first
        if not taken.fits_in(staging):
            self._no_room(name, self.manager.staging_dir)
            return None
        started = time.monotonic()
        try:
            with self.manager.writer.uploader.paused():
                SnapshotFiles(taken, name, self).write(staging, None)
        except NoSpaceError:
            self._no_room(name, self.manager.staging_dir)
            return None
        logger.info("resumable: %s over its memory budget (%d bytes): written while training waited, "
                    "%.2f s", name, taken.nbytes, time.monotonic() - started)
        return taken.payload

    def _write_partly(self, taken: snapshot.ModelSnapshot, staging: Path,
                      name: str) -> tail_write.TailWrite | None:
        """A snapshot copied in part (#54): its write started beside ``staging``, waited for until
        its live part is written; the files for the save job, or None (warned) when the disk is full."""
        self.manager.writer.uploader.drop_cached()  # written beside staging now: the old copy goes first
        if not taken.fits_in(staging):
            self._no_room(name, self.manager.staging_dir)
            return None
        started = time.monotonic()
        with self.manager.writer.uploader.paused():
            files = SnapshotFiles(taken, name, self)
            writing = tail_write.TailWrite(lambda folder: files.write(folder, None),
                                           staging)
            taken.live_written.wait()
        logger.info("resumable: %s over its memory budget: %d bytes written while training waited "
                    "(%.2f s), %d copied to write in the background", name, taken.nbytes - taken.copied_bytes,
                    time.monotonic() - started, taken.copied_bytes)
        return writing

    def _serialize(self, model: keras.Model, staging: Path, name: str, state: dict[str, Any],
                   arrays: dict[str, Any]) -> str | None:
        """Save the model into ``staging`` while training waits; the payload file's name, or None
        (warned) when the disk is full."""
        self.manager.writer.uploader.drop_cached()  # Keras writes here now: the old copy goes first
        try:
            with self.manager.writer.uploader.paused():
                return model_to_files.save(model, staging, weights_only=self.options.save_weights_only,
                                           state=state, arrays=arrays,
                                           trainable_only=self.options.save_trainable_only,
                                           max_shard_size=self.options.max_shard_size,
                                           lora_layers=self.has_lora_layers(model))
        except OSError as e:
            if e.errno not in NO_SPACE_ERRNOS:
                raise
            self.manager.discard(staging)  # half a checkpoint would only hold the space
            self._no_room(name, self.manager.staging_dir)
            return None

    def _no_room(self, name: str, staging: Path | None) -> None:
        """The disk cannot hold checkpoint ``name`` (the staging folder's; None: the run folder's):
        one warning, training goes on."""
        user_warnings.warn(f"resumable: {self.no_space_line(staging, name)}")

    def no_space_line(self, staging_dir: Path | None, name: str, *, in_background: bool = False) -> str:
        return no_space_line(name, self.manager.last_checkpoint, staging_dir=staging_dir,
                             root=self.manager.storage.root, in_background=in_background)

    def _write_folder(self, staging: Path) -> Path:
        """Where a snapshot's files are written: a local run's own folder (straight into the
        checkpoint's folder: `commits.InPlace`), else ``staging``, uploaded from there. A split
        job's part (#36) is always staged: every process uploads its own, process 0 commits."""
        return Path(self.manager.storage.root) if self.manager.writes_in_place else staging


@dataclass(frozen=True)
class SharedSave:
    """A save whose whole snapshot is in memory, for a second tier to write (#55)."""

    taken: snapshot.ModelSnapshot
    name: str
    manifest: Manifest


class SnapshotFiles:
    """A snapshot's files, written by the save job in the uploader's thread (the manager's
    `listener.Files`): a full disk said in one line, a half-written staging folder deleted."""

    def __init__(self, taken: snapshot.ModelSnapshot | parts.PartSnapshot, name: str,
                 builder: CheckpointBuilder) -> None:
        self.taken = taken
        self.name = name
        self.builder = builder

    def write(self, folder: Path, root: str | None) -> dict[str, FileEntry]:
        """Write the snapshot's files into ``folder`` (below the run folder ``root``, or a staging
        folder); each one's size and CRC32C as written."""
        try:
            return self.taken.write(folder, root)
        except OSError as e:
            if root is None:
                shutil.rmtree(folder, ignore_errors=True)  # half a checkpoint would only hold the space
            if e.errno in NO_SPACE_ERRNOS:
                staging = None if root is not None else self.builder.manager.staging_dir
                raise NoSpaceError(self.builder.no_space_line(staging, self.name, in_background=True)) from e
            raise


__all__ = ["CheckpointBuilder", "Progress", "SharedSave", "SnapshotFiles"]
