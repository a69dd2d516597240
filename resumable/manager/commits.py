"""The three ways a checkpoint is committed, one chosen per checkpoint by `RunWriter.commit_for`.

Each carries out the protocol of `resumable.storage.commit` (its docstring numbers the steps)
for one kind of run folder, and each runs in the uploader's thread (or the caller's, with
``async_upload=False``), with the writer lease held and renewed just before (`RunWriter.holding`,
`RunWriter.renew_before_commit`):

- `InPlace` (a local folder or a Drive mount, files held in memory): step 1 clears the
  checkpoint's folder in the run (`begin_in_place`; a damaged one resume() found is replaced),
  step 2 writes the files straight into it (`listener.write_files`), then syncs each and checks
  its size, step 3 writes the manifest, step 4 the index (`commit_in_place`). Nothing is
  staged; a failed write deletes the partial folder.
- `Staged` (a bucket, or files Keras wrote into a staging folder): step 2's files are written
  into ``<staging_dir>/staging/<name>`` first (`write`, before the commit), then steps 1 to 4
  upload them and write the manifest (`RunStorage.commit`).
- `Parts` (a multi-host job whose model no process holds whole, #36): every process writes its
  part into its own staging folder (`write`: an error is kept for the round, never raised
  alone), then `job_commit.JobCommit` takes the steps apart: process 0 clears the folder (1),
  every process uploads its files (2), process 0 writes the one manifest (3, 4).

`stages` says whether the files go through a staging folder: the uploader keeps that folder as
the local copy of the last commit (`committed_copy`), and deletes it when the job is dropped.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from resumable.core.errors import ResumableError
from resumable.core.manifest import Manifest
from resumable.manager.job_commit import JobCommit
from resumable.manager.listener import Files, write_files
from resumable.storage import CheckpointInfo, RunStorage
from resumable.storage.commit import Committer

T = TypeVar("T")

CommitFn = Callable[[Path, str, Manifest], CheckpointInfo]


class Writer(Protocol):
    """What a commit needs of the run folder's writer (`run_writer.RunWriter`)."""

    storage: RunStorage

    @property
    def verbose(self) -> bool: ...

    def holding(self) -> contextlib.AbstractContextManager[None]: ...

    def renew_before_commit(self, name: str) -> None: ...

    def replacing_damaged(self, name: str, begin: Callable[[], T]) -> T: ...

    def between_chunks(self) -> None: ...


class Commit(Protocol):
    """One way of committing a checkpoint (see the module docstring)."""

    stages: bool

    def write(self, job: SaveJob) -> None:
        """A staging commit's files written into ``job.staged`` (from ``job.files``)."""
        ...

    def run(self, job: SaveJob) -> CheckpointInfo:
        """The commit: the checkpoint's info once its manifest is written."""
        ...


class Staged:
    """Files written into a staging folder, then uploaded, then the manifest (a bucket's run)."""

    stages = True

    def __init__(self, commit: CommitFn) -> None:
        self._commit = commit  # `RunWriter.commit_staged`, or a bare `RunStorage.commit`

    def write(self, job: SaveJob) -> None:
        if job.files is not None:
            write_files(job.files, job.staged, None)

    def run(self, job: SaveJob) -> CheckpointInfo:
        return self._commit(job.staged, job.name, job.manifest)


class InPlace:
    """Files written straight into the checkpoint's folder of a local run, synced, then the manifest."""

    stages = False

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._committer: Committer = writer.storage.committer  # steps 1, 3 and 4 of the protocol

    def write(self, job: SaveJob) -> None:
        """Nothing before the commit: the files are written as it commits (`run`)."""

    def run(self, job: SaveJob) -> CheckpointInfo:
        writer, storage, committer, name = self._writer, self._writer.storage, self._committer, job.name
        if job.files is None:
            raise ResumableError(f"{storage.url}/{name}: no files to write in place")
        with writer.holding():
            writer.renew_before_commit(name)
            target = Path(writer.replacing_damaged(name, lambda: committer.begin_in_place(name)))
            try:
                written = write_files(job.files, target, storage.root)
            except BaseException:
                with contextlib.suppress(ResumableError, OSError):  # a partial folder only holds space
                    storage.delete(name)
                raise
            return self._committer.commit_in_place(name, job.manifest, written)


class Parts:
    """#36: this process's part staged, uploaded, and committed with every other process's."""

    stages = True

    def __init__(self, writer: Writer, job: JobCommit) -> None:
        self._writer = writer
        self._job = job

    def write(self, job: SaveJob) -> None:
        files = job.files
        if files is not None:
            self._job.write_part(job.staged, lambda: write_files(files, job.staged, None))

    def run(self, job: SaveJob) -> CheckpointInfo:
        writer = self._writer
        with writer.holding():
            writer.renew_before_commit(job.name)
            return self._job.commit(job.staged, job.name, job.manifest, progress=writer.verbose,
                                    between_chunks=writer.between_chunks)


@dataclass(eq=False)
class SaveJob:
    """One save as it travels through the uploader's queue: checkpoint ``name``, its manifest,
    its files and the commit that lands them.

    ``files``: the files still to write, in the worker thread (a snapshot held in memory);
    None once written into ``staged``, so that the memory goes as soon as they are on disk (a
    commit in place keeps them until committed: a retry writes them again), or when Keras
    wrote them into ``staged`` already. ``commit``: how they are committed (`commits`).
    """

    staged: Path
    name: str
    manifest: Manifest
    submitted: float  # time.monotonic()
    commit: Commit
    files: Files | None = None

    def stage_files(self, before: Callable[[], None]) -> None:
        """Write the files into the staging folder, if they are not yet: ``before()`` first, then
        a failed earlier try's leftovers are cleared. A commit in place writes them as it commits."""
        if not self.commit.stages:
            before()
        elif self.files is not None:
            before()
            shutil.rmtree(self.staged, ignore_errors=True)
            self.commit.write(self)
            self.files = None


__all__ = ["Commit", "InPlace", "Parts", "SaveJob", "Staged", "Writer"]
