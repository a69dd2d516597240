"""`Uploader`: the save jobs' one queue, run in a background thread while training goes on.

Each save is one job (`commits.SaveJob`): the checkpoint's name and manifest, its files still
in memory (`listener.Files`) or already in a staging folder, and its commit (`commits`: in
place, staged, in parts). The worker runs a job in two steps, in order: `SaveJob.stage_files` (a
staged job's files written into its staging folder, the local copy of the last commit dropped
first), then ``job.commit.run(job)`` (the protocol's steps); then ``on_commit`` (the writer's
retention and listener).

One worker thread and two slots: the job in flight and the job waiting. By default
(``when_behind="skip"``) a newer job replaces the waiting one (whose staged folder is deleted):
when uploads are slower than training, the run folder gets every checkpoint the network can
carry, always the newest, and training never waits; one line says which checkpoint was
skipped, and why the first time. With ``when_behind="wait"`` `commit_later` waits for the slot
instead: every checkpoint is committed, and training waits while uploads are behind.
Independent of Keras; works with any `RunStorage`.

A job whose commit fails (after the storage layer's own retries with backoff) is reported as a
warning with the reason; its staged folder is kept, and it is tried again at the next `commit_later`
and at `wait`, unless a newer job has been committed since. `wait` raises the error when the
newest job still could not be committed. At interpreter exit, pending uploads are waited for,
with a message.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from resumable.core import user_warnings
from resumable.core.errors import LeaseLostError
from resumable.core.manifest import Manifest
from resumable.manager.background import Worker, wait_for
from resumable.manager.commits import Commit, CommitFn, SaveJob, Staged
from resumable.manager.committed_copy import CommittedCopy
from resumable.manager.listener import Files
from resumable.storage import CheckpointInfo, RunStorage

logger = logging.getLogger("resumable")

WHEN_BEHIND = ("skip", "wait")
PAUSE_LIMIT = 300.0  # seconds an upload waits for a serialization at most (a hung save must not stop it)


class Uploader:
    """Commit staged checkpoint folders to a `RunStorage`, one at a time, in a background thread.

    Example:

    ```python
    uploader = Uploader(RunStorage("gs://bucket/runs/exp1"), on_commit=print)
    uploader.commit_later(Path("/tmp/stage/ckpt-000003"), "ckpt-000003", Manifest(epoch=3))  # returns at once
    uploader.wait()   # blocks until idle; raises if the newest checkpoint could not be committed
    ```

    Args:
        storage: The run folder.
        commit: Commits one job, ``commit(staged, name, manifest) -> CheckpointInfo``.
            Defaults to ``storage.commit``.
        on_commit: Called in the worker thread after each successful commit, before the next
            job starts (retention runs there, so it never deletes while this run uploads).
            Defaults to None.
        cache_dir: Where the newest committed staged folder is moved, as ``cache_dir/<name>``,
            replacing what was there: a local copy of the last checkpoint, until `drop_cached`.
            Defaults to None: staged folders are deleted once committed.
        verbose: Print waits. Defaults to False.
        when_behind: A job submitted while another waits: ``"skip"`` replaces the waiting one
            (said in one line, through ``on_skipped``), ``"wait"`` blocks until the slot is
            free, so that every job is committed. Defaults to ``"skip"``.
        on_skipped: Called with the line that says a waiting job was replaced (in the
            submitting thread). Defaults to None: the line is logged as a warning.
    """

    def __init__(
        self,
        storage: RunStorage,
        *,
        commit: CommitFn | None = None,
        on_commit: Callable[[CheckpointInfo], None] | None = None,
        cache_dir: Path | None = None,
        verbose: bool = False,
        when_behind: str = "skip",
        on_skipped: Callable[[str], None] | None = None,
    ) -> None:
        check_when_behind(when_behind)
        self.when_behind = when_behind
        self.on_skipped = on_skipped
        self._said_why = False  # the first skip's line says why, and how to keep every checkpoint
        self.storage = storage
        self.staged_commit = Staged(commit or storage.commit)  # a job submitted without its commit
        self._on_commit = on_commit
        self.cache_dir = cache_dir
        self._copy = CommittedCopy(cache_dir)
        self.verbose = verbose
        # The worker thread runs one job at a time; its lock guards this uploader's state too.
        self._worker: Worker[SaveJob] = Worker("resumable-uploader", self._upload, first=self._retry_first,
                                                 at_exit=lambda: land_at_exit(self))
        self._cond = self._worker.cond
        self._failed: SaveJob | None = None  # kept on disk; retried by the next commit_later or wait
        self._error: BaseException | None = None  # why _failed failed
        self._lost: LeaseLostError | None = None  # a job dropped: the lease was lost; wait() raises it once
        # #36: False for the processes of a multi-host job, which must all commit the same
        # checkpoints in the same order: a failed job is dropped on each, never tried again.
        self.retry_failed = True
        self._given_up: BaseException | None = None  # such a dropped job's error: wait() raises it once
        self._retry = False  # the worker is to try _failed again
        self._closed = False
        self._unpaused = threading.Event()
        self._unpaused.set()
        self.committed: list[str] = []  # names committed by this uploader, in order
        self.replaced: list[str] = []  # names dropped because a newer job replaced them

    def __repr__(self) -> str:
        return f"Uploader({self.storage.url!r}, pending={self.pending})"

    @property
    def _thread(self) -> threading.Thread | None:
        return self._worker.thread

    @property
    def pending(self) -> list[str]:
        """Names not yet committed: in flight, waiting, failed."""
        with self._cond:
            jobs = (self._worker.in_flight, self._worker.waiting, self._failed)
            return [j.name for j in jobs if j is not None]

    def in_progress(self, name: str) -> bool:
        """True while a job named ``name`` is in flight or waiting."""
        with self._cond:
            jobs = (self._worker.in_flight, self._worker.waiting)
            return any(j is not None and j.name == name for j in jobs)

    def commit_later(self, staged: Path, name: str, manifest: Manifest, *, files: Files | None = None,
               commit: Commit | None = None) -> None:
        """Queue ``staged`` for committing as ``name`` and return at once.

        ``files``: written in the worker thread by the commit (a snapshot in memory); without
        them, ``staged`` holds the files already. ``commit``: how (`commits`); defaults to
        `staged_commit`. A job already waiting is replaced (its staged folder deleted, its
        snapshot freed), or with ``when_behind="wait"`` waited for. A job that failed before is
        queued again ahead of this one, unless this one has the same name.
        """
        job = self._job(staged, name, manifest, files, commit)
        with self._cond:
            if self._closed:
                raise RuntimeError("Uploader.commit_later after close()")
            worker = self._worker
            if self.when_behind == "wait" and worker.waiting is not None and worker.waiting.name != name:
                logger.info("resumable: %s waits for the upload of %s (when_behind='wait')", name,
                            worker.waiting.name)
                wait_for(self._cond, lambda: worker.waiting is None or self._closed)
                if self._closed:
                    raise RuntimeError("Uploader.commit_later after close()")
            in_flight = worker.in_flight
            if self._failed is not None and self._failed.name == name:
                if self._failed.staged != job.staged:
                    self._drop(self._failed)
                self._failed = None
                self._error = None
            self._retry = self._failed is not None
            dropped = worker.enqueue(job)  # the lock is held: the worker takes nothing before this is done
        if dropped is not None:
            if dropped.staged != job.staged:
                self._drop(dropped)
            if dropped.name != name:  # the same name saved again replaces nothing kept
                self.replaced.append(dropped.name)
                self._say_skipped(dropped, job, in_flight)

    def _job(self, staged: Path, name: str, manifest: Manifest, files: Files | None,
             commit: Commit | None) -> SaveJob:
        """The save job, submitted now; committed by `staged_commit` unless ``commit`` says otherwise."""
        return SaveJob(Path(staged), name, manifest, time.monotonic(), commit or self.staged_commit, files)

    def _say_skipped(self, dropped: SaveJob, newer: SaveJob, in_flight: SaveJob | None) -> None:
        """One line per checkpoint skipped: which, and the first time why and what to do."""
        line = skipped_line(dropped, newer, in_flight, why=not self._said_why)
        self._said_why = True
        if self.on_skipped is not None:
            self.on_skipped(line)
        else:
            logger.warning("%s", line)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the upload in flight between two chunks while the caller serializes a checkpoint.

        The upload and the serialization compete for the same CPU, disk and (on a Drive mount)
        FUSE daemon, and the serialization is what training waits for; the upload can wait.
        The hold lasts at most ``PAUSE_LIMIT`` seconds. Only the worker thread ever waits.
        """
        self._unpaused.clear()
        try:
            yield
        finally:
            self._unpaused.set()

    def drop_cached(self) -> None:
        """Delete the local copy of the last committed checkpoint: the next save is about to replace
        it (`CommittedCopy.drop`)."""
        self._copy.drop()

    def between_chunks(self) -> None:
        """Called by the upload before each chunk: waits while `paused` holds it (worker thread only)."""
        if self._worker.in_worker():
            self._unpaused.wait(PAUSE_LIMIT)

    def commit_now(self, staged: Path, name: str, manifest: Manifest, *, files: Files | None = None,
                   commit: Commit | None = None) -> CheckpointInfo:
        """Commit in the calling thread (synchronous mode); errors raise, the staged folder is kept."""
        self.wait()
        job = self._job(staged, name, manifest, files, commit)
        job.stage_files(before=self.drop_cached)
        info = job.commit.run(job)
        self._committed_job(job)
        if self._on_commit is not None:
            self._on_commit(info)
        return info

    def wait(self, timeout: float | None = None, *, message: bool | None = None) -> bool:
        """Block until nothing is in flight or waiting; retry a failed job once first.

        Returns False when ``timeout`` seconds passed first. Raises the last error when the
        newest job failed (its staged folder is kept; a later commit_later or wait tries again).
        ``message`` prints what is waited for; defaults to ``verbose``.
        """
        worker = self._worker

        def idle() -> bool:
            return worker.in_flight is None and worker.waiting is None and not self._retry_pending()

        with self._cond:
            if self._failed is not None and worker.waiting is None and worker.in_flight is None:
                self._retry = True
                worker.wake()  # the worker retries the failed job
            names = [j.name for j in (worker.in_flight, worker.waiting, self._failed) if j is not None]
            if names and (self.verbose if message is None else message):
                print(f"resumable: waiting for the upload of {', '.join(names)} to {self.storage.url} ...",
                      file=sys.stderr, flush=True)
            started = time.monotonic()
            if not wait_for(self._cond, idle, timeout):  # a Ctrl-C interrupts it
                return False
            error = self._error if self._failed is not None else None
            if error is None and self._lost is not None:
                error, self._lost = self._lost, None
            if error is None and self._given_up is not None:
                error, self._given_up = self._given_up, None
        if names:
            logger.info("resumable: waited %.1f s for uploads to %s", time.monotonic() - started,
                        self.storage.url)
        if error is not None:
            raise error
        return True

    def close(self, timeout: float | None = None) -> None:
        """Wait for pending uploads (errors become warnings), then stop the worker thread."""
        try:
            self.wait(timeout)
        except Exception as e:
            user_warnings.warn(f"resumable: {e}")
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.close()

    # ----------------------------------------------------------------- the worker

    def _retry_pending(self) -> bool:
        return self._failed is not None and self._retry

    def _retry_first(self) -> SaveJob | None:
        """Under the lock, before the waiting job: a failed job to try again, once asked to."""
        if self._failed is not None and self._retry:
            job, self._failed, self._retry = self._failed, None, False
            return job
        return None

    def _upload(self, job: SaveJob) -> None:
        """One job, in the worker thread: every error is the uploader's to report (never raised)."""
        try:
            job.stage_files(before=self.drop_cached)  # the old copy goes first: never two on disk
            info = job.commit.run(job)
        except BaseException as e:  # reported at the next wait(), never lost
            self._failed_job(job, e)
            return
        self._committed_job(job)
        if self._on_commit is not None:
            try:
                self._on_commit(info)
            except Exception as e:  # the checkpoint is committed; what follows is bookkeeping
                user_warnings.warn(f"resumable: after committing {job.name}: {e}")

    def _committed_job(self, job: SaveJob) -> None:
        with self._cond:
            self.committed.append(job.name)
            self._given_up = None  # a newer checkpoint is committed: the one dropped is not the newest
            older = self._failed
            if older is not None and _key(older) <= _key(job):  # superseded by a newer commit
                self._failed, self._error = None, None
        if older is not None and self._failed is None:
            self._drop(older)
        self._keep(job)

    def _failed_job(self, job: SaveJob, error: BaseException) -> None:
        if isinstance(error, LeaseLostError):
            # Another process writes the run now: this checkpoint is never to be committed, and
            # the loss is said once, by the training that raises it (the next wait() raises it too).
            logger.info("resumable: %s not committed: %s", job.name, error)
            self._drop(job)
            with self._cond:
                self._lost = error
            return
        what = "upload" if job.files is None else "save"
        if not self.retry_failed:
            user_warnings.warn(f"resumable: {what} of {job.name} failed: {error}; it is not tried again, "
                               "the next save commits a newer checkpoint")
            self._drop(job)
            with self._cond:
                self._given_up = error
            return
        kept = f"the local copy {job.staged}" if job.files is None else "the checkpoint, in memory,"
        user_warnings.warn(f"resumable: {what} of {job.name} failed: {error}; {kept} is kept and the next "
                           "save tries again")
        with self._cond:
            older = self._failed
            self._failed, self._error = job, error
        if older is not None and older is not job:
            self._drop(older)

    def _keep(self, job: SaveJob) -> None:
        """Move the committed staged folder into the cache (or delete it)."""
        if job.commit.stages:  # else nothing staged: the run folder holds the only copy
            self._copy.keep(job.staged, job.name)

    @staticmethod
    def _drop(job: SaveJob) -> None:
        # A job written in place leaves a partial folder at most: the next commit clears it.
        if job.commit.stages:
            shutil.rmtree(job.staged, ignore_errors=True)


def land_at_exit(uploader: Uploader) -> None:
    """At interpreter exit, let pending uploads finish so the last checkpoint lands."""
    pending = uploader.pending
    if not pending:
        return
    print(f"resumable: finishing the upload of {', '.join(pending)} to {uploader.storage.url} before "
          "exiting ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        uploader.wait(message=False)
    except Exception as e:
        print(f"resumable: upload to {uploader.storage.url} failed at exit: {e}", file=sys.stderr)
    else:
        print(f"resumable: uploaded in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def check_when_behind(when_behind: object) -> None:
    if when_behind not in WHEN_BEHIND:
        raise ValueError(
            f"Invalid value for argument `when_behind`. Received: when_behind={when_behind!r}. "
            "Expected 'skip' (a newer checkpoint replaces one still waiting for its upload) or 'wait' "
            "(training waits, every checkpoint is kept)."
        )


def skipped_line(dropped: SaveJob, newer: SaveJob, in_flight: SaveJob | None, *, why: bool) -> str:
    """The line that says ``dropped`` was replaced by ``newer``; with ``why`` (the first time), why
    and what to do."""
    if not why:
        return (f"resumable: {_describe(dropped)} ({dropped.name}) not uploaded either: replaced by the "
                f"newer {newer.name}")
    busy = f"the upload of {in_flight.name} was still running" if in_flight is not None else (
        "uploads were behind")
    return (f"resumable: {_describe(dropped)} ({dropped.name}) not uploaded: {busy} when "
            f"{_describe(newer)} was saved, so the newer {newer.name} took its place; pass "
            "when_behind='wait' to keep every checkpoint (training then waits for the uploads)")


def _describe(job: SaveJob) -> str:
    """``epoch 7``, or ``epoch 8, batch 30`` for a mid-epoch checkpoint (the epoch it was saved in)."""
    manifest = job.manifest
    if manifest.batch:
        return f"epoch {manifest.epoch + 1}, batch {manifest.batch}"
    return f"epoch {manifest.epoch}"


def _key(job: SaveJob) -> tuple[int, int]:
    return (job.manifest.epoch, job.manifest.step)


__all__ = ["WHEN_BEHIND", "Uploader", "check_when_behind"]
