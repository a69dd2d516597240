"""`RunWriter`: one run folder's only writer: the lease, staging, uploads, commits, retention, pruning.

`RunManager` builds it the first time something writes (`acquire`, `writing`, `stage`,
`submit`, `prune`, ...): a resume that only reads takes no lease and starts no thread. Built,
it fences the storage at once (``storage.fence = lease.fence``): every manifest write and
delete reads the lease afresh first, and nothing is written once another process took the run
over. What a resume learned (the checkpoint restored, the damaged ones a commit may replace)
belongs to the reader (`run_reader.RunReader`); the writer reads it and reports each commit
to it (`RunReader.committed`).

A save: `submit` chooses the checkpoint's commit once (`commit_for`: in place, staged or in
parts, `commits`) and hands the job (its manifest, its files, its commit) to the uploader's
thread (`uploader.Uploader`), which runs the commit and then `_committed`: the reader told,
retention applied, then the caller's `listener.SaveListener` told. The lease renews itself in
its own thread from `acquire` on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from resumable.core.errors import CheckpointExistsError, LeaseHeldError, LeaseLostError, ResumableError
from resumable.core.manifest import Manifest
from resumable.core.policy import Retention
from resumable.manager.background import wait_at_exit
from resumable.manager.commits import Commit, InPlace, Parts
from resumable.manager.job_commit import DEFAULT_BARRIER_TIMEOUT, JobChannel, JobCommit
from resumable.manager.listener import Files, SaveListener, tell_committed, tell_skipped
from resumable.manager.run_reader import RunReader
from resumable.manager.uploader import Uploader
from resumable.storage import CheckpointInfo
from resumable.storage.lease import DEFAULT_TIMEOUT, Lease, LeaseInfo, read_lease

logger = logging.getLogger("resumable")

T = TypeVar("T")


@dataclass
class WriterOptions:
    """How the writer writes (`RunManager`'s arguments of the same names), read when used."""

    retention: Retention | None = None
    lease_timeout: float = DEFAULT_TIMEOUT
    takeover: bool = False
    async_upload: bool = True
    verbose: bool = False
    when_behind: str = "skip"


# A save's files written in a thread of its own go first to ``<staging>/<name>.writing-*`` (the
# Keras side's `tail_write`); a process killed meanwhile leaves one, removed by the next writer.
PRIVATE_WRITE = ".writing-"


class RunWriter:
    """The writer of one run folder; built by `RunManager` at its first write.

    Args:
        reader: The run folder's reader: its storage, staging folder, last and damaged checkpoints.
        options: How to write.
        listener: Told of each commit (retention applied, in the uploader's thread) and of each
            checkpoint skipped; None logs the skipped ones.
    """

    def __init__(self, reader: RunReader, options: WriterOptions, *, listener: SaveListener | None) -> None:
        self.reader = reader
        self.storage = reader.storage
        self.options = options
        self.listener = listener
        # One writer per run folder; at interpreter exit the last uploads land before it is released.
        self.lease = Lease(self.storage, timeout=options.lease_timeout, before_exit=wait_at_exit)
        self.storage.fence = self.lease.fence  # every manifest write and delete checks it afresh
        # The newest committed checkpoint's files stay in staging_dir/committed until the next
        # save: a local copy to recover by hand; resume() reads the run folder's copy.
        self.uploader = Uploader(self.storage, commit=self.commit_staged, on_commit=self._committed,
                                 cache_dir=reader.staging_dir / "committed", verbose=options.verbose,
                                 when_behind=options.when_behind, on_skipped=self._skipped)
        self.job: JobCommit | None = None  # #36: set when every process of a multi-host job writes its part

    # ------------------------------------------------------------------ the writer lease

    def acquire(self) -> None:
        """Become the run folder's only writer (LeaseHeldError naming the holder), renewed until `release`."""
        self.lease.acquire(takeover=self.options.takeover)
        self.lease.start_renewing()
        self.storage.remove_stray_index_copies()  # a killed writer's; no other writer runs now
        self._remove_private_writes()

    def _remove_private_writes(self) -> None:
        """A killed writer's private write folders (`PRIVATE_WRITE`), left in this staging folder:
        the lease is ours, so no save of this run writes into them any more."""
        for folder in (self.reader.staging_dir / "staging").glob(f"*{PRIVATE_WRITE}*"):
            shutil.rmtree(folder, ignore_errors=True)

    @contextlib.contextmanager
    def writing(self, *, force: bool = False) -> Iterator[LeaseInfo | None]:
        """Hold the lease for a one-off change (`RunManager.writing`)."""
        try:
            self.lease.acquire()
        except LeaseHeldError:
            if not force:
                raise
            yield read_lease(self.storage)
            return
        try:
            yield None
        finally:
            self.lease.release()

    def finish(self, *, quiet: bool = False) -> None:
        """Land the uploads, then give the lease back (`RunManager.finish`)."""
        try:
            self.uploader.wait(message=False if quiet else None)
        except LeaseLostError as e:  # training raises it (or did): said there, once
            logger.info("resumable: %s", e)
        except Exception as e:  # noqa: BLE001 - the error that ended training matters more
            logger.warning("resumable: %s", e)
        except KeyboardInterrupt:
            logger.warning("resumable: stopped waiting for the uploads; the writer lease of %s stays held",
                           self.storage.url)
            raise
        self.lease.release()

    # ------------------------------------------------------------------ saving

    def every_process_writes(self, channel: JobChannel, timeout: float = DEFAULT_BARRIER_TIMEOUT) -> None:
        """#36: every process uploads its files of each checkpoint, process 0 commits them
        (`RunManager.every_process_writes`)."""
        if self.job is None:
            self.job = JobCommit(self.storage, channel, timeout=timeout, prepare=self._prepare_job_commit,
                                 token=lambda: self.lease.info.token if self.lease.info is not None else None)
            self.uploader.when_behind = "wait"
            self.uploader.retry_failed = False

    def stage(self, name: str, *, drop_cached: bool = True) -> Path:
        """An empty local folder to write checkpoint ``name`` into (`RunManager.stage`)."""
        self.lease.check()
        if self.uploader.in_progress(name):
            self.uploader.wait()  # never rewrite files in flight
        folder = self.reader.staging_dir / "staging" / name
        shutil.rmtree(folder, ignore_errors=True)
        if drop_cached:
            self.uploader.drop_cached()
        return folder

    def submit(self, folder: Path, name: str, manifest: Manifest, *, files: Files | None = None) -> None:
        """A save handed over: checkpoint ``name`` (``manifest``; its ``files``, or those in ``folder``)
        committed in the background (`Uploader.commit_later`) or now (`Uploader.commit_now`,
        ``async_upload=False``), by the commit `commit_for` chooses. The one ``submit`` of the
        package: `Uploader` queues with `commit_later`, `background.Worker` with `enqueue`, and a
        drop-in's `file_writer.FileWriter` with `write_later`."""
        commit = self.commit_for(files)
        if self.options.async_upload:
            self.uploader.commit_later(folder, name, manifest, files=files, commit=commit)
        else:
            self.uploader.commit_now(folder, name, manifest, files=files, commit=commit)

    def commit_for(self, files: Files | None) -> Commit:
        """The checkpoint's commit, chosen once (`commits`): in parts for a multi-host job's (#36),
        in place for a local run's files held in memory, else staged then uploaded."""
        if self.job is not None:
            return Parts(self, self.job)
        if files is not None and self.writes_in_place:
            return InPlace(self)
        return self.uploader.staged_commit

    @property
    def verbose(self) -> bool:
        """Progress bars while uploading."""
        return self.options.verbose

    @property
    def writes_in_place(self) -> bool:
        """Whether a save's files are written where they stay (`RunManager.writes_in_place`)."""
        return self.storage.is_local and self.job is None

    def commit_staged(self, staging: Path, name: str, manifest: Manifest) -> CheckpointInfo:
        """Steps 1 to 4 for the files in ``staging`` (`commits.Staged`)."""
        # A commit after the lease was given back (one retried once fit ended, or landing at
        # exit) takes it again for itself: never written into a run another process may hold.
        with self.holding():
            self.renew_before_commit(name)
            return self.replacing_damaged(name, lambda: self.storage.commit(
                staging, name, manifest, progress=self.options.verbose, between_chunks=self.between_chunks))

    def renew_before_commit(self, name: str) -> None:
        """A fresh check that the run is still this writer's, right before a commit writes."""
        if self.lease.held or self.lease.lost:
            try:
                self.lease.renew()  # a fresh check that the run is still ours, just before writing
            except LeaseLostError:
                raise
            except ResumableError as e:  # the storage failed: the commit will say how, if it fails too
                logger.warning("resumable: could not renew the writer lease before committing %s: %s",
                               name, e)

    def _prepare_job_commit(self, name: str) -> None:
        """#36: process 0's first step of a job's commit: the folder cleared, or a damaged one replaced."""
        self.replacing_damaged(name, lambda: self.storage.committer.prepare(name))

    def replacing_damaged(self, name: str, begin: Callable[[], T]) -> T:
        """``begin()`` (the commit, or its first step); a checkpoint of that name resume() found
        damaged, and still is, is deleted first (only those may be replaced)."""
        try:
            return begin()
        except CheckpointExistsError:
            if not self.reader.replaceable(name):
                raise
        logger.warning("resumable: replacing damaged checkpoint %s", name)
        self.storage.delete(name)
        self.reader.replaced(name)
        return begin()

    def between_chunks(self) -> None:
        """Before each chunk of an upload: stop once a renewal found the run taken over."""
        self.lease.check()
        self.uploader.between_chunks()

    def _committed(self, info: CheckpointInfo) -> None:
        """After each commit, in the uploader's thread when uploading in the background."""
        self.reader.committed(info)
        logger.info("resumable: saved %s", info.url)
        if self.job is not None and not self.job.chief:
            return  # #36: process 0 alone applies retention and reports commits
        self.apply_retention()
        tell_committed(self.listener, info)

    def _skipped(self, line: str) -> None:
        """A checkpoint replaced while it waited for its upload (the submitting thread)."""
        tell_skipped(self.listener, line)

    # ------------------------------------------------------------------ retention and pruning

    def prune(self, doomed: Sequence[CheckpointInfo], *, progress: Callable[[Sequence[CheckpointInfo]],
              Iterable[CheckpointInfo]] | None = None, tolerant: bool = False) -> list[str]:
        """Delete checkpoints a `PrunePlan` dooms; the caller holds the lease (`RunManager.prune`)."""
        deleted: list[str] = []
        shown = iter(progress(doomed)) if progress is not None else iter(())  # the bar moves as they go
        left = list(doomed)
        while left:
            self.lease.check()  # another process writes the run now: its checkpoints are not ours
            batch, left, done = left, [], 0
            try:  # the index loses them all in one write; each delete re-reads the lease (`fence`)
                for name in self.storage.delete_many(batch):
                    deleted.append(name)
                    done += 1
                    next(shown, None)
            except LeaseLostError:
                raise
            except ResumableError as e:
                if not tolerant:
                    raise
                logger.warning("resumable: could not delete %s: %s", batch[done].name, e)
                next(shown, None)
                left = batch[done + 1:]
        next(shown, None)  # past the last one: the bar closes
        return deleted

    def delete_every_checkpoint(self) -> None:
        """Delete every checkpoint, then the run index (`RunManager.delete_every_checkpoint`); the
        lease is taken for it when given back (BackupAndRestore deletes its backups after fit)."""
        with self.holding():
            for info in self.storage.list(check_files=False):
                self.storage.delete(info)
            self.reader.committed(None)
            self.storage.committer.delete_index()
        if self.storage.is_local:
            with contextlib.suppress(OSError):
                os.rmdir(self.storage.root)  # only when empty

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The lease held within: as it is, or taken for the block when this process gave it back
        (LeaseHeldError naming a live holder); LeaseLostError once another process took the run."""
        self.lease.check()
        if self.lease.held or not self.lease.given_back:
            yield
            return
        with self.writing():
            yield

    def apply_retention(self) -> None:
        """After a commit: delete what retention drops, never the checkpoint just committed."""
        retention = self.options.retention
        if retention is None or self.lease.lost:
            return  # after a takeover the run is another process's: never delete its checkpoints
        last = self.reader.last_checkpoint
        try:
            pruning = self.reader.plan_pruning(retention, protect=[last.name] if last else [])
        except ResumableError as e:
            logger.warning("resumable: retention skipped: %s", e)
            return
        with contextlib.suppress(LeaseLostError):
            self.prune(pruning.doomed, tolerant=True)


__all__ = ["RunWriter", "WriterOptions"]
