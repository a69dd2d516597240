"""What the commands share: exit codes, `UsageError`, opening a run, picking and ranking checkpoints."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from resumable.cli import budget
from resumable.cli.output import metric_text
from resumable.core.errors import CheckpointNotFoundError, ResumableError, RunNotFoundError
from resumable.core.manifest import MANIFEST_NAME
from resumable.core.policy import best_one, resolve_mode
from resumable.storage import CheckpointInfo, RunStorage
from resumable.storage.file_folder import FileFolder, holds_model_files, list_model_files

EXIT_OK = 0
EXIT_VERIFY_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(ResumableError):
    """Bad command-line arguments; reported like any other error, with exit code 2."""


# ------------------------------------------------------------------ opening a run


class FilesFolder(UsageError):
    """The URL holds model files with checksum records (resumable.ModelCheckpoint, save_model),
    not a run's checkpoints. Raised by `load_run`; `list`, `inspect` and `verify` catch it and
    run on the files (`model_files`); any other command reports it (exit 2)."""

    def __init__(self, folder: FileFolder) -> None:
        super().__init__(
            f"{folder.url} holds model files (resumable.ModelCheckpoint or save_model), not the checkpoints "
            "of a run: `resumable list`, `inspect` and `verify` read it; ModelCheckpoint(keep_last=N) "
            "prunes it"
        )
        self.folder = folder


def load_run(url: str | RunStorage, check_files: bool = True) -> tuple[RunStorage, list[CheckpointInfo]]:
    """Open a run folder and list it; a folder that does not exist is an error, an empty one is not.

    A folder of model files and no checkpoint raises `FilesFolder` (looked for only then).
    """
    storage = budget.bounded(url if isinstance(url, RunStorage) else RunStorage(url))
    infos = storage.list(check_files=check_files)
    if not infos and not storage.exists():  # only an empty listing pays for the second look
        raise RunNotFoundError(f"{storage.url}: not found; check the path and that the folder exists")
    if not infos and _is_one_checkpoint(storage):
        raise UsageError(f"{storage.url} is one checkpoint, not a run folder; pass the folder that holds it")
    if not infos:
        files = list_model_files(storage.url)
        if holds_model_files(files):
            raise FilesFolder(files)
    return storage, infos


def _is_one_checkpoint(storage: RunStorage) -> bool:
    try:
        return bool(storage.fs.exists(f"{storage.root}/{MANIFEST_NAME}"))
    except Exception:  # a hint only: never fail because of it
        return False


# ------------------------------------------------------------------ picking a checkpoint


def select_checkpoint(
    storage: RunStorage, infos: Sequence[CheckpointInfo], epoch: int | None, name: str | None
) -> CheckpointInfo:
    """By name; or the newest good one of an epoch (else its newest of any status); or the latest good."""
    if epoch is not None and epoch < 0:
        raise UsageError(f"--epoch must be >= 0, got {epoch}")
    see = f"`resumable list {storage.url}` shows what is there"
    if name is not None:
        found = [i for i in infos if i.name == name]
        if not found:
            raise CheckpointNotFoundError(f"{storage.url}: no checkpoint named {name!r}; {see}")
        return found[0]
    if epoch is not None:
        of_epoch = [i for i in infos if _epoch_of(storage, i) == epoch]
        good = [i for i in of_epoch if i.ok]
        if not of_epoch:
            raise CheckpointNotFoundError(f"{storage.url}: no checkpoint of epoch {epoch}; {see}")
        return (good or of_epoch)[-1]
    latest = latest_good(infos)
    if latest is None:
        raise CheckpointNotFoundError(f"{storage.url}: no good checkpoint; {see}")
    return latest


def _epoch_of(storage: RunStorage, info: CheckpointInfo) -> int | None:
    if info.epoch is not None:
        return info.epoch
    parsed = storage.template.parse(info.name)  # a partial checkpoint has only its name
    return parsed[0] if parsed else None


def latest_good(infos: Sequence[CheckpointInfo]) -> CheckpointInfo | None:
    return next((i for i in reversed(infos) if i.ok), None)


# ------------------------------------------------------------------ ranking


@dataclass(frozen=True)
class Ranking:
    """Which metric ranks checkpoints, which way, and where that choice came from."""

    monitor: str | None
    mode: str
    source: str

    def best(self, infos: Sequence[CheckpointInfo]) -> CheckpointInfo | None:
        if self.monitor is None:
            return None
        return best_one(infos, self.monitor, self.mode)  # type: ignore[return-value]

    def describe(self, best_one: CheckpointInfo | None) -> str:
        if self.monitor is None:
            return "best: no metric recorded; pass --monitor METRIC"
        if best_one is None:
            return f"best {self.monitor}: none; no good end-of-epoch checkpoint recorded it"
        better = "lower" if self.mode == "min" else "higher"
        value = metric_text(best_one, self.monitor)
        return (f"best {self.monitor}: {best_one.name} (epoch {best_one.epoch}, {self.monitor}={value}; "
                f"{better} is better, {self.source})")


def choose_ranking(
    infos: Sequence[CheckpointInfo], monitor: str | None, mode: str | None, recorded: Sequence[str]
) -> Ranking:
    """The metric to rank by: as asked, else as the callback recorded, else Keras' default val_loss.

    ``recorded``: the metrics the checkpoints logged (`metric_names`).
    """
    state = _recorded_state(infos)
    if monitor is not None:
        if infos and monitor not in recorded:
            known = ", ".join(recorded) or "none"
            raise UsageError(f"--monitor {monitor}: no checkpoint recorded this metric; recorded: {known}")
        source = "--monitor"
    elif isinstance(state.get("monitor"), str):
        monitor, source = state["monitor"], "recorded by the callback"
        if mode is None and state.get("mode") in ("auto", "min", "max"):
            mode = state["mode"]
    else:
        monitor = next((m for m in ("val_loss", "loss") if m in recorded), None)
        source = "default"
    return Ranking(monitor, resolve_mode(monitor, mode or "auto"), source)


def _recorded_state(infos: Sequence[CheckpointInfo]) -> dict[str, Any]:
    latest = latest_good(infos)
    return latest.manifest.state if latest is not None and latest.manifest is not None else {}


def metric_names(infos: Iterable[CheckpointInfo]) -> list[str]:
    """Every metric any checkpoint recorded, in the order Keras logged them."""
    return list(dict.fromkeys(itertools.chain.from_iterable(map(_metrics_of, infos))))


_metrics_of = operator.attrgetter("metrics")  # `map` with it, not a generator: thousands of checkpoints
