"""`RunReader`: one run folder as a reader sees it; it takes no lease and writes nothing there.

It finds the newest good checkpoint (`newest_good`), fetches and checks it into a local cache
(`fetch_newest`, `fetch`), or hands its big files over as they arrive while the caller loads
the first of them (`arriving_newest`, `arrive`: `arrival.py`), and plans pruning
(`plan_pruning`). It owns what a resume learns: the checkpoint restored (`last_checkpoint`)
and the newer ones found damaged (`damaged`), changed only through its methods. The writer
(`run_writer.RunWriter`) reads both, and tells it of each commit (`committed`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from resumable.core.display import printable
from resumable.core.errors import CheckpointExistsError, CorruptCheckpointError, ResumableError
from resumable.core.naming import check_name
from resumable.core.policy import Decision, Retention, plan
from resumable.manager.arrival import Arrival
from resumable.storage import CheckpointInfo, RunStorage
from resumable.storage.lease import LEASE_NAME, LeaseInfo, read_lease


@dataclass(frozen=True)
class PrunePlan:
    """What retention keeps and deletes of the checkpoints listed, one decision each."""

    checkpoints: list[CheckpointInfo]
    decisions: list[Decision]

    @property
    def doomed(self) -> list[CheckpointInfo]:
        return [info for info, d in zip(self.checkpoints, self.decisions, strict=True) if not d.keep]

    @property
    def freed(self) -> int:
        """Bytes the deletions free."""
        return sum(info.size for info in self.doomed)


class RunReader:
    """The reader of one run folder: the newest good checkpoint, fetched into a local cache.

    Args:
        storage: The run folder.
        staging_dir: The local folder whose ``cache`` subfolder holds downloaded checkpoints.
        verbose: Progress bars while downloading. Defaults to False.
    """

    def __init__(self, storage: RunStorage, staging_dir: Path, *, verbose: bool = False) -> None:
        self.storage = storage
        self.staging_dir = staging_dir
        self.verbose = verbose
        self._last: CheckpointInfo | None = None
        self._damaged: set[str] = set()  # newer checkpoints found corrupt when resuming: replaceable
        # those of them whose files check out but a caller's check refused (``check`` below)
        self._refused_by: dict[str, Callable[[Path, str], object]] = {}

    # ------------------------------------------------------------------ what a resume learned

    @property
    def last_checkpoint(self) -> CheckpointInfo | None:
        """The checkpoint restored, then the last one committed; None before either."""
        return self._last

    @property
    def damaged(self) -> set[str]:
        """Newer checkpoints found damaged when resuming (a copy: change it through the methods)."""
        return set(self._damaged)

    def resumed_from(self, checkpoint: CheckpointInfo | None, damaged: set[str]) -> None:
        """A resume restored ``checkpoint`` (None: nothing): it is the run's last checkpoint, and
        the newer ones in ``damaged`` may be replaced by training's commits."""
        self._last = checkpoint
        self._damaged = set(damaged)

    def mark_damaged(self, name: str) -> None:
        """Checkpoint ``name`` failed a check when resuming: passed over, and replaceable."""
        self._damaged.add(name)

    def committed(self, info: CheckpointInfo | None) -> None:
        """The writer committed ``info``, the run's last checkpoint now (None: it deleted them all)."""
        self._last = info

    def replaceable(self, name: str) -> bool:
        """Whether a commit may replace checkpoint ``name``: resume() found it damaged, and it
        still is (its files, or the check of the caller that refused it: another process may
        have replaced it since)."""
        if name not in self._damaged:
            return False
        if self.storage.verify(name):
            return True
        check, info = self._refused_by.get(name), self.storage.get(name)
        if check is None or info is None:
            return False
        try:
            check(self.fetch(info), info.url)
        except CorruptCheckpointError:
            return True
        return False

    def replaced(self, name: str) -> None:
        """The damaged checkpoint ``name`` was deleted to be committed anew."""
        self._damaged.discard(name)

    def blocking_writer(self) -> LeaseInfo | None:
        """Another live process that holds the lease (acquiring it would fail), or None."""
        found = self.other_writer()
        return found[0] if found is not None and found[0].blocks(found[1]) else None

    def other_writer(self) -> tuple[LeaseInfo, float | None] | None:
        """The lease of another process, live or not, and its age by the storage's clock (None
        where it does not tell); None without one."""
        try:
            holder = read_lease(self.storage)
        except ResumableError:
            return None  # reading the checkpoints will say what is wrong with the folder
        if holder is None or holder.mine():
            return None
        try:  # GCS' own clock says how long the lease has been silent; the holder's may be off
            server_age = self.storage.run_files.run_file_server_age(LEASE_NAME)
        except ResumableError:
            server_age = None
        return holder, server_age

    # ------------------------------------------------------------------ the newest good checkpoint

    def newest_first(self) -> Iterator[CheckpointInfo]:
        """Good checkpoints, newest first (skipped newer damaged ones are logged)."""
        return self.storage.newest_first()

    def newest_good(self) -> CheckpointInfo | None:
        """The newest good checkpoint that resuming did not find damaged."""
        return next((c for c in self.storage.newest_first() if c.name not in self._damaged), None)

    @property
    def cache_root(self) -> Path:
        """Where checkpoints are downloaded to be loaded."""
        return self.staging_dir / "cache"

    def fetch(self, info: CheckpointInfo) -> Path:
        """The checkpoint's folder to load from, every file checked (CorruptCheckpointError if bad).

        From a bucket: downloaded into the cache. From a local folder or a Drive mount: the
        checkpoint's own folder, once its files were read and checked in place.
        """
        check_name(info.name)  # the cache folder it names must be inside the cache
        if self.storage.is_local:  # a local disk or a Drive mount: loaded where it is, once checked
            return self.storage.checked_in_place(info)
        return self.storage.fetch(info, self.cache_root / info.name, progress=self.verbose)

    def arrive(self, info: CheckpointInfo, streamed: Callable[[str], bool]) -> Arrival:
        """The checkpoint's files coming down in a thread (`Arrival`), those ``streamed`` says
        a loader reads as they come last, in name order.

        From a local folder or a Drive mount: its own folder, every file checked first (`fetch`).
        """
        if self.storage.is_local:
            return Arrival.already_here(self.fetch(info))
        check_name(info.name)  # the cache folder it names must be inside the cache
        files = list(info.manifest.files) if info.manifest is not None else []
        last = sorted(rel for rel in files if streamed(rel))
        return Arrival(self.cache_root / info.name,
                       lambda landed: self.storage.fetch(info, self.cache_root / info.name,
                                                         progress=self.verbose, landed=landed, last=last),
                       files, last)

    def arriving_newest(self, warn: Callable[[str], None], check: Callable[[Path, str], object] | None = None,
                        streamed: Callable[[str], bool] = lambda rel: False
                        ) -> tuple[CheckpointInfo, Arrival] | None:
        """The newest checkpoint whose files check out but those ``streamed(rel)`` names (a
        loader's, which it reads as they come: `arrive`), these still arriving; None when there
        is none. Checkpoints in `damaged` are passed over.

        ``check(folder, url)``: the caller's own reading of the small files (the Keras side's
        state.json), raising CorruptCheckpointError for one it cannot use. Damaged newer ones
        are passed to ``warn`` and remembered in `damaged`: the next commits of the same names
        may replace them. A streamed file that comes down damaged is raised by the Arrival:
        the caller marks the name damaged (`mark_damaged`) and asks again.
        """
        for info in self.storage.newest_first():
            if info.name in self._damaged:
                continue
            arrival: Arrival | None = None
            try:
                arrival = self.arrive(info, streamed)
                local = arrival.wait_first()
                if check is not None:
                    try:
                        check(local, info.url)
                    except CorruptCheckpointError:
                        self._refused_by[info.name] = check
                        raise
                return info, arrival
            except CorruptCheckpointError as e:
                if arrival is not None:
                    arrival.close()
                warn(printable(str(e)))
                self._damaged.add(info.name)
            except BaseException:
                if arrival is not None:
                    arrival.close()
                raise
        return None

    def fetch_newest(self, warn: Callable[[str], None], check: Callable[[Path, str], object] | None = None
                     ) -> tuple[CheckpointInfo, Path] | None:
        """The newest checkpoint whose files all check out, fetched; None when there is none.

        As `arriving_newest`, every file waited for.
        """
        while (found := self.arriving_newest(warn, check)) is not None:
            info, arrival = found
            with arrival:
                try:
                    return info, arrival.result()
                except CorruptCheckpointError as e:
                    warn(printable(str(e)))
                    self._damaged.add(info.name)
        return None

    def keep_only_cached(self, name: str) -> None:
        """The cache holds one checkpoint: the one restored (a later resume reuses its files)."""
        if self.cache_root.is_dir():
            for child in self.cache_root.iterdir():
                if child.name != name:
                    shutil.rmtree(child, ignore_errors=True)

    # ------------------------------------------------------------------ planning

    def plan_pruning(self, retention: Retention, *, protect: Iterable[str] = (),
                     checkpoints: Sequence[CheckpointInfo] | None = None) -> PrunePlan:
        """Retention's decision for every checkpoint; ``protect`` names are kept.

        ``checkpoints``: as `RunStorage.list` returned them (oldest first), when the caller
        listed them already; else the run folder is listed with its files checked.
        """
        infos = list(checkpoints) if checkpoints is not None else self.storage.list()
        kept = set(protect)
        decisions = [d if d.keep or d.name not in kept else Decision(d.name, True, [*d.reasons, "in use"])
                     for d in plan(infos, retention)]
        return PrunePlan(infos, decisions)

    def check_continues(self, restored: str | None, step: int) -> int | None:
        """Refuse to mix a new training run into a folder that already holds one.

        ``restored``: the checkpoint this run resumed from; ``step``: the model's optimizer
        step now. Returns the epochs done when the model was restored by hand from the latest
        checkpoint (same step), else None. Raises CheckpointExistsError otherwise.
        """
        latest = self.newest_good()
        if latest is None or latest.name == restored:
            return None
        if self._last is not None and latest.name == self._last.name:
            return None  # a second fit in the same session
        if restored is None and latest.step == step and latest.step:
            return latest.epoch or 0  # the user restored this model themselves; continue from it
        if restored is not None:
            raise CheckpointExistsError(
                f"{latest.url} is newer than the checkpoint this run resumed from ({restored}): "
                "another process is training into this folder; stop it, then call resumable.resume() again"
            )
        raise CheckpointExistsError(
            f"{self.storage.url} already holds a run (latest {latest.name}, {latest.epoch} epochs); "
            "continue it with `run = resumable.resume(filepath, build_model=...)` and `run.fit(...)`, "
            "or write to a new folder"
        )


__all__ = ["PrunePlan", "RunReader"]
