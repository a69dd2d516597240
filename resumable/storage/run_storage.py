"""One run folder on any fsspec filesystem: commit, list, fetch, verify and delete checkpoints.

Layout of a run folder (local, a Google Drive mount, ``gs://bucket/prefix`` or ``memory://``)::

    <run>/ckpt-000003/model.keras
    <run>/ckpt-000003/state.json
    <run>/ckpt-000003/manifest.json     <- written last: its presence commits the checkpoint
    <run>/index.json                    <- what `list` shows of each manifest: a two-request `list`

Nothing is renamed and nothing is rewritten in place: GCS has no atomic rename and renames on
Drive's FUSE mount are unreliable. A folder without a manifest is an interrupted commit
("partial"); a manifest that disagrees with the files it lists makes it "corrupt". Neither
is ever used as the latest checkpoint.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import gc
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from functools import cached_property
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from resumable.core.checksum import (
    CHUNK_SIZE,
    RunningCrc32c,
    crc32c_from_gcs,
    crc32c_of_chunks,
    crc32c_of_file,
)
from resumable.core.display import human_size
from resumable.core.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NoSpaceError,
    NotAFolderError,
    ResumableError,
    StorageError,
    UnsupportedFormatError,
)
from resumable.core.manifest import MANIFEST_NAME, FileEntry, Manifest, now_iso
from resumable.core.naming import DEFAULT_TEMPLATE, NameTemplate, check_name
from resumable.storage import gcs_listing, gcs_upload, run_index
from resumable.storage.errors import BoundedRequest, free_space, translate
from resumable.storage.local_files import fsync
from resumable.storage.retry import RetryPolicy
from resumable.storage.run_files import RunFiles

# gcsfs 2026.x probes every bucket over gRPC first, which stalls about a minute against
# emulators; we use none of what that probe enables. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import fsspec  # noqa: E402  (after the environment default above)

logger = logging.getLogger("resumable")

READ_THREADS = 16  # manifests read at once from a blocking filesystem (local disk, Drive)
PROGRESS_MIN_BYTES = 4 * 1024 * 1024  # files at least this big get a progress bar when asked
UPLOAD_BLOCK = 50 * 2**20  # bytes per GCS upload request, as gcsfs' put_file sends them
STREAM_MIN_BYTES = 8 * 2**20  # GCS files this big go up as one streamed request (see gcs_upload)
QUICK_FALLBACK_FOLDERS = 8  # more folders missing from the run index: one recursive listing instead

DRIVE_MOUNT = "/content/drive/"

_new_object, _set_attribute = object.__new__, object.__setattr__  # see `_indexed_info`
_first = itemgetter(0)
_epoch_step_name = attrgetter("epoch", "step", "name")  # `RunStorage._order` of infos with manifests


class Status(str, Enum):
    """Whether a checkpoint can be restored."""

    OK = "ok"
    PARTIAL = "partial"  # no manifest: a commit that never finished
    CORRUPT = "corrupt"  # a manifest that is unreadable or disagrees with the files

    def __str__(self) -> str:
        return self.value


_OK = Status.OK  # a module constant: looking a member up on an Enum class is 5x as slow


class ListedFile(NamedTuple):  # a tuple, not a dataclass: `list` makes thousands, twice as fast
    """A file as a listing shows it."""

    size: int
    crc32c: str | None  # only where the listing carries it (GCS)
    modified: datetime | None


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint folder as found in the run folder."""

    name: str
    url: str
    status: Status
    manifest: Manifest | None = None
    problem: str = ""
    listed: dict[str, ListedFile] = field(default_factory=dict, repr=False)
    # False when the status and ``listed`` come from the run index, not from a listing of the folder
    checked: bool = True

    @property
    def ok(self) -> bool:
        return self.status is _OK  # `list` asks several times per checkpoint

    @property
    def epoch(self) -> int | None:
        return self.manifest.epoch if self.manifest else None

    @property
    def step(self) -> int | None:
        return self.manifest.step if self.manifest else None

    @property
    def metrics(self) -> dict[str, float]:
        """The manifest's metrics (not a copy: listing many checkpoints reads them often)."""
        return self.manifest.metrics if self.manifest else {}

    @cached_property  # listings sum it for every row and for the total
    def size(self) -> int:
        """Bytes stored in the folder now (as the run index records them when not ``checked``)."""
        return sum(f.size for f in self.listed.values())

    @property
    def created(self) -> datetime | None:
        recorded = self.manifest.created_at if self.manifest else None
        if recorded:
            return recorded
        times = [f.modified for f in self.listed.values() if f.modified]
        return max(times) if times else None

    @property
    def created_iso(self) -> str | None:
        """`created` as text: the manifest's ISO 8601 string as recorded (UTC), when it has one."""
        if self.manifest and self.manifest.created:
            return self.manifest.created
        moment = self.created
        return moment.isoformat() if moment else None


class _IndexedInfo(CheckpointInfo):
    """A good checkpoint as a row of the run index vouches for it (``checked=False``).

    Its fields read as those of ``CheckpointInfo(name, url, Status.OK, manifest,
    listed=recorded, checked=False)`` (``==`` compares only infos of one class), but its
    manifest and files are built when first asked for: `resumable list` shows thousands of
    rows and needs neither. `_indexed_info` puts the row's epoch, step, metrics, time and size
    in the instance's ``__dict__``, where reading them costs no call; the cached properties
    below only serve a `dataclasses.replace` copy, which has no row and answers from its
    fields. `run_index.listing` checked the row, so building the manifest cannot fail.
    """

    _row: run_index.Row | None = None  # set by `_indexed_info`; a copy has none
    # the same for every indexed info; a copy's own fields, in its `__dict__`, win
    status = _OK
    problem = ""
    checked = False

    @cached_property
    def manifest(self) -> Manifest:
        assert self._row is not None  # a copy has its manifest among its fields
        return run_index.manifest_of_row(self._row)

    @cached_property
    def listed(self) -> dict[str, ListedFile]:
        assert self._row is not None
        files = self.manifest.files
        listed = {rel: ListedFile(entry.size, entry.crc32c, None) for rel, entry in files.items()}
        listed[MANIFEST_NAME] = ListedFile(self._row[5], None, None)
        return listed

    # Cached properties are non-data descriptors: the values in the ``__dict__`` win.
    @cached_property
    def ok(self) -> bool:
        return super().ok

    @cached_property
    def epoch(self) -> int | None:
        return super().epoch

    @cached_property
    def step(self) -> int | None:
        return super().step

    @cached_property
    def metrics(self) -> dict[str, float]:
        return super().metrics

    @cached_property
    def created_iso(self) -> str | None:
        return super().created_iso

    @cached_property
    def created(self) -> datetime | None:
        if self._row is None:
            return super().created
        try:
            return datetime.fromisoformat(self._row[4])  # as Manifest.created_at, without building it
        except ValueError:
            return None


class RunStorage(RunFiles):
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
        url = os.fspath(url)
        if not url:
            raise ResumableError("the run folder URL is empty; pass a folder or gs://bucket/prefix")
        self.url = url.rstrip("/") or url
        self.template = NameTemplate(filename)
        self.retry = retry or RetryPolicy()
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        except Exception as e:
            if type(e).__module__.startswith("google.auth"):  # gcsfs loads credentials here
                # no filesystem yet: only the credentials branch of translate() applies
                raise translate(e, self.url, self.url, self.url, is_gcs=True, is_local=False) from e
            if isinstance(e, (ImportError, ValueError)):
                raise ResumableError(f"{self.url}: cannot open this URL ({e})") from e
            raise
        self.root = root.rstrip("/") or root
        self.is_local = _is_local(self.fs)
        self.is_gcs = "gs" in _protocols(self.fs)
        self._credentials_checked = not self.is_gcs
        self._index_mended = False  # see `_update_index`
        self.truncate_before_delete = (
            truncate_before_delete
            if truncate_before_delete is not None
            else self.is_local and os.path.abspath(self.root).startswith(DRIVE_MOUNT)
        )

    def __repr__(self) -> str:
        return f"RunStorage({self.url!r})"

    # ----------------------------------------------------------------- reading

    def exists(self) -> bool:
        """True when the run folder exists (and on GCS, holds at least one object)."""
        with self._errors(self.url):
            if self.is_local:
                if os.path.isfile(self.root):
                    raise NotAFolderError(f"{self.url} is a file, not a run folder")
                return os.path.isdir(self.root)
            return bool(self._list_files()) or self._call(lambda: self.fs.isdir(self.root), "stat")

    def list(self, *, check_files: bool = True) -> list[CheckpointInfo]:
        """Every checkpoint folder with its status, oldest first.

        With ``check_files`` (the default): one recursive listing, then every manifest read at
        once (concurrently where the filesystem supports it, as gcsfs does), and each file's
        size (and CRC32C on GCS) checked against its manifest. Without: one listing of the
        folder's names plus the run index, two requests whatever the number of checkpoints;
        folders missing from the index are checked as above. Such infos have
        ``checked=False``: their status says the manifest was committed, not that the files
        are still there (``verify`` re-reads them).
        """
        if not check_files:
            return self._quick_list()
        listing = self._listing()
        names = sorted(listing)
        paths = [self._path(name, MANIFEST_NAME) for name in names if MANIFEST_NAME in listing[name]]
        blobs = self._read_many(paths)
        infos = [self._info(name, listing[name], blobs.get(self._path(name, MANIFEST_NAME)))
                 for name in names]
        return sorted(infos, key=self._order)

    def latest(self) -> CheckpointInfo | None:
        """The newest good checkpoint, or None. Costs one listing and one manifest read."""
        return next(self.newest_first(), None)

    def newest_first(self) -> Iterator[CheckpointInfo]:
        """Good checkpoints, newest first; manifests are read one at a time, as needed.

        Newer partial or corrupt checkpoints that are skipped are logged as warnings.
        """
        listing = self._listing()
        committed = [name for name, files in listing.items() if MANIFEST_NAME in files]
        keys: dict[str, tuple[int, int]] = {}
        unparsed = []
        for name in committed:
            key = self.template.parse(name)
            if key is None:
                unparsed.append(name)
            else:
                keys[name] = key
        infos: dict[str, CheckpointInfo] = {}
        if unparsed:  # folders written with another template: order them by their manifests
            blobs = self._read_many([self._path(name, MANIFEST_NAME) for name in unparsed])
            for name in unparsed:
                info = self._info(name, listing[name], blobs.get(self._path(name, MANIFEST_NAME)))
                infos[name] = info
                keys[name] = (info.manifest.epoch, info.manifest.step) if info.manifest else (-1, -1)
        ordered = sorted(committed, key=lambda n: (keys[n], n), reverse=True)
        newest = keys[ordered[0]] if ordered else None
        for name in _partial_newer_than(listing, newest, self.template):
            logger.warning("resumable: ignoring %s: no manifest (an interrupted save)", self._url(name))
        for name in ordered:
            found = infos.get(name)
            if found is None:
                found = self._info(name, listing[name], self._read(self._path(name, MANIFEST_NAME)))
            info = found
            if info.ok:
                yield info
            else:
                logger.warning("resumable: skipping %s: %s", info.url, info.problem)

    def get(self, name: str) -> CheckpointInfo:
        """One checkpoint by folder name, with its status."""
        files = self._listing(self._path(name)).get(name)
        if not files:
            self._list_files()  # raises NotAFolderError if the run folder is a file
            raise CheckpointNotFoundError(
                f"{self._url(name)}: no such checkpoint; see `resumable list {self.url}`"
            )
        blob = self._read(self._path(name, MANIFEST_NAME)) if MANIFEST_NAME in files else None
        return self._info(name, files, blob)

    def fetch(
        self, checkpoint: CheckpointInfo | str, local_dir: str | Path, *, progress: bool = False
    ) -> Path:
        """Download a checkpoint into ``local_dir`` and check every file's size and CRC32C.

        Files already in ``local_dir`` with the right checksum are not downloaded again.
        Raises CorruptCheckpointError if a file disagrees with the manifest. ``progress`` shows
        a tqdm bar with the throughput for files of ``PROGRESS_MIN_BYTES`` or more.
        """
        info = self.get(checkpoint) if isinstance(checkpoint, str) else checkpoint
        manifest = _require_manifest(info)
        target = Path(local_dir)
        target.mkdir(parents=True, exist_ok=True)
        for rel, entry in manifest.files.items():
            local = target / rel
            if local.is_file() and FileEntry(local.stat().st_size, crc32c_of_file(local)) == entry:
                continue  # already in the cache
            local.parent.mkdir(parents=True, exist_ok=True)
            partial = local.with_name(local.name + ".part")
            remote = self._path(info.name, rel)
            with self._errors(self._url(info.name, rel)):
                what = f"download {rel}"
                self._call(lambda r=remote, p=str(partial), n=entry.size, w=what: self._transfer(
                    self.fs.get_file, r, p, n, progress, w), what)
            actual = FileEntry(partial.stat().st_size, crc32c_of_file(partial))
            if actual != entry:
                partial.unlink()
                raise CorruptCheckpointError(
                    f"{self._url(info.name, rel)}: {_mismatch(entry, actual)}; "
                    "the checkpoint is damaged, an older one will be used"
                )
            os.replace(partial, local)
        (target / MANIFEST_NAME).write_bytes(manifest.to_json())
        return target

    def verify(self, checkpoint: CheckpointInfo | str) -> builtins.list[str]:
        """Re-read every file of a checkpoint; return one line per problem (empty if good)."""
        info = self.get(checkpoint) if isinstance(checkpoint, str) else checkpoint
        if info.manifest is None:
            return [f"{info.url}: {info.problem}"]
        problems = []
        for rel, entry in info.manifest.files.items():
            url = self._url(info.name, rel)
            if rel not in info.listed:
                problems.append(f"{url}: missing")
                continue
            path = self._path(info.name, rel)
            with self._errors(url):
                actual = self._call(lambda p=path: self._checksum(p), f"read {rel}")
            if actual != entry:
                problems.append(f"{url}: {_mismatch(entry, actual)}")
        return problems

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
        """
        check_name(name)
        source = Path(local_dir)
        if not source.is_dir():
            raise ResumableError(f"{source}: no such folder to commit as {self._url(name)}")
        files = {
            p.relative_to(source).as_posix(): p
            for p in sorted(source.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME
        }
        if not files:
            raise ResumableError(f"{source}: no files to commit as {self._url(name)}")
        self._clear_leftovers(name)
        entries = {}
        try:
            for rel, path in files.items():
                entries[rel] = self._upload(path, name, rel, progress, between_chunks or _go_on)
            manifest = replace(manifest, files=entries, created=now_iso())
            self._write_manifest(name, manifest.to_json())
        except NoSpaceError as e:
            needed = human_size(sum(path.stat().st_size for path in files.values()))
            raise NoSpaceError(
                f"{self._url(name)}: no space left to commit this checkpoint ({needed} needed"
                f"{free_space(self.root) if self.is_local else ''}); older checkpoints are kept: "
                "free space (empty Drive's trash), lower keep_last, or choose another folder"
            ) from e
        self._update_index(add={name: manifest})
        listed = {rel: ListedFile(e.size, e.crc32c, None) for rel, e in entries.items()}
        return CheckpointInfo(name, self._url(name), Status.OK, manifest, listed=listed)

    def delete(self, checkpoint: CheckpointInfo | str) -> None:
        """Delete a checkpoint folder: the manifest first, so a half-done delete reads as partial."""
        name = checkpoint if isinstance(checkpoint, str) else checkpoint.name
        check_name(name)
        files = self._listing(self._path(name)).get(name, {})
        if MANIFEST_NAME in files:
            self._update_index(remove=name)  # before the manifest goes: the index never outlives it
        ordered = sorted(files, key=lambda rel: rel != MANIFEST_NAME)
        for rel in ordered:
            path = self._path(name, rel)
            with self._errors(self._url(name, rel)):
                if self.truncate_before_delete:
                    # Drive's trash keeps deleted files and counts them against the quota.
                    self._call(lambda p=path: self.fs.pipe_file(p, b""), f"truncate {rel}")
                self._call(lambda p=path: self.fs.rm_file(p), f"delete {rel}")
        if self.is_local:
            shutil.rmtree(self._path(name), ignore_errors=True)

    # ----------------------------------------------------------------- helpers

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def _url(self, *parts: str) -> str:
        return "/".join((self.url, *parts))

    def _order(self, info: CheckpointInfo) -> tuple[Any, ...]:
        epoch = info.epoch  # not `manifest`: an indexed info builds it only when asked
        if epoch is not None:
            return (0, epoch, info.step, info.name)
        key = self.template.parse(info.name)
        return (0, key[0], key[1], info.name) if key else (1, 0, 0, info.name)

    def _call(self, fn: Any, what: str) -> Any:
        if not self._credentials_checked:
            self._check_credentials()
        return self.retry.call(fn, what)

    def _check_credentials(self) -> None:
        """Refresh Google credentials once, before the first request, and fail fast.

        gcsfs retries a failed token refresh six times with backoff up to 32 s, and logs a
        traceback each time: the minute-long hang users see in Colab when not authenticated.
        One refresh here, outside those retries, turns it into one NotAuthenticatedError line.
        """
        holder = getattr(self.fs, "credentials", None)
        credentials = getattr(holder, "credentials", None)
        if credentials is None or getattr(credentials, "valid", False):
            self._credentials_checked = True  # anonymous, or a token already fresh
            return
        lock = getattr(holder, "lock", None) or contextlib.nullcontext()
        with lock:
            credentials.refresh(BoundedRequest())
        self._credentials_checked = True

    def _list_files(self, path: str | None = None) -> dict[str, dict[str, Any]]:
        path = path or self.root
        with self._errors(self.url):
            if self.is_gcs:
                self.fs.invalidate_cache(path)  # another process may have written since
            found = self._call(lambda: self.fs.find(path, detail=True), "list")
        if self.root in found and found[self.root].get("type") != "directory":
            raise NotAFolderError(
                f"{self.url} is a file, not a run folder; pass the folder that holds the checkpoints"
            )
        return dict(found)

    def _listing(self, path: str | None = None) -> dict[str, dict[str, ListedFile]]:
        """Files grouped by checkpoint folder: {name: {relative path: ListedFile}}."""
        prefix = self.root + "/"
        grouped: dict[str, dict[str, ListedFile]] = {}
        for full, detail in self._list_files(path).items():
            full = full.rstrip("/")
            if not full.startswith(prefix) or detail.get("type") == "directory":
                continue
            name, _, rel = full[len(prefix):].partition("/")
            if not rel:
                continue  # a file directly in the run folder (a lease, a note) is no checkpoint
            grouped.setdefault(name, {})[rel] = _listed_file(detail)
        return grouped

    def _quick_list(self) -> builtins.list[CheckpointInfo]:
        """Checkpoints from one listing of folder names plus the run index (see `list`)."""
        names, indexed = self._names_and_index()
        infos = []
        unindexed = []
        for name in names:
            info = indexed.get(name)
            if info is None:
                unindexed.append(name)  # not indexed, or a bad entry: the folder's own manifest decides
            else:
                infos.append(info)
        if not unindexed:  # all from the index, each with a manifest: `_order` without a call each
            return sorted(infos, key=_epoch_step_name)
        infos += self._check_folders(unindexed)
        return sorted(infos, key=self._order)

    def _check_folders(self, names: builtins.list[str]) -> builtins.list[CheckpointInfo]:
        """Checkpoint folders checked from their own files and manifests (empty folders left out)."""
        if len(names) > QUICK_FALLBACK_FOLDERS:  # an old run without an index: one recursive listing
            wanted = set(names)
            return [info for info in self.list() if info.name in wanted]
        infos = []
        for name in names:
            files = self._listing(self._path(name)).get(name)
            if not files:
                continue  # an empty folder is no checkpoint, as in the full listing
            blob = self._read(self._path(name, MANIFEST_NAME)) if MANIFEST_NAME in files else None
            infos.append(self._info(name, files, blob))
        return infos

    def _names_and_index(self) -> tuple[builtins.list[str], dict[str, CheckpointInfo]]:
        """The folder names (one delimiter listing) and the run index's checkpoints, read together."""
        if not getattr(self.fs, "async_impl", False) or not hasattr(self.fs, "_ls"):
            names = self._folder_names()
            return names, self._indexed(self._read_index()) if names else {}
        from fsspec.asyn import sync

        async def folder_names() -> builtins.list[str]:
            if self.is_gcs:
                return await gcs_listing.folder_names(self.fs, self.root)  # the names only: cheaper
            return self._folder_names(await self.fs._ls(self.root, detail=True))

        async def indexed() -> dict[str, CheckpointInfo]:
            # Built here, on the event loop, while the listing's answer is still on its way:
            # the server's time to list the folder then pays for most of this work.
            return self._indexed(await self.fs._cat_file(self._path(run_index.INDEX_NAME)))

        async def both() -> tuple[Any, Any]:
            return await asyncio.gather(folder_names(), indexed(), return_exceptions=True)

        if self.is_gcs:
            self.fs.invalidate_cache(self.root)  # another process may have written since
        names, infos = sync(self.fs.loop, both)
        if isinstance(names, Exception) or not names or isinstance(infos, Exception) and not isinstance(
            infos, FileNotFoundError
        ):
            # Again, one request at a time, with retries and errors that say what is wrong. An
            # empty listing too: a missing bucket, a file instead of a folder, or a new run.
            names = self._folder_names()
            return names, self._indexed(self._read_index()) if names else {}
        return names, {} if isinstance(infos, Exception) else infos

    def _indexed(self, blob: bytes | None) -> dict[str, CheckpointInfo]:
        """The checkpoints the run index vouches for, by name (``checked=False``); bad entries left out."""
        prefix = self.url + "/"
        with _collector_paused():
            return {row[0]: _indexed_info(prefix + row[0], row) for row in run_index.listing(blob)}

    def _folder_names(self, entries: builtins.list[dict[str, Any]] | None = None) -> builtins.list[str]:
        """The names of the folders directly in the run folder: one delimiter listing."""
        if entries is None:
            with self._errors(self.url):
                if self.is_gcs:
                    self.fs.invalidate_cache(self.root)  # another process may have written since
                try:
                    entries = self._call(lambda: self.fs.ls(self.root, detail=True), "list")
                except FileNotFoundError:
                    if self.is_gcs:
                        self._list_files()  # tells a missing bucket (an error) from an empty prefix
                    return []
        names = []
        for entry in entries:
            path = entry["name"].rstrip("/")
            if "://" in path:
                path = _strip(path, self.fs)  # listings here name paths without a protocol; cheap
            if entry.get("type") != "directory":
                if path == self.root:
                    raise NotAFolderError(
                        f"{self.url} is a file, not a run folder; pass the folder that holds the checkpoints"
                    )
                continue
            name = path.rsplit("/", 1)[-1]
            if path != self.root and name:
                names.append(name)
        return names

    def _read_index(self) -> bytes | None:
        blob = self._read(self._path(run_index.INDEX_NAME))
        return None if isinstance(blob, Exception) else blob

    def _update_index(self, add: dict[str, Manifest] | None = None, remove: str | None = None) -> None:
        """Rewrite the run index after a commit or before a delete.

        A commit that cannot update it is still committed (listing then reads its manifest),
        so that failure is a warning. A delete that cannot update it does not delete: the
        index would vouch for a folder whose manifest is gone. A commit also mends the index
        (see `_mend_index`) when it may miss checkpoints: at this storage's first commit (a
        crash of another process, a run from before the index), when the index read is empty
        or of another version, and after a failed update. Later commits keep it whole
        themselves and skip that listing.
        """
        path = self._path(run_index.INDEX_NAME)
        try:
            with self._errors(self._url(run_index.INDEX_NAME)):
                entries = run_index.decode(self._read_index())
                if remove is not None:
                    if remove not in entries:
                        return
                    del entries[remove]
                added = add or {}
                for name, manifest in added.items():
                    entries[name] = run_index.entry(manifest, len(manifest.to_json()))
                mend = bool(added) and (not self._index_mended or len(entries) <= len(added))
                if mend:
                    self._mend_index(entries, keep=set(added))
                data = run_index.encode(entries)
                self._call(lambda: self._replace_file(path, data), "write index")
                self._index_mended = self._index_mended or mend
        except ResumableError as e:
            self._index_mended = False  # it may now miss a checkpoint: the next commit mends it
            if remove is not None:
                raise
            logger.warning("resumable: could not update the run index (listing reads the manifests): %s", e)

    def _mend_index(self, entries: dict[str, dict[str, Any]], keep: set[str]) -> None:
        """Add committed folders the index misses, drop entries whose folder is gone.

        An index misses folders after a crash between a manifest and the index, in a run
        written before the index existed or by another version: without this, every later
        `list` would read those manifests. Costs one listing of the folder names; a run to
        catch up reads the missing manifests once. Entries in ``keep`` (the commit's
        own) stay even if a slow listing does not show their folder yet.
        """
        names = self._folder_names()
        present = set(names) | keep
        for name in [n for n in entries if n not in present]:
            del entries[name]
        for info in self._check_folders([n for n in names if n not in entries]):
            if info.ok and info.manifest is not None:
                entries[info.name] = run_index.entry(info.manifest, info.listed[MANIFEST_NAME].size)

    def _replace_file(self, path: str, data: bytes) -> None:
        """Overwrite a small file in one step: readers see the old or the new bytes, never a mix."""
        if not self.is_local:
            self.fs.pipe_file(path, data)  # one object write: atomic on GCS
            return
        temporary = f"{path}.{os.getpid()}.tmp"
        with self.fs.open(temporary, "wb") as f:
            f.write(data)
        fsync(temporary)
        os.replace(temporary, path)  # a crash leaves the old index and a stray .tmp, never half an index

    def _cat_or_error(self, path: str) -> bytes | Exception:
        try:
            return bytes(self.fs.cat_file(path))
        except Exception as e:  # reported per path, like fs.cat(on_error="return")
            return e

    def _read(self, path: str) -> bytes | Exception:
        try:
            with self._errors(path):
                return bytes(self._call(lambda: self.fs.cat_file(path), "read manifest"))
        except FileNotFoundError as e:  # deleted between listing and reading
            return e

    def _read_many(self, paths: builtins.list[str]) -> dict[str, bytes | Exception]:
        if not paths:
            return {}
        results: dict[str, bytes | Exception]
        if getattr(self.fs, "async_impl", False):
            with self._errors(self.url):  # gcsfs reads many paths concurrently in one call
                blobs = self._call(lambda: self.fs.cat(paths, on_error="return"), "read manifests")
            # cat() with one path returns bytes, with several a dict
            results = {paths[0]: blobs} if len(paths) == 1 and not isinstance(blobs, dict) else dict(blobs)
        else:
            # Local and Drive reads are blocking; on Drive's FUSE mount each one can wait on the network.
            with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
                results = dict(zip(paths, pool.map(self._cat_or_error, paths), strict=True))
        for path, value in list(results.items()):
            if isinstance(value, Exception) and not isinstance(value, FileNotFoundError):
                results[path] = self._read(path)  # one more try, with retries, alone
        return {_strip(p, self.fs): v for p, v in results.items()}

    def _info(
        self, name: str, listed: dict[str, ListedFile], blob: bytes | Exception | None
    ) -> CheckpointInfo:
        url = self._url(name)
        if blob is None or isinstance(blob, FileNotFoundError):
            problem = "no manifest (an interrupted save)"
            return CheckpointInfo(name, url, Status.PARTIAL, None, problem, listed)
        if isinstance(blob, Exception):
            return CheckpointInfo(name, url, Status.CORRUPT, None, f"manifest unreadable: {blob}", listed)
        try:
            manifest = Manifest.from_json(blob, f"{url}/{MANIFEST_NAME}")
        except CorruptCheckpointError as e:
            return CheckpointInfo(name, url, Status.CORRUPT, None, str(e).split(": ", 1)[-1], listed)
        problems = []
        for rel, entry in manifest.files.items():
            found = listed.get(rel)
            if found is None:
                problems.append(f"{rel} missing")
            elif found.size != entry.size:
                problems.append(f"{rel} has {found.size} bytes, manifest says {entry.size}")
            elif found.crc32c is not None and found.crc32c != entry.crc32c:
                problems.append(f"{rel} crc32c {found.crc32c}, manifest says {entry.crc32c}")
        status = Status.CORRUPT if problems else Status.OK
        return CheckpointInfo(name, url, status, manifest, "; ".join(problems), listed)

    def _checksum(self, path: str) -> FileEntry:
        size = 0

        def chunks() -> Iterator[bytes]:
            nonlocal size
            with self.fs.open(path, "rb", block_size=CHUNK_SIZE) as f:
                while chunk := f.read(CHUNK_SIZE):
                    size += len(chunk)
                    yield chunk

        crc = crc32c_of_chunks(chunks())
        return FileEntry(size, crc)

    def _clear_leftovers(self, name: str) -> None:
        files = self._listing(self._path(name)).get(name)
        if not files:
            # Listings can lag behind writes (Drive seen from another VM): a manifest that reads
            # back is committed, even when no listing shows it yet. Never write over its files.
            manifest_path = self._path(name, MANIFEST_NAME)
            try:
                with self._errors(self._url(name, MANIFEST_NAME)):
                    self._call(lambda: self.fs.info(manifest_path), "stat manifest")
            except FileNotFoundError:
                return
            raise CheckpointExistsError(
                f"{self._url(name)} is already committed (by another process, not listed yet) and resumable "
                "never overwrites a checkpoint; continue the run with resumable.resume() or write to a "
                "new folder"
            )
        if MANIFEST_NAME in files:
            blob = self._read(self._path(name, MANIFEST_NAME))
            info = self._info(name, files, blob)
            if info.ok or _newer_format(blob):
                raise CheckpointExistsError(
                    f"{info.url} is already committed and resumable never overwrites a checkpoint; "
                    "continue the run with resumable.resume() or write to a new folder"
                )
            logger.warning("resumable: replacing corrupt checkpoint %s (%s)", info.url, info.problem)
        else:
            logger.info("resumable: removing leftovers of an interrupted save in %s", self._url(name))
        self.delete(name)

    def _upload(self, local: Path, name: str, rel: str, progress: bool,
                between_chunks: Callable[[], None]) -> FileEntry:
        """Upload one file and check the stored copy; returns its size and CRC32C as sent."""
        remote = self._path(name, rel)

        def put_and_check() -> FileEntry:
            if self.is_local:
                os.makedirs(os.path.dirname(remote), exist_ok=True)
            sent = self._put(local, remote, progress, f"upload {rel}", between_chunks)
            if self.is_local:
                fsync(remote)  # on disk before the manifest that vouches for it
            listed = _listed_file(self.fs.info(remote))
            if listed.size != sent.size or (listed.crc32c and listed.crc32c != sent.crc32c):
                # a short or damaged upload: worth another try
                found = FileEntry(listed.size, listed.crc32c or "?")
                raise OSError(errno.EIO, f"uploaded copy differs: {_mismatch(sent, found)}")
            return sent

        with self._errors(self._url(name, rel)):
            entry: FileEntry = self._call(put_and_check, f"upload {name}/{rel}")
        return entry

    def _put(self, local: Path, remote: str, progress: bool, what: str,
             between_chunks: Callable[[], None]) -> FileEntry:
        """Stream ``local`` to ``remote`` a chunk at a time; the size and CRC32C of what was sent.

        One read of the file serves the upload and its checksum. On GCS a big file goes up as
        one request streamed in pieces (`gcs_upload`); anything else through the filesystem's
        file object (on GCS, a smaller file in one request).
        """
        size = local.stat().st_size
        bar = _progress_bar(size, what) if progress and size >= PROGRESS_MIN_BYTES else None
        try:
            if self.is_gcs and size >= STREAM_MIN_BYTES:
                with contextlib.suppress(gcs_upload.NotStreamable):
                    sent, crc32c = gcs_upload.upload(self.fs, local, remote, before_piece=between_chunks,
                                                     on_sent=bar.update if bar is not None else _ignore)
                    return FileEntry(sent, crc32c)
            return self._write_chunks(local, remote, between_chunks, bar)
        finally:
            if bar is not None:
                bar.close()

    def _write_chunks(self, local: Path, remote: str, between_chunks: Callable[[], None],
                      bar: Any) -> FileEntry:
        options = {"block_size": UPLOAD_BLOCK} if self.is_gcs else {}
        checksum = RunningCrc32c()
        sent = 0
        with open(local, "rb") as source:
            target = self.fs.open(remote, "wb", **options)
            try:
                for chunk in iter(lambda: source.read(CHUNK_SIZE), b""):
                    between_chunks()
                    target.write(chunk)
                    checksum.update(chunk)
                    sent += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
            except BaseException:
                _abandon(target)
                raise
            target.close()
        return FileEntry(sent, checksum.hex())

    def _transfer(self, method: Any, source: str, target: str, size: int, progress: bool, what: str) -> None:
        """``fs.get_file``, with a progress bar for big files when asked."""
        if not progress or size < PROGRESS_MIN_BYTES:
            method(source, target)
            return
        from fsspec.callbacks import TqdmCallback

        callback = TqdmCallback(tqdm_kwargs={
            "desc": f"resumable: {what}", "unit": "B", "unit_scale": True, "unit_divisor": 1024,
            "leave": False, "mininterval": 0.5,
        })
        try:
            callback.set_size(size)
            method(source, target, callback=callback)
            if callback.value < size:  # local copies ignore the callback
                callback.absolute_update(size)
        finally:
            callback.close()

    def _write_manifest(self, name: str, data: bytes) -> None:
        path = self._path(name, MANIFEST_NAME)
        url = self._url(name, MANIFEST_NAME)

        def write() -> None:
            if self.is_local:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with self.fs.open(path, "xb") as f:  # exclusive create, as GCS' ifGenerationMatch=0
                    f.write(data)
                fsync(path)
                fsync(os.path.dirname(path))  # the folder entry, so the manifest survives a crash
            else:
                self.fs.pipe_file(path, data, mode="create")

        try:
            with self._errors(url):
                self._call(write, "write manifest")
        except FileExistsError as e:
            # A retry after a transient error (Drive's EIO, a GCS 503) whose first try did
            # land finds our own manifest: that is success, not a second writer.
            if self._read(path) == data:
                return
            raise CheckpointExistsError(
                f"{url} appeared while committing: another process is writing this run folder"
            ) from e
        # Read it back: a write cut short without an error must not report a commit. The
        # damaged manifest makes the folder corrupt (never used); the next save replaces it.
        stored = self._read(path)
        if stored != data:
            found = f"{len(stored)} of {len(data)} bytes" if isinstance(stored, bytes) else str(stored)
            raise StorageError(f"{url}: the manifest did not land intact ({found}); not committed, "
                               "the next save tries again")

    @contextlib.contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        """Turn whatever fsspec, gcsfs or the OS raised into one clear ResumableError line."""
        try:
            yield
        except ResumableError:
            raise
        except Exception as e:
            raise translate(e, where, self.url, self.root, is_gcs=self.is_gcs, is_local=self.is_local) from e


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a listing builds thousands of objects.

    Each few hundred new containers start a collection, and some of them walk every object
    of the process: a fifth of the time of building a run index's 1,000 checkpoints.
    Those objects hold no reference cycles, so the pause lets nothing leak.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _indexed_info(url: str, row: run_index.Row) -> CheckpointInfo:
    """The `_IndexedInfo` of a checked index row, without the constructor.

    A frozen dataclass sets each field through ``object.__setattr__``; giving the new instance
    its ``__dict__`` whole keeps listing a run of thousands of checkpoints within a few
    milliseconds. A test compares every attribute with the constructor's result, so a new
    field cannot be forgotten here.
    """
    info = _new_object(_IndexedInfo)
    _set_attribute(info, "__dict__", {"name": row[0], "url": url, "_row": row, "ok": True, "epoch": row[1],
                                      "step": row[2], "metrics": row[7], "created_iso": row[4] or None,
                                      "size": row[5] + sum(map(_first, row[6].values()))})
    return info


def _listed_file(detail: dict[str, Any]) -> ListedFile:
    crc = detail.get("crc32c")
    modified = detail.get("mtime") or detail.get("updated") or detail.get("created")
    if isinstance(modified, (int, float)):
        modified = datetime.fromtimestamp(modified).astimezone()
    elif isinstance(modified, str):
        try:
            modified = datetime.fromisoformat(modified.replace("Z", "+00:00"))
        except ValueError:
            modified = None
    return ListedFile(
        size=int(detail.get("size") or 0),
        crc32c=crc32c_from_gcs(crc) if isinstance(crc, str) and crc else None,
        modified=modified if isinstance(modified, datetime) else None,
    )


def _partial_newer_than(
    listing: dict[str, dict[str, ListedFile]], newest: tuple[int, int] | None, template: NameTemplate
) -> list[str]:
    partial = [name for name, files in listing.items() if MANIFEST_NAME not in files]
    keys = {name: template.parse(name) for name in partial}
    return sorted(n for n, k in keys.items() if k is not None and (newest is None or k > newest))


def _newer_format(blob: bytes | Exception) -> bool:
    if isinstance(blob, Exception):
        return False
    try:
        Manifest.from_json(blob, "")
    except UnsupportedFormatError:
        return True
    except CorruptCheckpointError:
        return False
    return False


def _require_manifest(info: CheckpointInfo) -> Manifest:
    if info.manifest is None or info.status is not Status.OK:
        raise CorruptCheckpointError(f"{info.url}: {info.problem or info.status}; cannot restore it")
    return info.manifest


def _mismatch(expected: FileEntry, actual: FileEntry) -> str:
    if expected.size != actual.size:
        return f"size {actual.size} bytes, manifest says {expected.size}"
    return f"crc32c {actual.crc32c}, manifest says {expected.crc32c}"


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _is_local(fs: Any) -> bool:
    return "file" in _protocols(fs)


def _go_on() -> None:
    """The default ``between_chunks``: no pause."""


def _ignore(_: int) -> None:
    """No progress bar to move."""


def _abandon(target: Any) -> None:
    """Give up a half-written remote file: a GCS upload is cancelled, a local file is overwritten later."""
    discard = getattr(target, "discard", None)
    if callable(discard):
        with contextlib.suppress(Exception):
            discard()
    else:
        with contextlib.suppress(Exception):
            target.close()


def _progress_bar(size: int, what: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=size, desc=f"resumable: {what}", unit="B", unit_scale=True, unit_divisor=1024,
                leave=False, mininterval=0.5)


def _strip(path: str, fs: Any) -> str:
    return str(fs._strip_protocol(path)).rstrip("/")
