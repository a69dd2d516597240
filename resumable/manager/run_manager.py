"""`RunManager`: one run folder as its writer and its readers see it, without Keras.

The Keras callback, `resume()` and the CLI all go through it. It is a reader (it *is* a
`run_reader.RunReader`: its reading methods are the manager's own) and, from the first write
on, a writer (`writer`: a `run_writer.RunWriter`, used directly):

- **reading**: the newest good checkpoint (`newest_good`), fetched and checked into a local
  cache (`fetch_newest`, `fetch`), or its big files still arriving while the caller loads the
  first of them (`arriving_newest`, `arrive`: `arrival.py`); what a resume learned (the
  checkpoint restored, the newer ones found damaged: `resumed_from`, `mark_damaged`);
- **writing** (`writer.`): the writer lease (`acquire`; the manager's `release`), a staging
  folder per checkpoint (`stage`), each save a job on the uploader's queue (`submit`: the
  commit chosen once, `commits`), the lease renewed right before each commit, a damaged newer
  checkpoint replaced, retention after each commit, the caller's `listener` told;
- **pruning**: `plan_pruning` + `writer.prune`, the one code path for the callback's retention
  and `resumable prune`.

A resume that only reads builds no writer: no Lease, no Uploader, no thread, nothing written to
the run folder. The writer is built the first time `writer` is read, and fences the storage
then, before any write.

What a checkpoint holds is the caller's business: the manager moves folders of files and
their manifests. The commit protocol itself lives in `resumable.storage.commit`.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from resumable.core.naming import DEFAULT_TEMPLATE
from resumable.core.policy import Retention
from resumable.manager.job_commit import JobCommit
from resumable.manager.listener import SaveListener
from resumable.manager.run_reader import PrunePlan, RunReader
from resumable.manager.run_writer import RunWriter, WriterOptions
from resumable.manager.uploader import check_when_behind
from resumable.storage import RunStorage
from resumable.storage.lease import DEFAULT_TIMEOUT, LeaseInfo, check_timeout

logger = logging.getLogger("resumable")


def _option(name: str, doc: str) -> Any:
    """A `WriterOptions` field as an attribute of the manager (read by the writer when used)."""
    return property(lambda self: getattr(self.options, name),
                    lambda self, value: setattr(self.options, name, value), doc=doc)


class RunManager(RunReader):
    """The reader of one run folder (a `RunReader`: its reading methods are the manager's own)
    and, built at its first write, its writer (`writer`, a `RunWriter`).

    Example:

    ```python
    manager = RunManager("gs://bucket/runs/exp1", retention=Retention(keep_last=3))
    manager.writer.acquire()                      # LeaseHeldError naming another live writer
    folder = manager.writer.stage("ckpt-000003")  # write the checkpoint's files here, then:
    manager.writer.submit(folder, "ckpt-000003", Manifest(epoch=3))  # uploads in the background
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
        storage = RunStorage(url, filename=filename, storage_options=storage_options)
        # checked now, as the writer built later would: a bad argument fails where it is given
        lease_timeout = check_timeout(lease_timeout)
        check_when_behind(when_behind)
        self.options = WriterOptions(retention=retention, lease_timeout=lease_timeout, takeover=takeover,
                                     async_upload=async_upload, verbose=verbose, when_behind=when_behind)
        super().__init__(storage, Path(staging_dir) if staging_dir else default_staging_dir(storage.url,
                                                                                         process_index),
                         verbose=verbose)
        self._writer: RunWriter | None = None  # built at the first write (`writer`)
        self._listener: SaveListener | None = None

    retention = _option("retention", "What to keep after each commit; None keeps everything.")
    takeover = _option("takeover", "`acquire` takes the lease even from a live holder.")
    async_upload = _option("async_upload", "Commit in a background thread (`submit` returns at once).")
    verbose = _option("verbose", "Progress bars and a line per wait.")

    def __repr__(self) -> str:
        held = self._writer is not None and self._writer.lease.held
        return f"RunManager({self.storage.url!r}, lease held={held})"

    @property
    def writer(self) -> RunWriter:
        """The run folder's writer, built on first use: the lease (the storage fenced by it from
        then on) and the uploader. Reading never builds it."""
        if self._writer is None:
            self._writer = RunWriter(self, self.options, listener=self._listener)
        return self._writer

    @property
    def listener(self) -> SaveListener | None:
        """Told of each commit and each checkpoint skipped (`listener.SaveListener`); None logs
        the skipped ones."""
        return self._listener

    @listener.setter
    def listener(self, listener: SaveListener | None) -> None:
        self._listener = listener
        if self._writer is not None:
            self._writer.listener = listener

    @property
    def job(self) -> JobCommit | None:
        """#36: set once every process of a multi-host job writes its part (`every_process_writes`)."""
        return self._writer.job if self._writer is not None else None

    # ------------------------------------------------------------------ the writer lease

    def check_lease(self) -> None:
        """LeaseLostError once a renewal found the lease taken over. Costs nothing."""
        if self._writer is not None:
            self._writer.lease.check()

    def release(self) -> None:
        """Give the writer lease back (uploads should have landed: see `finish`)."""
        if self._writer is not None:
            self._writer.lease.release()

    def blocking_writer(self) -> LeaseInfo | None:
        """Another live process that holds the lease (`acquire` would fail), or None. Reads only."""
        return None if self.takeover else super().blocking_writer()

    # ------------------------------------------------------------------ saving

    def discard(self, folder: Path) -> None:
        """Delete a staged folder that will not be submitted (a save that failed)."""
        shutil.rmtree(folder, ignore_errors=True)

    @property
    def writes_in_place(self) -> bool:
        """Whether `submit`'s ``write`` writes the files where they stay: in a local run, unless every
        process of a multi-host job uploads its part (#36), which each stages."""
        return self.storage.is_local and self.job is None

    @property
    def pending(self) -> list[str]:
        """Checkpoints staged and not committed yet."""
        return self._writer.uploader.pending if self._writer is not None else []

    def wait(self, timeout: float | None = None, *, message: bool | None = None) -> bool:
        """Block until the checkpoints submitted so far are committed; raises the newest one's failure.

        Returns False when ``timeout`` seconds passed first.
        """
        return self._writer.uploader.wait(timeout, message=message) if self._writer is not None else True

    def finish(self, *, quiet: bool = False) -> None:
        """After an error ended training: land the uploads, then give the lease back.

        Errors of the uploads become warnings (the error that ended training matters more). A
        KeyboardInterrupt while waiting keeps the lease held (and renewed): an upload may still
        be committing, and a second writer must not get in under it.
        """
        if self._writer is not None:
            self._writer.finish(quiet=quiet)

    # ------------------------------------------------------------------ what a resume learned

    # ------------------------------------------------------------------ retention and pruning

    # ------------------------------------------------------------------ reading


def default_staging_dir(url: str, process_index: int = 0) -> Path:
    """``<tempdir>/resumable-cache/<hash of the run URL>``: one local folder per run folder.

    Process N > 0 of a multi-process program gets ``<hash>-pN``: processes on one machine must
    not share their download cache.
    """
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    name = f"{digest}-p{process_index}" if process_index else digest
    return Path(tempfile.gettempdir()) / "resumable-cache" / name


__all__ = ["PrunePlan", "RunManager", "default_staging_dir"]
