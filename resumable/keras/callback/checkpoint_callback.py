"""`CheckpointCallback`: a Keras callback that commits resumable checkpoints to a run folder."""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import keras

from resumable.core.errors import ResumableError
from resumable.core.naming import DEFAULT_TEMPLATE
from resumable.keras import compat, topology
from resumable.keras.callback.carried_run import CarriedRun
from resumable.keras.callback.checkpoint_builder import CheckpointBuilder, Progress
from resumable.keras.callback.commit_lines import CommitLines
from resumable.keras.callback.fit_lease import FitLease
from resumable.keras.callback.fit_position import FitPosition, RestoredState, runs_last
from resumable.keras.callback.local_tier import LocalTierSaver
from resumable.keras.callback.save_options import DEFAULT_SHARD_GIB, OptionAttributes, check_options
from resumable.keras.checkpoint import training_state
from resumable.keras.multihost import split_job
from resumable.keras.replay.inputs import Feed
from resumable.manager import DEFAULT_TIMEOUT, CheckpointInfo, RunStorage
from resumable.manager.job_commit import DEFAULT_BARRIER_TIMEOUT
from resumable.manager.tiers import LocalTier

logger = logging.getLogger("resumable")

_Hook = TypeVar("_Hook", bound=Callable[..., None])


def gives_lease_back_on_error(hook: _Hook) -> _Hook:
    """For a Keras hook of `CheckpointCallback`: an exception leaving the hook ends model.fit, and
    Keras then calls no on_train_end: land the uploads and give the writer lease back
    (`FitLease.end_after_error`). Not for KeyboardInterrupt or SystemExit: Run.fit saves the
    interrupted state after those, under the lease, then gives it back. Here, beside the hooks it
    guards, so that a hook runs no other module's code unless it fails."""

    @functools.wraps(hook)
    def wrapper(self: CheckpointCallback, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception:
            self.fit_lease.end_after_error()
            raise

    return cast(_Hook, wrapper)


class CheckpointCallback(CarriedRun, OptionAttributes, keras.callbacks.Callback):
    """Save resumable checkpoints of a Keras model to a run folder, keeping the last and the best.

    Each checkpoint's files are written into the run folder (a local path, a Google Drive mount;
    for ``gs://bucket/prefix`` or another fsspec URL, into a local staging folder, then uploaded)
    and committed by writing its manifest last, so a run killed at any moment leaves every
    committed checkpoint intact.
    A checkpoint holds the model and its optimizer state, the epoch and step, the history,
    this callback's best value and the state of EarlyStopping and ReduceLROnPlateau in the same
    fit. Continue a run with `resumable.resume`, which returns a callback carrying that state.

    The arguments follow `keras.callbacks.ModelCheckpoint`, except that ``filepath`` is the run
    folder and ``filename`` names the checkpoints inside it. They read back as read-only
    attributes (``cb.monitor``, ``cb.save_freq``, ...): for other values, make a new callback.

    Example:

    ```python
    cb = resumable.CheckpointCallback("/content/drive/MyDrive/runs/exp1", monitor="val_loss",
                                      keep_last=3, keep_best=1)
    model.fit(x, y, epochs=20, validation_split=0.1, callbacks=[cb])
    ```

    Args:
        filepath: The run folder: a local folder, ``/content/drive/MyDrive/...``,
            ``gs://bucket/prefix`` or another fsspec URL.
        monitor: The metric that defines the best checkpoint (for ``keep_best`` and
            ``save_best_only``). Defaults to ``"val_loss"``.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (max for accuracy-like names). Defaults to "auto".
        save_best_only: Commit a checkpoint only when ``monitor`` improves. A resumed run then
            continues from the best checkpoint, not from the last epoch. Defaults to False.
        save_weights_only: Save ``model.weights.h5`` (weights and optimizer state) instead of
            the whole ``.keras`` model; `resumable.resume` then needs ``build_model``.
            Defaults to False.
        save_trainable_only: Save only what trains (a LoRA adapter, an unfrozen head, the
            statistics trained layers update), the optimizer state and the training state, in
            ``trainable.npz``: `resumable.resume` then needs ``build_model`` for the frozen
            weights, and refuses one whose frozen weights differ (fingerprinted). Defaults to False.
        max_shard_size: Weights over this many GiB are written as Keras' sharded weights
            (``model.weights.json`` and shards of at most this size), each checksummed, moved
            several at a time and loaded one at a time; None: one file. Defaults to 1.0.
        snapshot_memory: The host memory a save may take beyond training's, in bytes, or
            ``"auto"``: half the memory left to the process (its memory cgroup's limit, else
            the system's available memory) when the save starts. A checkpoint that fits is
            copied and written in the background; of a bigger one, what fits a number of
            bytes is copied ("auto": nothing) and the rest written while training waits, one
            variable at a time (the same files). 0 always writes while training waits.
            Defaults to "auto".
        save_freq: ``"epoch"`` to save at the end of every epoch, or an int N to also save
            every N batches (mid-epoch checkpoints, at optimizer steps that are multiples of N).
            Defaults to ``"epoch"``.
        save_interval: Also save mid-epoch once this much training time has passed since the
            last save: seconds, or a ``datetime.timedelta``. Bounds the work at risk whatever
            the epoch length; combines with ``save_freq``. `Run.fit` resumes such a checkpoint
            at the batch it was taken at. Defaults to None.
        keep_last: Keep the newest N checkpoints; None keeps all. Defaults to 3.
        keep_best: Also keep the best N by ``monitor``. Defaults to 1.
        keep_every: Also keep every checkpoint whose epoch is a multiple of N. Defaults to None.
        filename: Checkpoint folder name template with ``{epoch}``; may use ``{step}`` and
            metric names. Defaults to ``"ckpt-{epoch:06d}"``.
        verbose: 1 prints a line per checkpoint, 0 is silent; ``"auto"`` is 1. Defaults to 0.
        initial_value_threshold: The value ``monitor`` must beat to count as the first best.
            Defaults to None.
        staging_dir: Local folder for serializing before an upload (a ``gs://`` run; a local or
            Drive run's files are written straight into it) and for downloads on resume.
            Defaults to ``<tempdir>/resumable-cache/<hash of filepath>``.
        storage_options: Passed to the fsspec filesystem, e.g. ``{"token": "anon"}``.
            Defaults to None.
        async_upload: Upload in a background thread while training goes on: a save only
            blocks training for the local serialization. At most one upload runs and one
            waits; a newer checkpoint replaces the waiting one. The end of training (and an
            exception leaving `Run.fit`, and interpreter exit) waits for the last upload.
            False uploads inside the save. Defaults to True.
        when_behind: What a save does while the previous checkpoint still waits for its
            upload (uploads slower than training): ``"skip"`` lets the newer checkpoint take
            its place (one line names the checkpoint skipped), ``"wait"`` makes training wait
            for the slot, so that every checkpoint is committed. Defaults to ``"skip"``.
        takeover: Take the run folder's writer lease even while another process holds it
            (that process stops at its next save with `LeaseLostError`). Without it, training
            into a folder another live process writes fails with `LeaseHeldError` naming
            that process. Defaults to False.
        lease_timeout: Seconds (or a ``datetime.timedelta``) after which this process's lease,
            no longer renewed (a background thread renews it), counts as stale and is taken
            over: what a writer that died on another machine costs the next session. Defaults to 40.
        barrier_timeout: Seconds (or a ``datetime.timedelta``) a process of a job whose model is
            split across hosts (``ModelParallel``) waits for the others at a save or a resume,
            before `BarrierTimeoutError` names those it waited for. Unused otherwise. Defaults to 600.
        local_tier: A fast tier on this machine's own disk, saved often (True: every 60 s), its
            newest kept: `resume()` takes it when newer than the run folder's. True, a
            `resumable.LocalTier`, or False. Defaults to False.
    """

    # BackupAndRestore's semantics, as Keras': a fit with nothing restored starts at fit's own
    # initial_epoch; saves happen at this callback's place among the fit's callbacks, not after
    # the callbacks that keep state.
    epoch_from_fit = False
    saves_where_listed = False

    def __init__(
        self,
        filepath: str,
        monitor: str = "val_loss",
        mode: str = "auto",
        save_best_only: bool = False,
        save_weights_only: bool = False,
        save_trainable_only: bool = False,
        save_freq: str | int = "epoch",
        save_interval: float | datetime.timedelta | None = None,
        keep_last: int | None = 3,
        keep_best: int = 1,
        keep_every: int | None = None,
        filename: str = DEFAULT_TEMPLATE,
        verbose: int | str = 0,
        initial_value_threshold: float | None = None,
        staging_dir: str | Path | None = None,
        storage_options: dict[str, Any] | None = None,
        async_upload: bool = True,
        takeover: bool = False,
        lease_timeout: float | datetime.timedelta = DEFAULT_TIMEOUT,
        max_shard_size: float | None = DEFAULT_SHARD_GIB,
        when_behind: str = "skip",
        barrier_timeout: float | datetime.timedelta = DEFAULT_BARRIER_TIMEOUT,
        snapshot_memory: int | str = "auto",
        local_tier: bool | LocalTier = False,
    ) -> None:
        super().__init__()
        self.options = check_options(
            filepath, monitor=monitor, mode=mode, save_best_only=save_best_only,
            save_weights_only=save_weights_only, save_trainable_only=save_trainable_only, save_freq=save_freq,
            save_interval=save_interval, keep_last=keep_last, keep_best=keep_best, keep_every=keep_every,
            filename=filename, verbose=verbose, initial_value_threshold=initial_value_threshold,
            staging_dir=staging_dir, storage_options=storage_options, async_upload=async_upload,
            takeover=takeover, lease_timeout=lease_timeout, max_shard_size=max_shard_size,
            when_behind=when_behind, barrier_timeout=barrier_timeout, snapshot_memory=snapshot_memory,
            local_tier=local_tier,
        )
        options = self.options
        # Lease, staging, uploads, commits and retention: this callback only decides when to save.
        self.manager = options.run_manager(topology.process_index())
        self.lines = CommitLines(bool(options.verbose))
        self.manager.listener = self.lines  # each commit and each checkpoint skipped, told
        self.schedule = options.save_schedule()
        self.builder = CheckpointBuilder(options, self.manager, self.lines, shares=bool(options.local_tier))
        self.fit_lease = FitLease(options, self.manager, self.lines)
        self.local_saves = LocalTierSaver(options, self.manager) if options.local_tier else NoLocalTier()
        self.history: list[dict[str, float]] = []  # per-epoch logs of every epoch of the run
        self.epochs_done = 0
        self.stopped_early = False
        self.strategy: Any = None
        self.callbacks: list[keras.callbacks.Callback] | None = None  # the fit's callbacks, set by Run.fit
        self.restored_state = RestoredState()  # what a restored checkpoint hands to the next fit
        self.position = FitPosition()  # where the running fit stands, and the saves it owes
        self._siblings: list[keras.callbacks.Callback] = []  # the fit's other callbacks, whose state is saved
        self._last = True
        self.feed: Feed | None = None  # Run.fit's, while it runs: its positions go into every checkpoint

    def __repr__(self) -> str:
        return (
            f"CheckpointCallback({self.filepath!r}, monitor={self.monitor!r}, "
            f"epochs_done={self.epochs_done})"
        )

    @property
    def storage(self) -> RunStorage:
        """The run folder."""
        return self.manager.storage

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        # Keras tells a callback nothing of its siblings: Run.fit passes them, a plain fit is searched
        self._siblings = list(self.callbacks) if self.callbacks is not None else (
            compat.running_fit_callbacks(self))
        self._last = self.saves_where_listed or runs_last(self, self._siblings)
        self.position.fit_begins()
        self.schedule.restart_clock()  # timed saves count training time only
        self.lines.hold()
        if self.callbacks is None and self.restored is not None and (self.epochs_done or self.resume_batch):
            self.restored_state.say_if_plain_fit_cannot_replay(compat.running_fit_input(self))
        self.epochs_done = self.fit_lease.begin(self.model, self.strategy, self.restored, self.epochs_done)
        self.builder.fit_begins()
        self.local_saves.begin(self.model, self.strategy)  # after the durable lease: it keeps writers apart

    @gives_lease_back_on_error
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        # before Keras' "Epoch N/M" header (its progress bar runs after this callback)
        self.lines.print_lines()
        self.save_owed()
        self.position.stop_if_asked()
        if self.position.first_epoch:
            self.position.first_epoch = False
            self._start(epoch)
        step = self.position.epoch_begins(self.model, self.restored_state)
        self.schedule.epoch_begins(step)
        self.local_saves.epoch_begins(step)
        if self.feed is not None:  # Run.fit's inputs draw their epoch's order from the states just set
            self.feed.rng_ready()

    @gives_lease_back_on_error
    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = self.position.batch_ends(batch, self.restored_state.batch_offset)
        self.restored_state.add_metrics(self.model)
        self.position.stop_if_asked()
        self.manager.check_lease()  # taken over by another process (found by a renewal): stop training
        if (self.params or {}).get("verbose") not in (1, "auto"):
            self.lines.print_lines()  # no progress bar to break
        steps = (self.params or {}).get("steps")
        if steps is not None and batch + 1 >= steps:
            return  # the epoch-end save follows
        due = self.schedule.due_at_batch(step)
        if self.save_interval is not None and self.manager.job is not None:
            due = split_job.chief_decides(due)  # #36: every process saves at the same step
        if due:
            self.save_checkpoint(self.position.batch, training_state.logs_to_floats(logs))
        self.local_saves.save_if_due(self, self._siblings, step, self.position.batch, logs,
                                     durable_saved=self.builder.last_saved_step == step)

    @gives_lease_back_on_error
    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.position.epoch_ends()
        floats = training_state.logs_to_floats(logs)
        del self.history[epoch:]  # an epoch re-run after a mid-epoch restore replaces its entry
        self.history.append(floats)
        self.epochs_done = epoch + 1
        self.restored_state.end_epoch()
        if self._last:  # every other callback has run its on_epoch_end: the state is this epoch's
            self.stopped_early = bool(self.model.stop_training)
            self.save_checkpoint(0, floats)
        else:
            # Saved at the next on_epoch_begin (or on_train_end), once the callbacks after this
            # one have updated their counters, the learning rate and the logs (ReduceLROnPlateau
            # adds `learning_rate` to them).
            self.position.pending_logs = logs if logs is not None else {}
        self.position.stop_if_asked()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.position.pending_logs is not None and self.model.stop_training:
            self.stopped_early = True
        self.save_owed()
        self.position.in_epoch = False
        try:
            self.wait_for_uploads()
        finally:
            self.lines.print_lines(fit_ended=True)
            self.manager.release()
            self.local_saves.end()

    def wait_for_uploads(self, timeout: float | None = None) -> bool:
        """Block until the checkpoints saved so far are committed (or ``timeout`` seconds pass).

        Prints what it waits for when ``verbose``. Raises the upload's error when the newest
        checkpoint could not be committed; its local copy is kept and the next save retries.
        Returns False on timeout.
        """
        return self.manager.wait(timeout)

    # ------------------------------------------------------------------ saving

    def _start(self, epoch: int) -> None:
        if self.epoch_from_fit and self.restored is None:
            self.epochs_done = epoch  # nothing restored: fit's own initial_epoch
        if epoch != self.epochs_done:
            raise ResumableError(
                f"model.fit started at epoch {epoch} but {self.filepath} has {self.epochs_done} epochs done; "
                f"pass initial_epoch={self.epochs_done} to fit, or use run.fit() from resumable.resume()"
            )
        self.restored_state.hand_over(self._siblings, epoch, self.filepath)

    def save_owed(self) -> None:
        """Save the epoch end whose save waits for the callbacks after this one, if any."""
        pending = self.position.take_pending()
        if pending is not None:
            logs = training_state.logs_to_floats(pending)
            self.history[self.epochs_done - 1] = logs
            self.save_checkpoint(0, logs)

    def save_checkpoint(self, batch: int, logs: dict[str, float]) -> None:
        """Save the model at the current step, ``batch`` batches into epoch ``epochs_done`` + 1 (0:
        at the end of epoch ``epochs_done``), if the schedule keeps it."""
        step = training_state.iterations(self.model)
        if batch and step == self.builder.last_saved_step:
            return  # never two checkpoints of the same state
        if not self.schedule.keeps(self.epochs_done, logs, mid_epoch=batch > 0):
            return
        self.schedule.restart_clock()
        if not self.is_chief() and self.manager.job is None:  # #36: in a split job every process saves
            return
        if batch:
            self.restored_state.add_metrics(self.model)  # the epoch's metric totals go into the checkpoint
        inputs = self.builder.save(self.model, self.strategy, step=step, batch=batch, logs=logs,
                                   progress=Progress.of(self), callbacks=self._siblings, feed=self.feed,
                                   epoch_rng=self.position.epoch_rng)
        self.local_saves.share(self.builder.take_shared())  # the local tier, if due, writes it too
        if inputs is not None:  # where the inputs stand at the newest checkpoint, for a later run.fit
            self.restored_state.inputs = inputs
        self.schedule.restart_clock()  # the interval counts training, not saving (nor a full disk)

    def is_chief(self) -> bool:
        """Whether this process writes the run folder (process 0 of a distributed job)."""
        return self.builder.placement(self.model, self.strategy).chief


class NoLocalTier:
    """The local tier's hooks when none is asked for (``local_tier=False``, chosen once in the
    constructor): they do nothing, so a fit runs nothing of `local_tier.LocalTierSaver`."""

    tier: LocalTier | None = None  # what resume() asks first (`resuming.tiers`): none
    off = True
    to_promote: tuple[CheckpointInfo, Path] | None = None  # never set: there is no tier to resume from

    def begin(self, model: keras.Model, strategy: Any) -> None:
        pass

    def epoch_begins(self, step: int) -> None:
        pass

    def save_if_due(self, callback: Any, siblings: Any, step: int, batch: int, logs: Any, *,
                    durable_saved: bool) -> None:
        pass

    def share(self, shared: Any) -> None:
        pass

    def end(self) -> None:
        pass


__all__ = ["CheckpointCallback", "NoLocalTier"]
