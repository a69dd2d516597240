"""`RunManager`: one run folder as its writer and its readers see it, without Keras.

The Keras callback, `resume()` and the CLI all go through it:

- **writing**: the writer lease (`acquire`, `release`), a staging folder per checkpoint
  (`stage`), background or immediate commits (`submit`), the lease renewed right before each
  commit, a damaged newer checkpoint replaced, retention after each commit;
- **reading**: the newest good checkpoint (`newest_good`), fetched and checked into a local
  cache (`fetch_newest`, `fetch`), or its big files still arriving while the caller loads the
  first of them (`arriving_newest`, `arrive`: `arrival.py`);
- **pruning**: `plan_pruning` + `prune`, the one code path for the callback's retention and
  `resumable prune`.

What a checkpoint holds is the caller's business: the manager moves folders of files and
their manifests. The commit protocol itself lives in `resumable.storage.commit`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from resumable.core.display import printable
from resumable.core.errors import (
    CheckpointExistsError,
    CorruptCheckpointError,
    LeaseHeldError,
    LeaseLostError,
    ResumableError,
)
from resumable.core.manifest import FileEntry, Manifest
from resumable.core.naming import DEFAULT_TEMPLATE, check_name
from resumable.core.policy import Decision, Retention, plan
from resumable.manager.arrival import Arrival
from resumable.manager.background import wait_at_exit
from resumable.manager.job_commit import DEFAULT_BARRIER_TIMEOUT, JobChannel, JobCommit
from resumable.manager.uploader import Uploader
from resumable.storage import CheckpointInfo, RunStorage
from resumable.storage.lease import DEFAULT_TIMEOUT, LEASE_NAME, Lease, LeaseInfo, read_lease

logger = logging.getLogger("resumable")

T = TypeVar("T")


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


class RunManager:
    """The writer and reader of one run folder: lease, staging, uploads, commits, retention, fetching.

    Example:

    ```python
    manager = RunManager("gs://bucket/runs/exp1", retention=Retention(keep_last=3))
    manager.acquire()                         # LeaseHeldError naming another live writer
    folder = manager.stage("ckpt-000003")     # write the checkpoint's files here, then:
    manager.submit(folder, "ckpt-000003", Manifest(epoch=3))  # uploads in the background
    manager.release()                         # lands the uploads, gives the lease back
    ```

    Args:
        url: The run folder (local, a Google Drive mount, ``gs://bucket/prefix``, any fsspec URL).
        filename: The checkpoint folder name template. Defaults to ``"ckpt-{epoch:06d}"``.
        storage_options: Passed to the fsspec filesystem. Defaults to None.
        staging_dir: Local folder for staging and the download cache. Defaults to
            `default_staging_dir` of the URL.
        retention: What to keep after each commit; None keeps everything. Defaults to None.
        lease_timeout: Seconds without renewal after which the lease is stale. Defaults to 40.
        takeover: `acquire` takes the lease even from a live holder. Defaults to False.
        async_upload: Commit in a background thread (`submit` returns at once). Defaults to True.
        verbose: Progress bars and a line per wait. Defaults to False.
        process_index: This process' index in a multi-process program (its own staging folder).
            Defaults to 0.
        when_behind: What a save does while the previous one still waits for its upload:
            ``"skip"`` replaces it (one line says so), ``"wait"`` waits for it. Defaults to "skip".
    """

    def __init__(
        self,
        url: str,
        *,
        filename: str = DEFAULT_TEMPLATE,
        storage_options: dict[str, Any] | None = None,
        staging_dir: str | Path | None = None,
        retention: Retention | None = None,
        lease_timeout: float = DEFAULT_TIMEOUT,
        takeover: bool = False,
        async_upload: bool = True,
        verbose: bool = False,
        process_index: int = 0,
        when_behind: str = "skip",
    ) -> None:
        self.storage = RunStorage(url, filename=filename, storage_options=storage_options)
        self.staging_dir = Path(staging_dir) if staging_dir else default_staging_dir(self.storage.url,
                                                                                     process_index)
        self.retention = retention
        self.takeover = takeover
        self.async_upload = async_upload
        self.verbose = verbose
        # One writer per run folder; at interpreter exit the last uploads land before it is released.
        self.lease = Lease(self.storage, timeout=lease_timeout, before_exit=self._finish_uploads_at_exit)
        self.storage.fence = self.lease.fence  # every manifest write and delete checks it afresh
        # The newest committed checkpoint's files stay in staging_dir/committed until the next
        # save: a local copy to recover by hand; resume() reads the run folder's copy.
        self.uploader = Uploader(self.storage, commit=self._commit, on_commit=self._committed,
                                 cache_dir=self.staging_dir / "committed", verbose=verbose,
                                 when_behind=when_behind, on_skipped=self._skipped)
        self.last_checkpoint: CheckpointInfo | None = None
        self.damaged: set[str] = set()  # newer checkpoints found corrupt when resuming: replaceable
        # those of them whose files check out but a caller's check refused (fetch_newest's ``check``)
        self._refused_by: dict[str, Callable[[Path, str], object]] = {}
        self.on_commit: Callable[[CheckpointInfo], None] | None = None  # after each commit (callback)
        self.on_skipped: Callable[[str], None] | None = None  # the line saying a checkpoint was skipped
        self.job: JobCommit | None = None  # #36: set when every process of a multi-host job writes its part

    def __repr__(self) -> str:
        return f"RunManager({self.storage.url!r}, lease held={self.lease.held})"

    @property
    def url(self) -> str:
        return self.storage.url

    # ------------------------------------------------------------------ the writer lease

    def acquire(self) -> None:
        """Become the run folder's only writer (LeaseHeldError naming the holder), renewed until `release`."""
        self.lease.acquire(takeover=self.takeover)
        self.lease.start_renewing()

    def check_lease(self) -> None:
        """LeaseLostError once a renewal found the lease taken over. Costs nothing."""
        self.lease.check()

    def release(self) -> None:
        """Give the writer lease back (uploads should have landed: see `finish`)."""
        self.lease.release()

    def blocking_writer(self) -> LeaseInfo | None:
        """Another live process that holds the lease (`acquire` would fail), or None. Reads only."""
        if self.takeover:
            return None
        try:
            holder = read_lease(self.storage)
        except ResumableError:
            return None  # reading the checkpoints will say what is wrong with the folder
        if holder is None or holder.mine():
            return None
        try:  # GCS' own clock says how long the lease has been silent; the holder's may be off
            server_age = self.storage.run_file_server_age(LEASE_NAME)
        except ResumableError:
            server_age = None
        return holder if holder.blocks(server_age) else None

    @contextlib.contextmanager
    def writing(self, *, force: bool = False) -> Iterator[LeaseInfo | None]:
        """Hold the lease for a one-off change such as pruning.

        Yields None while holding it. Another live writer raises LeaseHeldError; with ``force``
        the body runs anyway, without taking that writer's lease, and gets its holder.
        """
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

    # ------------------------------------------------------------------ saving

    def every_process_writes(self, channel: JobChannel, timeout: float = DEFAULT_BARRIER_TIMEOUT) -> None:
        """#36: a multi-host job whose variables no one process holds whole: from now on every
        process uploads its own files of each checkpoint and process 0 commits them
        (`job_commit.JobCommit`). The processes must agree on which checkpoints they commit: none
        is skipped (when_behind='wait'), and one that failed is dropped on every process, never
        tried again."""
        if self.job is None:
            self.job = JobCommit(self.storage, channel, timeout=timeout, prepare=self._prepare_job_commit,
                                 token=lambda: self.lease.info.token if self.lease.info is not None else None)
            self.uploader.when_behind = "wait"
            self.uploader.retry_failed = False

    def check_continues(self, restored: str | None, step: int) -> int | None:
        """Refuse to mix a new training run into a folder that already holds one.

        ``restored``: the checkpoint this run resumed from; ``step``: the model's optimizer
        step now. Returns the epochs done when the model was restored by hand from the latest
        checkpoint (same step), else None. Raises CheckpointExistsError otherwise.
        """
        latest = self.newest_good()
        if latest is None or latest.name == restored:
            return None
        if self.last_checkpoint is not None and latest.name == self.last_checkpoint.name:
            return None  # a second fit in the same session
        if restored is None and latest.step == step and latest.step:
            return latest.epoch or 0  # the user restored this model themselves; continue from it
        if restored is not None:
            raise CheckpointExistsError(
                f"{latest.url} is newer than the checkpoint this run resumed from ({restored}): "
                "another process is training into this folder; stop it, then call resumable.resume() again"
            )
        raise CheckpointExistsError(
            f"{self.url} already holds a run (latest {latest.name}, {latest.epoch} epochs); "
            "continue it with `run = resumable.resume(filepath, build_model=...)` and `run.fit(...)`, "
            "or write to a new folder"
        )

    def stage(self, name: str, *, drop_cached: bool = True) -> Path:
        """An empty local folder to write checkpoint ``name`` into before `submit`.

        Waits for an upload of the same name still in flight (a re-run epoch) and deletes the
        local copy of the last committed checkpoint first (this save replaces it), unless
        ``drop_cached`` is False: a `submit` with ``write`` deletes it in the uploader's thread,
        before writing, so that training does not wait for that delete either.
        """
        self.lease.check()
        if self.uploader.in_progress(name):
            self.uploader.wait()  # never rewrite files in flight
        folder = self.staging_dir / "staging" / name
        shutil.rmtree(folder, ignore_errors=True)
        if drop_cached:
            self.uploader.drop_cached()
        return folder

    def discard(self, folder: Path) -> None:
        """Delete a staged folder that will not be submitted (a save that failed)."""
        shutil.rmtree(folder, ignore_errors=True)

    def serializing(self) -> contextlib.AbstractContextManager[None]:
        """Hold the upload in flight while the caller writes a staged folder (what training waits for)."""
        return self.uploader.paused()

    def submit(self, folder: Path, name: str, manifest: Manifest, *,
               write: Callable[[Path, str | None], dict[str, FileEntry]] | None = None) -> None:
        """Commit a staged folder as ``name``: in the background, or now with ``async_upload=False``.

        ``write(folder, root)``: writes the files first, in the uploader's thread when in the
        background (a checkpoint held in memory: training does not wait for its files), and
        returns each one's size and CRC32C as written. In a local run (Drive's mount included)
        it writes them straight into the checkpoint's folder in the run (``root``), and the
        commit only syncs them and writes the manifest (`writes_in_place`); elsewhere, and for
        a process's part of a multi-host job's checkpoint, into ``folder``, uploaded next.
        """
        in_place = None
        if self.job is not None:  # #36: a failed write is said in the job's round, never skipped alone
            write = self.job.writer(folder, write)
        elif write is not None and self.writes_in_place:
            in_place = functools.partial(self._commit_in_place, name, manifest, write)
        if self.async_upload:
            self.uploader.submit(folder, name, manifest, write=write, in_place=in_place)
        else:
            self.uploader.commit_now(folder, name, manifest, write=write, in_place=in_place)

    @property
    def writes_in_place(self) -> bool:
        """Whether `submit`'s ``write`` writes the files where they stay: in a local run, unless every
        process of a multi-host job uploads its part (#36), which each stages."""
        return self.storage.is_local and self.job is None

    @property
    def pending(self) -> list[str]:
        """Checkpoints staged and not committed yet."""
        return self.uploader.pending

    def wait(self, timeout: float | None = None, *, message: bool | None = None) -> bool:
        """Block until the checkpoints submitted so far are committed; raises the newest one's failure.

        Returns False when ``timeout`` seconds passed first.
        """
        return self.uploader.wait(timeout, message=message)

    def finish(self, *, quiet: bool = False) -> None:
        """After an error ended training: land the uploads, then give the lease back.

        Errors of the uploads become warnings (the error that ended training matters more). A
        KeyboardInterrupt while waiting keeps the lease held (and renewed): an upload may still
        be committing, and a second writer must not get in under it.
        """
        try:
            self.uploader.wait(message=False if quiet else None)
        except LeaseLostError as e:  # training raises it (or did): said there, once
            logger.info("resumable: %s", e)
        except Exception as e:  # noqa: BLE001 - the error that ended training matters more
            logger.warning("resumable: %s", e)
        except KeyboardInterrupt:
            logger.warning("resumable: stopped waiting for the uploads; the writer lease of %s stays held",
                           self.url)
            raise
        self.release()

    @staticmethod
    def _finish_uploads_at_exit() -> None:
        """The lease's exit hook runs before the workers' one: the uploads land before it is released.
        It is the workers' exit hook itself, run once, whichever hook comes first."""
        wait_at_exit()

    def _commit(self, staging: Path, name: str, manifest: Manifest) -> CheckpointInfo:
        self._renew_before_commit(name)
        if self.job is not None:  # #36: every process uploads its part, process 0 commits
            return self.job.commit(staging, name, manifest, progress=self.verbose,
                                   between_chunks=self._between_chunks)
        return self._replacing_damaged(name, lambda: self._commit_files(staging, name, manifest))

    def _commit_in_place(self, name: str, manifest: Manifest,
                         write: Callable[[Path, str | None], dict[str, FileEntry]]) -> CheckpointInfo:
        """Write a checkpoint's files straight into its folder in a local run, then commit them."""
        self._renew_before_commit(name)
        target = Path(self._replacing_damaged(name, lambda: self.storage.begin_in_place(name)))
        try:
            written = write(target, self.storage.root)
        except BaseException:
            with contextlib.suppress(ResumableError, OSError):  # a partial folder only holds space
                self.storage.delete(name)
            raise
        return self.storage.commit_in_place(name, manifest, written)

    def _renew_before_commit(self, name: str) -> None:
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
        self._replacing_damaged(name, lambda: self.storage.prepare_commit(name))

    def _replacing_damaged(self, name: str, begin: Callable[[], T]) -> T:
        """``begin()`` (the commit, or its first step); a checkpoint of that name resume() found
        damaged, and still is, is deleted first (only those may be replaced)."""
        try:
            return begin()
        except CheckpointExistsError:
            if name not in self.damaged or not self._still_damaged(name):
                raise
        logger.warning("resumable: replacing damaged checkpoint %s", name)
        self.storage.delete(name)
        self.damaged.discard(name)
        return begin()

    def _still_damaged(self, name: str) -> bool:
        """Whether checkpoint ``name``, found damaged when resuming, still is: its files, or the
        check of the caller that refused it (another process may have replaced it since)."""
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

    def _commit_files(self, staging: Path, name: str, manifest: Manifest) -> CheckpointInfo:
        return self.storage.commit(staging, name, manifest, progress=self.verbose,
                                   between_chunks=self._between_chunks)

    def _between_chunks(self) -> None:
        """Before each chunk of an upload: stop once a renewal found the run taken over."""
        self.lease.check()
        self.uploader.between_chunks()

    def _skipped(self, line: str) -> None:
        """A checkpoint replaced while it waited for its upload: the callback prints the line."""
        if self.on_skipped is not None:
            self.on_skipped(line)
        else:
            logger.warning("%s", line)

    def resumed_from(self, checkpoint: CheckpointInfo | None, damaged: set[str]) -> None:
        """A resume restored ``checkpoint`` (None: nothing): it is the run's last checkpoint, and
        the newer ones in ``damaged`` may be replaced by training's commits."""
        self.last_checkpoint = checkpoint
        self.damaged = set(damaged)

    def mark_damaged(self, name: str) -> None:
        """Checkpoint ``name`` failed a check when resuming: passed over, and replaceable."""
        self.damaged.add(name)

    def _committed(self, info: CheckpointInfo) -> None:
        """After each commit, in the uploader's thread when uploading in the background."""
        self.last_checkpoint = info
        logger.info("resumable: saved %s", info.url)
        if self.job is not None and not self.job.chief:
            return  # #36: process 0 alone applies retention and reports commits
        self.apply_retention()
        if self.on_commit is not None:
            self.on_commit(info)

    # ------------------------------------------------------------------ retention and pruning

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

    def prune(self, doomed: Sequence[CheckpointInfo], *, progress: Callable[[Sequence[CheckpointInfo]],
              Iterable[CheckpointInfo]] | None = None, tolerant: bool = False) -> list[str]:
        """Delete checkpoints a `PrunePlan` dooms; the caller holds the lease (`acquire`, `writing`).

        Never deletes once the lease was taken over. ``tolerant``: a failed delete is a warning
        (it only costs space; training goes on) instead of an error. Returns the names deleted.
        """
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
        """Delete every checkpoint, then the run index (BackupAndRestore's ``delete_checkpoint``).

        Each delete goes through the storage's fenced path: the lease is read afresh first, and
        nothing is deleted once another process took the run over. A local run folder left
        empty is removed too (files of others in it are let be).
        """
        for info in self.storage.list(check_files=False):
            self.storage.delete(info)
        self.last_checkpoint = None
        self.storage.delete_index()
        if self.storage.is_local:
            with contextlib.suppress(OSError):
                os.rmdir(self.storage.root)  # only when empty

    def apply_retention(self) -> None:
        """After a commit: delete what ``retention`` drops, never the checkpoint just committed."""
        if self.retention is None or self.lease.lost:
            return  # after a takeover the run is another process's: never delete its checkpoints
        protect = [self.last_checkpoint.name] if self.last_checkpoint else []
        try:
            pruning = self.plan_pruning(self.retention, protect=protect)
        except ResumableError as e:
            logger.warning("resumable: retention skipped: %s", e)
            return
        with contextlib.suppress(LeaseLostError):
            self.prune(pruning.doomed, tolerant=True)

    # ------------------------------------------------------------------ reading

    def newest_first(self) -> Iterator[CheckpointInfo]:
        """Good checkpoints, newest first (skipped newer damaged ones are logged)."""
        return self.storage.newest_first()

    def newest_good(self) -> CheckpointInfo | None:
        """The newest good checkpoint that resuming did not find damaged."""
        return next((c for c in self.storage.newest_first() if c.name not in self.damaged), None)

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
        the caller adds the name to `damaged` and asks again.
        """
        for info in self.storage.newest_first():
            if info.name in self.damaged:
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
                self.damaged.add(info.name)
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
                    self.damaged.add(info.name)
        return None

    def keep_only_cached(self, name: str) -> None:
        """The cache holds one checkpoint: the one restored (a later resume reuses its files)."""
        if self.cache_root.is_dir():
            for child in self.cache_root.iterdir():
                if child.name != name:
                    shutil.rmtree(child, ignore_errors=True)


def default_staging_dir(url: str, process_index: int = 0) -> Path:
    """``<tempdir>/resumable-cache/<hash of the run URL>``: one local folder per run folder.

    Process N > 0 of a multi-process program gets ``<hash>-pN``: processes on one machine must
    not share their download cache.
    """
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    name = f"{digest}-p{process_index}" if process_index else digest
    return Path(tempfile.gettempdir()) / "resumable-cache" / name


__all__ = ["PrunePlan", "RunManager", "default_staging_dir"]
