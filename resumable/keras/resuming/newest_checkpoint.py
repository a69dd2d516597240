"""The newest checkpoint of a run that loads, for `resume()`: tried newest first, each damaged
one skipped with a warning and marked so; in a job of several processes, the one process 0 chose.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from resumable.core import user_warnings
from resumable.core.display import printable
from resumable.core.errors import CorruptCheckpointError, ResumableError
from resumable.keras import topology
from resumable.keras.checkpoint import files_to_model
from resumable.keras.multihost import split_job
from resumable.manager import CheckpointInfo
from resumable.manager.run_manager import RunManager

logger = logging.getLogger("resumable")


def load_newest(manager: RunManager, build_model: Callable[[], keras.Model] | None, strategy: Any,
                 distribution: Any, barrier_timeout: float, reads: files_to_model.ReadOnce
                 ) -> tuple[CheckpointInfo, Path, keras.Model] | None:
    """The model of the newest checkpoint that loads, with its info and folder; None if none.
    ``reads``: what is read of each checkpoint's state.json and arrays.npz, kept for its restore.

    From a bucket, the weights' shards are loaded as they come down (`RunManager.arriving_newest`):
    one that comes down damaged makes the checkpoint damaged, and the next older one is tried.
    """
    def warn(problem: str) -> None:
        user_warnings.warn(f"resumable: {problem}")

    if topology.process_count() > 1:  # every process must resume from the one process 0 chose
        job = split_job.JobResume(manager, timeout=barrier_timeout)  # #36: a model split across processes
        if job.newest_is_split():
            return job.load_newest(build_model, distribution=distribution, warn=warn, reads=reads)
        found = _follow_chief(manager, manager.fetch_newest(warn=warn, check=reads.check))
        if found is None:
            return None
        info, local = found
        return info, local, files_to_model.load_model(local, build_model, strategy=strategy,
                                                      distribution=distribution, where=info.url, reads=reads)
    while (arriving := manager.arriving_newest(warn=warn, check=reads.check,
                                               streamed=files_to_model.is_shard)) is not None:
        info, arrival = arriving  # a bad state.json was skipped as damaged
        with arrival:
            try:
                load = split_job.load_model if split_job.holds(info) else files_to_model.load_model  # #36
                model = load(arrival.folder, build_model, strategy=strategy, distribution=distribution,
                             where=info.url, landed=arrival.wait_for, reads=reads)
                return info, arrival.result(), model
            except CorruptCheckpointError as e:
                reads.forget(arrival.folder)
                warn(printable(str(e)))
                manager.mark_damaged(info.name)
    return None


def _position(info: CheckpointInfo | None) -> list[int]:
    if info is None:
        return [-1, -1, -1]
    return [int(info.epoch or 0), int(info.step or 0), int(info.manifest.batch if info.manifest else 0)]


def _follow_chief(manager: RunManager, found: tuple[CheckpointInfo, Path] | None
                  ) -> tuple[CheckpointInfo, Path] | None:
    """Several JAX processes: each resumes from the checkpoint process 0 chose (same epoch, step, batch).

    Every process reads the same folder, so they nearly always agree already; this makes sure
    of it (one collective), and a process that saw the folder differently follows process 0.
    """
    if topology.process_count() == 1:
        return found
    ours = _position(found[0] if found else None)
    chief = topology.broadcast_from_chief(ours)
    if chief == ours:
        return found
    index = topology.process_index()
    if chief[0] < 0:
        logger.warning("resumable: process %d: process 0 found no checkpoint in %s and starts the run anew; "
                       "so does this process", index, manager.storage.url)
        return None
    for info in manager.newest_first():
        if _position(info) == chief:
            try:
                return info, manager.fetch(info)
            except CorruptCheckpointError as e:
                raise ResumableError(
                    f"process {index}: {info.url}, which process 0 resumes from, cannot be read here ({e}); "
                    "every process must see the same run folder"
                ) from e
    raise ResumableError(
        f"process {index}: {manager.storage.url} has no checkpoint at epoch {chief[0]}, step {chief[1]}, "
        "which "
        "process 0 resumes from; every process must see the same run folder"
    )


__all__ = ["load_newest"]
