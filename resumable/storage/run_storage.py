"""`RunStorage`: one run folder on any fsspec filesystem: commit, list, fetch, verify and delete checkpoints.

A facade over the parts that do the work, each in its own module:

- `folder.RunFolder`: the filesystem, paths, retries, error messages, reads and raw listings;
- `listing.Listing`: which checkpoints there are and in what state;
- `transfers.Transfers`: uploading, downloading and re-reading files;
- `commit.Committer`: the commit protocol (its docstring describes it) and deletes;
- `index_upkeep.IndexUpkeep`: the run index after commits and deletes;
- `run_files.RunFiles`: compare-and-swap on small files (the writer's lease).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from resumable.core.errors import CheckpointNotFoundError
from resumable.core.manifest import Manifest
from resumable.core.naming import DEFAULT_TEMPLATE, NameTemplate
from resumable.storage.commit import Committer
from resumable.storage.folder import RunFolder
from resumable.storage.index_upkeep import IndexUpkeep, remove_stray_copies
from resumable.storage.listing import Listing
from resumable.storage.records import CheckpointInfo, ListedFile, Status
from resumable.storage.retry import RetryPolicy
from resumable.storage.run_files import RunFiles
from resumable.storage.transfers import PROGRESS_MIN_BYTES, STREAM_MIN_BYTES, Transfers

__all__ = ["PROGRESS_MIN_BYTES", "STREAM_MIN_BYTES", "CheckpointInfo", "ListedFile", "RunStorage", "Status"]


class RunStorage:
    """A run folder of checkpoints behind any fsspec URL.

    Example:

    ```python
    storage = RunStorage("gs://my-bucket/runs/exp1")
    storage.commit("/tmp/stage/ckpt-000003", "ckpt-000003", Manifest(epoch=3))
    latest = storage.latest()            # newest checkpoint whose manifest and files agree
    storage.fetch(latest, "/tmp/cache")  # downloads and checks every CRC32C
    ```

    Args:
        url: A local folder, ``/content/drive/MyDrive/...``, ``gs://bucket/prefix``,
            ``memory://...`` or any other fsspec URL.
        filename: The folder name template, used to order checkpoints from one listing.
            Defaults to ``"ckpt-{epoch:06d}"``.
        retry: Backoff for transient errors. Defaults to ``RetryPolicy()``.
        storage_options: Passed to the fsspec filesystem (e.g. ``{"token": "anon"}``).
        truncate_before_delete: Empty files before deleting them, so Google Drive's trash
            does not keep counting them against the quota. Defaults to True under
            ``/content/drive/`` and False elsewhere.
    """

    def __init__(
        self,
        url: str,
        *,
        filename: str = DEFAULT_TEMPLATE,
        retry: RetryPolicy | None = None,
        storage_options: dict[str, Any] | None = None,
        truncate_before_delete: bool | None = None,
    ) -> None:
        folder = RunFolder(url, retry=retry, storage_options=storage_options,
                           truncate_before_delete=truncate_before_delete)
        self._folder = folder
        self._listing = Listing(folder, NameTemplate(filename))
        self._index_upkeep = IndexUpkeep(folder, self._listing.check_folders)
        self._transfers = Transfers(folder)
        # The parts a writer uses directly: the commit protocol's steps (`commit.Committer`: a
        # commit in place, a multi-host job's parts, the index deleted) and the small files
        # beside the checkpoints (`run_files.RunFiles`: the lease).
        self.committer = Committer(folder, self._listing, self._index_upkeep, self._transfers)
        self.run_files = RunFiles(folder)

    def __repr__(self) -> str:
        return f"RunStorage({self.url!r})"

    # ----------------------------------------------------------------- the folder

    @property
    def url(self) -> str:
        """The run folder's URL, without a trailing "/"."""
        return self._folder.url

    @property
    def root(self) -> str:
        """The run folder's path on `fs`."""
        return self._folder.root

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (replaceable, e.g. by a test's wrapper)."""
        return self._folder.fs

    @fs.setter
    def fs(self, fs: Any) -> None:
        self._folder.fs = fs

    @property
    def fence(self) -> Callable[[], None] | None:
        """Called right before each manifest write and each delete; raises to stop them.

        The writer sets its lease's `Lease.fence` here: once another process took the run over,
        this one commits and deletes nothing more.
        """
        return self.committer.fence

    @fence.setter
    def fence(self, fence: Callable[[], None] | None) -> None:
        self.committer.fence = fence

    @property
    def template(self) -> NameTemplate:
        """The folder name template that orders checkpoints by their names."""
        return self._listing.template

    @property
    def retry(self) -> RetryPolicy:
        return self._folder.retry

    @retry.setter
    def retry(self, retry: RetryPolicy) -> None:
        self._folder.retry = retry

    @property
    def is_local(self) -> bool:
        return self._folder.is_local

    @property
    def is_gcs(self) -> bool:
        return self._folder.is_gcs

    @property
    def truncate_before_delete(self) -> bool:
        return self._folder.truncate_before_delete

    @truncate_before_delete.setter
    def truncate_before_delete(self, truncate: bool) -> None:
        self._folder.truncate_before_delete = truncate

    # ----------------------------------------------------------------- reading

    def exists(self) -> bool:
        """True when the run folder exists (and on GCS, holds at least one object)."""
        return self._folder.exists()

    def list(self, *, check_files: bool = True) -> builtins.list[CheckpointInfo]:
        """Every checkpoint folder with its status, oldest first.

        With ``check_files`` (the default): one recursive listing, then every manifest read at
        once (concurrently where the filesystem supports it, as gcsfs does), and each file's
        size (and CRC32C on GCS) checked against its manifest. Without: one listing of the
        folder's names plus the run index, two requests whatever the number of checkpoints;
        folders missing from the index are checked as above. Such infos have
        ``checked=False``: their status says the manifest was committed, not that the files
        are still there (``verify`` re-reads them).
        """
        return self._listing.full() if check_files else self._listing.quick()

    def latest(self) -> CheckpointInfo | None:
        """The newest good checkpoint, or None. Costs one listing and one manifest read."""
        return next(self.newest_first(), None)

    def newest_first(self) -> Iterator[CheckpointInfo]:
        """Good checkpoints, newest first; manifests are read one at a time, as needed.

        Newer partial or corrupt checkpoints that are skipped are logged as warnings.
        """
        return self._listing.newest_first()

    def get(self, name: str) -> CheckpointInfo:
        """One checkpoint by folder name, with its status."""
        info = self._listing.get(name)
        if info is None:
            raise CheckpointNotFoundError(
                f"{self._folder.url_of(name)}: no such checkpoint; see `resumable list {self.url}`"
            )
        return info

    def fetch(
        self, checkpoint: CheckpointInfo | str, local_dir: str | Path, *, progress: bool = False,
        landed: Callable[[str], None] | None = None, last: Sequence[str] = (),
    ) -> Path:
        """Download a checkpoint into ``local_dir`` and check every file's size and CRC32C.

        Files already in ``local_dir`` with the right checksum are not downloaded again.
        Raises CorruptCheckpointError if a file disagrees with the manifest. ``progress`` shows
        a tqdm bar with the throughput for files of ``PROGRESS_MIN_BYTES`` or more.
        ``landed(rel)`` is called as each file is in place and checked; the files named in
        ``last`` come after the others, in that order (a loader can start on them).
        """
        return self._transfers.fetch(self._info(checkpoint), local_dir, progress=progress, landed=landed,
                                     last=last)

    def checked_in_place(self, checkpoint: CheckpointInfo | str) -> Path:
        """A local run's checkpoint folder, to load from where it is, once every file checked out.

        Only for local folders and Drive mounts (`is_local`); raises CorruptCheckpointError if a
        file disagrees with the manifest.
        """
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local folder: fetch() its checkpoints")
        return self._transfers.checked_in_place(self._info(checkpoint))

    def verify(self, checkpoint: CheckpointInfo | str) -> builtins.list[str]:
        """Re-read every file of a checkpoint; return one line per problem (empty if good)."""
        return self._transfers.verify(self._info(checkpoint))

    # ----------------------------------------------------------------- writing

    def commit(self, local_dir: str | Path, name: str, manifest: Manifest, *,
               progress: bool = False, between_chunks: Callable[[], None] | None = None) -> CheckpointInfo:
        """Copy the files under ``local_dir`` into folder ``name``, then write the manifest.

        The manifest records each file's size and CRC32C and is written last, create-only:
        a committed checkpoint is never overwritten (CheckpointExistsError). Leftovers of an
        interrupted commit under the same name are removed first. Files are streamed in
        chunks and checksummed as they are sent, never read whole into memory. ``progress``
        shows a tqdm bar with the throughput for files of ``PROGRESS_MIN_BYTES`` or more.
        ``between_chunks`` is called before each chunk is sent (background uploads wait
        there while the next checkpoint is being serialized; see `Uploader.paused`).
        See `resumable.storage.commit` for the protocol.
        """
        return self.committer.commit(local_dir, name, manifest, progress=progress,
                                      between_chunks=between_chunks)

    def delete(self, checkpoint: CheckpointInfo | str) -> None:
        """Delete a checkpoint folder: the manifest first, so a half-done delete reads as partial."""
        self.committer.delete(checkpoint if isinstance(checkpoint, str) else checkpoint.name)

    def delete_many(self, checkpoints: Sequence[CheckpointInfo | str]) -> Iterator[str]:
        """Delete checkpoint folders in turn, yielding each name once it is gone.

        The run index loses them all in one write, first; the files of an info from a full
        listing (``checked``) are the ones it listed, others' folders are listed afresh.
        Costs one delete and one lease check (`fence`) per file, whatever the
        run's length. See `Committer.delete_listed`.
        """
        listed: dict[str, dict[str, ListedFile]] = {}
        for checkpoint in checkpoints:
            if isinstance(checkpoint, str):
                listed[checkpoint] = {}
            else:
                listed[checkpoint.name] = dict(checkpoint.listed) if checkpoint.checked else {}
        return self.committer.delete_listed(listed)

    def remove_stray_index_copies(self) -> builtins.list[str]:
        """Delete what writers gone from this machine left of their index writes in a local run
        folder (``index.json.<pid>.tmp``); the names deleted. For a writer that holds the lease."""
        return remove_stray_copies(self._folder)

    def _info(self, checkpoint: CheckpointInfo | str) -> CheckpointInfo:
        return self.get(checkpoint) if isinstance(checkpoint, str) else checkpoint
