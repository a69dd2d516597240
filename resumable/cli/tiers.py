"""The local tier of a run (#55) as the CLI finds it: the run id the run folder records, looked up
under ``--local-tier FOLDER`` or the default place (``/content/resumable-local`` on Colab,
``<tempdir>/resumable-local`` elsewhere). `list` and `inspect` show which tier each checkpoint is
in; `prune` touches the durable run folder alone, so the local tier's newest is never deleted.
"""

from __future__ import annotations

from pathlib import Path

from resumable.cli import budget
from resumable.manager import tiers
from resumable.storage import CheckpointInfo, RunStorage

DURABLE = "durable"
LOCAL = "local"


def local_tier_of(storage: RunStorage, folder: str | None) -> RunStorage | None:
    """The local run folder of ``storage``'s run on this machine (under ``folder``, else the default
    place), or None: no run id recorded, no such folder, or one that records another run's id."""
    run_id = tiers.read_run_id(storage)
    if run_id is None:
        return None
    path = (Path(folder) if folder else tiers.default_root()) / run_id
    if not path.is_dir():
        return None
    local = budget.bounded(RunStorage(str(path)))
    return local if tiers.read_run_id(local) == run_id else None


def local_checkpoints(storage: RunStorage, folder: str | None, *, check_files: bool) -> tuple[
        RunStorage | None, list[CheckpointInfo]]:
    """The local tier of ``storage``'s run and its checkpoints (none: ``(None, [])``)."""
    local = local_tier_of(storage, folder)
    return (local, local.list(check_files=check_files)) if local is not None else (None, [])


def newer_line(local: RunStorage, infos: list[CheckpointInfo], latest: CheckpointInfo | None) -> str:
    """What the local tier holds beside the durable latest good, in one line."""
    newest = next((i for i in reversed(infos) if i.ok), None)
    if newest is None:
        return f"local tier: {local.url}: no good checkpoint"
    taken = "newer than the durable latest: resume() takes it" if tiers.newer(newest, latest) else (
        "not newer than the durable latest: resume() takes the durable one")
    return f"local tier: {local.url}: newest {tiers.where(newest)}, {taken}"


__all__ = ["DURABLE", "LOCAL", "local_checkpoints", "local_tier_of", "newer_line"]
