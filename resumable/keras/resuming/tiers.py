"""`resume()` across the two tiers of a run with a local tier (#55): the local tier's newest good
checkpoint when it belongs to this run and is newer than the durable tier's newest, else the
durable tier's (`load_newest`, as without a local tier). One line says which tier and why.

A local checkpoint is used only when (1) the durable run folder records a run id (`run.json`)
and the local run folder ``<local root>/<run id>`` records the same one, (2) it holds training
past the durable tier's newest checkpoint (a later optimizer step), (3) every file passes its
checksum (a damaged one is warned of and the next older local one is tried, down to the durable
tier's newest).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras

from resumable.core import user_warnings
from resumable.core.display import printable
from resumable.core.errors import CorruptCheckpointError
from resumable.keras import topology
from resumable.keras.callback.local_tier import SPLIT_JOB_LINE
from resumable.keras.checkpoint import files_to_model
from resumable.keras.resuming.restore import restore_checkpoint
from resumable.manager import CheckpointInfo, tiers

if TYPE_CHECKING:
    from resumable.keras.callback.checkpoint_callback import CheckpointCallback

logger = logging.getLogger("resumable")


@dataclass
class TierChoice:
    """What `from_local_tier` found: the local checkpoint loaded (None: take the durable tier's),
    the durable tier's newest when it was read, and the line that says which tier and why."""

    line: str | None
    found: tuple[CheckpointInfo, Path, keras.Model] | None = None
    durable: CheckpointInfo | None = None


def from_local_tier(callback: CheckpointCallback, build_model: Callable[[], keras.Model] | None,
                    strategy: Any, distribution: Any, reads: files_to_model.ReadOnce, *,
                    into: keras.Model | None = None) -> TierChoice:
    """The local tier's checkpoint to resume from, loaded, if it qualifies (see the module docstring):
    into a model ``build_model`` builds (`resume`), or into ``into`` in place (a `Run` rolled back
    after an exception ended its fit)."""
    saver = callback.local_saves
    if saver.tier is None:
        return TierChoice(None)
    if topology.process_count() > 1 or topology.topology(None, strategy)[0] > 1:
        saver.off = True
        return TierChoice(SPLIT_JOB_LINE)
    durable_manager = callback.manager
    durable = durable_manager.newest_good()
    than = (f"the durable {tiers.where(durable)}" if durable is not None
            else "the durable tier's newest (none yet)")

    def durable_because(why: str) -> TierChoice:
        return TierChoice(printable(f"resumable: resuming from the durable tier: {why}"), None, durable)

    run_id = tiers.read_run_id(durable_manager.storage)
    if run_id is None and durable is None:
        return TierChoice(None)  # a new run: its line says so
    if run_id is None:
        return durable_because(f"{durable_manager.storage.url} records no run id, so no local tier is its")
    tier = saver.tier
    folder = tier.run_folder(run_id)
    if not folder.is_dir():
        return durable_because(f"no local tier at {folder} (a new machine, or none saved yet)")
    manager = tiers.local_manager(tier, run_id, filename=callback.options.filename,
                                  lease_timeout=callback.options.lease_timeout)
    recorded = tiers.read_run_id(manager.storage)
    if recorded != run_id:
        return durable_because(f"the local tier at {folder} records run {recorded or 'none'}, not this run's "
                               f"{run_id}; not used")
    newest: CheckpointInfo | None = None
    damaged = 0
    for info in manager.newest_first():
        newest = newest or info
        if not tiers.newer(info, durable):
            break
        path: Path | None = None
        try:
            path = manager.fetch(info)
            reads.check(path, info.url)
            if into is None:
                model = files_to_model.load_model(path, build_model, strategy=strategy,
                                                  distribution=distribution, where=info.url, reads=reads)
            else:  # a job of one process (see above): never a model split across processes
                files_to_model.load_into(into, path, info.url, reads=reads)
                model = into
        except CorruptCheckpointError as e:
            if path is not None:
                reads.forget(path)
            damaged += 1
            user_warnings.warn(printable(f"resumable: local tier: {e}"))
            continue
        saver.to_promote = (info, path)  # the next fit uploads it to the durable tier
        return TierChoice(printable(f"resumable: resuming from the local tier: {tiers.where(info)} is newer "
                                    f"than {than}"), (info, path, model), durable)
    if newest is None:
        return durable_because(f"the local tier at {folder} holds no checkpoint")
    if damaged:
        return durable_because(f"the local tier's newer checkpoints are damaged ({damaged}); {than} is the "
                               "newest good one")
    return durable_because(f"the local tier's newest {tiers.where(newest)} is not newer than {than}")


def restore_newest_into(model: keras.Model, callback: CheckpointCallback,
                        build_model: Callable[[], keras.Model] | None, strategy: Any,
                        distribution: Any) -> CheckpointInfo | None:
    """The newest good checkpoint of either tier restored into ``model`` in place (a `Run` rolled
    back after an exception ended its fit): the local tier's when `from_local_tier` takes it (its
    line printed), else the durable tier's newest; None where the run has no checkpoint."""
    manager = callback.manager
    durable = manager.last_checkpoint
    reads = files_to_model.ReadOnce()
    tier = from_local_tier(callback, build_model, strategy, distribution, reads, into=model)
    if tier.line:
        print(tier.line, flush=True)
        logger.info("%s", tier.line)
    if tier.found is not None:  # loaded into ``model`` already; the callback takes its state
        latest, path, _ = tier.found
        restore_checkpoint(callback, latest, path, reads, only_cached=False, into=None)
        manager.resumed_from(durable, manager.damaged)  # the durable tier's next commit follows its newest
        return latest
    if durable is not None:
        restore_checkpoint(callback, durable, manager.fetch(durable), reads, only_cached=False,
                           into=model)  # the cache as it was: a Run's own checkpoints
    return durable


__all__ = ["TierChoice", "from_local_tier", "restore_newest_into"]
