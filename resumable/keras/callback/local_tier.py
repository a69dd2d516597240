"""The local tier's saves during a fit (#55): a second run folder on the VM's own disk, saved
every ``every_seconds`` of training (or ``every_steps``), keeping its newest checkpoint or two,
beside the durable run folder the callback saves on the user's schedule.

The local tier is a run folder of the same format, written by the same `CheckpointBuilder`
into its own `RunManager` (`manager.tiers.local_manager`): committed in place, manifest last,
retention of its own. It saves at its own batch ends; at a step the durable tier saves it
writes the durable save's snapshot (`share`): one copy in memory for both. The writer lease
that keeps two notebooks apart is the durable tier's: the local one is taken after it, over
whoever held it.

A failure of the local tier never stops training: one warning, and the tier is off for the rest
of the session. A job of several processes (a model split across hosts, a multi-worker
strategy) has no local tier: one line says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import keras

from resumable.core import user_warnings
from resumable.core.display import printable
from resumable.keras import topology
from resumable.keras.callback.checkpoint_builder import CheckpointBuilder, Progress, SharedSave
from resumable.keras.callback.commit_lines import CommitLines
from resumable.keras.callback.fit_position import FitPosition, RestoredState
from resumable.keras.callback.save_options import SaveOptions
from resumable.keras.callback.save_schedule import SaveSchedule
from resumable.keras.checkpoint import training_state
from resumable.manager import CheckpointInfo, promotion, tiers
from resumable.manager.run_manager import RunManager

logger = logging.getLogger("resumable")

SPLIT_JOB_LINE = ("resumable: the local tier is off for a job of several processes; checkpoints go to the "
                  "durable run folder alone")


class _Fit(Protocol):
    """What a local save reads of the `CheckpointCallback` whose fit runs."""

    model: keras.Model
    strategy: Any
    feed: Any
    params: dict[str, Any]
    position: FitPosition
    restored_state: RestoredState
    epochs_done: int
    stopped_early: bool
    history: list[dict[str, float]]

    @property
    def best(self) -> float | None: ...


class LocalTierSaver:
    """The local tier of one callback's run (``options.local_tier``), next to its durable
    ``durable`` manager. A callback with none has a `NoLocalTier` instead, whose hooks do nothing."""

    def __init__(self, options: SaveOptions, durable: RunManager) -> None:
        self.tier = options.local_tier
        self.options = options
        self.durable = durable
        self.manager: RunManager | None = None  # built at the first fit, once the run id is known
        self.builder: CheckpointBuilder | None = None
        tier = self.tier or tiers.LocalTier()
        self.schedule = SaveSchedule(tier.every_steps or "epoch", tier.every_seconds, options.monitor,
                                     options.mode)
        # a job of several processes, or a failure: the durable tier alone
        self.off = self.tier is None
        # resume() took this local checkpoint (in this folder): uploaded to the durable tier once
        # the next fit holds its lease (`promotion`)
        self.to_promote: tuple[CheckpointInfo, Path] | None = None

    def open(self) -> RunManager:
        """The local run folder's manager (its run id recorded in the durable run folder now)."""
        if self.manager is None:
            assert self.tier is not None
            run_id = tiers.record_run_id(self.durable.storage)
            manager = tiers.local_manager(self.tier, run_id, filename=self.options.filename,
                                          lease_timeout=self.options.lease_timeout)
            recorded = tiers.record_run_id(manager.storage, run_id)
            if recorded != run_id:
                raise ValueError(f"{manager.storage.url} records run {recorded}, not this run's {run_id}")
            manager.listener = _Logged()
            self.manager = manager
            self.builder = CheckpointBuilder(self.options, manager, CommitLines(False))
        return self.manager

    def begin(self, model: keras.Model, strategy: Any) -> None:
        """A fit begins, the durable lease held: take the local run folder."""
        if self.off or not topology.is_chief(model, strategy):
            return
        if topology.topology(model, strategy)[0] > 1:
            self.off = True
            print(SPLIT_JOB_LINE, flush=True)
            logger.info("%s", SPLIT_JOB_LINE)
            return
        try:
            self._promote()
            self.open().writer.acquire()
            assert self.builder is not None  # made by open()
            self.builder.fit_begins()
        except Exception as e:  # noqa: BLE001 - the durable tier goes on alone
            self._give_up(e)
            return
        self.schedule.restart_clock()

    def _promote(self) -> None:
        """The local checkpoint resumed from, uploaded as the durable tier's next one (in the
        background) while it is still newer than the durable tier's newest."""
        found, self.to_promote = self.to_promote, None
        if found is None:
            return
        info, folder = found
        if tiers.newer(info, self.durable.newest_good()):
            promotion.promote(self.durable.writer, folder, info)

    def epoch_begins(self, step: int) -> None:
        if not self.off:
            self.schedule.epoch_begins(step)

    def save_if_due(self, callback: _Fit, siblings: Sequence[keras.callbacks.Callback], step: int, batch: int,
                    logs: dict[str, Any] | None, *, durable_saved: bool) -> None:
        """At a batch end (``batch`` batches into the epoch, at optimizer ``step``): save the local
        tier when its schedule says so, unless the durable tier saved this very step. ``siblings``:
        the fit's callbacks, whose state goes into the checkpoint."""
        if self.off:
            return
        due = self.schedule.due_at_batch(step)
        if not due or durable_saved or self.builder is None or self.manager is None:
            return
        if step == self.builder.last_saved_step or not self.manager.writer.lease.held:
            return
        try:
            self._save(callback, siblings, step, batch, training_state.logs_to_floats(logs))
        except Exception as e:  # noqa: BLE001 - the durable tier goes on alone
            self._give_up(e)
        self.schedule.restart_clock()  # the interval counts training, not saving

    def share(self, shared: SharedSave | None) -> None:
        """The durable tier just saved (``shared``: its save, when its snapshot is whole in memory).
        When the local tier is due at the same step, it writes that snapshot too: one copy in
        memory for both tiers, and the local tier holds the durable tier's newest checkpoint
        while that one is still uploading."""
        if self.off or shared is None or self.builder is None or self.manager is None:
            return
        if not self.schedule.due_at_batch(shared.manifest.step) or not self.manager.writer.lease.held:
            return
        try:
            self.builder.submit_shared(shared)
        except Exception as e:  # noqa: BLE001 - the durable tier goes on alone
            self._give_up(e)
        self.schedule.restart_clock()

    def _save(self, callback: _Fit, siblings: Sequence[keras.callbacks.Callback], step: int, batch: int,
              logs: dict[str, float]) -> None:
        assert self.builder is not None
        callback.restored_state.add_metrics(callback.model)  # the epoch's metric totals go into it
        # as a durable save does: the durable tier's upload in flight waits while the snapshot is taken
        with self.durable.writer.uploader.paused():
            self.builder.save(callback.model, callback.strategy, step=step, batch=batch, logs=logs,
                              progress=Progress.of(callback), callbacks=siblings, feed=callback.feed,
                              epoch_rng=callback.position.epoch_rng)

    def end(self) -> None:
        """The fit ended: land the local commits, give the local lease back (a failure: a warning)."""
        if self.manager is not None:
            self.manager.finish(quiet=True)

    def _give_up(self, error: BaseException) -> None:
        self.off = True
        where = self.manager.storage.url if self.manager is not None else str(self.tier and self.tier.root)
        user_warnings.warn(printable(f"resumable: the local tier in {where} is off for this session "
                                     f"({error}); checkpoints go to the durable run folder alone"))
        if self.manager is not None:
            self.manager.finish(quiet=True)


class _Logged:
    """The local tier's `SaveListener`: its commits and skips are logged, never printed (the durable
    tier's lines are the ones a user reads)."""

    def committed(self, info: CheckpointInfo) -> None:
        logger.info("resumable: local tier: committed %s", info.name)

    def skipped(self, line: str) -> None:
        logger.info("resumable: local tier: %s", line)


__all__ = ["SPLIT_JOB_LINE", "LocalTierSaver"]
