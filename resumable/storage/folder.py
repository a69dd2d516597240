"""A run folder behind any fsspec URL: paths, retried calls, clear errors, reads and listings.

Everything else in `resumable.storage` reaches the filesystem through a `RunFolder`: its
`call` retries transient errors (and checks Google credentials once, up front), its `errors`
turns whatever fsspec, gcsfs or the OS raised into one ResumableError line.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from resumable.core.checksum import crc32c_from_gcs
from resumable.core.errors import NotAFolderError, ResumableError, StorageError
from resumable.core.manifest import MANIFEST_NAME, is_safe_relative
from resumable.core.naming import is_plain_name
from resumable.storage import gcsfs_compat, library_random
from resumable.storage.errors import BoundedRequest, quiet_library_logs, translate
from resumable.storage.local_files import LINK_PROBLEM, LinkInRunError, clear_for_write, fsync, link_below
from resumable.storage.mounts import check_drive_mounted
from resumable.storage.records import ListedFile
from resumable.storage.retry import RetryPolicy, http_code

# gcsfs 2026.x probes every bucket over gRPC first, which stalls about a minute against
# emulators; we use none of what that probe enables. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import fsspec  # noqa: E402  (after the environment default above)

T = TypeVar("T")
logger = logging.getLogger("resumable")

quiet_library_logs()  # gcsfs' failed-retry tracebacks and any token become one redacted line

READ_THREADS = 16  # files read at once from a blocking filesystem (local disk, Drive)
DRIVE_MOUNT = "/content/drive/"


class RunFolder:
    """The filesystem, root path and error handling of one run folder.

    Args:
        url: A local folder, ``/content/drive/MyDrive/...``, ``gs://bucket/prefix``,
            ``memory://...`` or any other fsspec URL.
        retry: Backoff for transient errors. Defaults to ``RetryPolicy()``.
        storage_options: Passed to the fsspec filesystem (e.g. ``{"token": "anon"}``).
        truncate_before_delete: Empty files before deleting them (Google Drive's trash).
            Defaults to True under ``/content/drive/`` and False elsewhere.
    """

    def __init__(self, url: str, *, retry: RetryPolicy | None = None,
                 storage_options: dict[str, Any] | None = None,
                 truncate_before_delete: bool | None = None) -> None:
        url = os.fspath(url)
        if not url:
            raise ResumableError("the run folder URL is empty; pass a folder or gs://bucket/prefix")
        self.url = url.rstrip("/") or url
        self.retry = retry or RetryPolicy()
        if self.url.split("://", 1)[0] in ("gs", "gcs"):
            library_random.isolate()  # before gcsfs' first request: its retries draw no global random
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
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else tuple(self.fs.protocol)
        self._strip_protocol = gcsfs_compat.protocol_stripper(self.fs)  # chosen once, used at every listing
        self.is_local = "file" in protocols
        self.is_gcs = "gs" in protocols
        self._credentials_checked = not self.is_gcs
        if self.is_gcs:
            gcsfs_compat.bound_requests(self.fs)  # a command's time budget bounds gcsfs' own retries
        if self.is_local:  # never a run on the VM's own disk where Google Drive should be
            check_drive_mounted(self.url, self.root)
        self.truncate_before_delete = (
            truncate_before_delete
            if truncate_before_delete is not None
            else self.is_local and os.path.abspath(self.root).startswith(DRIVE_MOUNT)
        )

    # ----------------------------------------------------------------- paths, calls, errors

    def path(self, *parts: str) -> str:
        """The filesystem path of ``parts`` under the run folder."""
        return "/".join((self.root, *parts))

    def url_of(self, *parts: str) -> str:
        """The URL of ``parts`` under the run folder, as messages show it."""
        return "/".join((self.url, *parts))

    def call(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` with retries of transient errors, after the one-time credentials check.

        A 401 (a token the server no longer takes, though it has not expired by this machine's
        clock) refreshes the credentials and tries once more: gcsfs would retry with the same token.
        """
        self.check_credentials()
        try:
            return self.retry.call(fn, what)
        except Exception as e:
            if not (self.is_gcs and http_code(e) == 401 and gcsfs_compat.google_credentials(self.fs)):
                raise
        logger.info("resumable: the storage refused the access token (401); refreshing it and trying again")
        self.check_credentials(refresh=True)
        return self.retry.call(fn, what)

    @contextlib.contextmanager
    def errors(self, where: str) -> Iterator[None]:
        """Turn whatever fsspec, gcsfs or the OS raised into one clear ResumableError line."""
        try:
            yield
        except ResumableError:
            raise
        except Exception as e:
            error = translate(e, where, self.url, self.root, is_gcs=self.is_gcs, is_local=self.is_local)
            try:
                if isinstance(error, StorageError) and type(error) is not StorageError:
                    raise error from None  # its line says it all (not found, no space...): no library chain
                raise error from e
            finally:
                # Its traceback holds this frame: kept here, the error would hold every caller's
                # frame (a checkpoint's values among their locals) until Python's cycle collector ran.
                del error

    def check_credentials(self, *, refresh: bool = False) -> None:
        """Refresh Google credentials once, before the first request, and fail fast.

        gcsfs retries a failed token refresh six times with backoff up to 32 s, and logs a
        traceback each time: the minute-long hang users see in Colab when not authenticated.
        One refresh here, outside those retries, turns it into one NotAuthenticatedError line.
        ``refresh``: refresh even a token that looks fresh (the server refused it).
        """
        if self._credentials_checked and not refresh:
            return
        found = gcsfs_compat.google_credentials(self.fs)
        if found is not None:
            credentials, lock = found
            if refresh or not getattr(credentials, "valid", False):  # else a token still fresh
                with lock:
                    credentials.refresh(BoundedRequest())
        self._credentials_checked = True

    # ----------------------------------------------------------------- reading and writing

    def exists(self) -> bool:
        """True when the run folder exists (and on GCS, holds at least one object)."""
        with self.errors(self.url):
            if self.is_local:
                if os.path.isfile(self.root):
                    raise NotAFolderError(f"{self.url} is a file, not a run folder")
                return os.path.isdir(self.root)
            return bool(self.list_files()) or self.call(lambda: bool(self.fs.isdir(self.root)), "stat")

    def read(self, path: str, limit: int | None = None) -> bytes | Exception:
        """The bytes of ``path``, or the FileNotFoundError when it is gone, or the LinkInRunError
        when it is a link (other errors raise). With ``limit``, at most ``limit + 1`` bytes are
        read: enough to tell a file over the limit, never a hostile 400 MB file whole."""
        try:
            with self.errors(path):
                return self.call(lambda: self._cat(path, limit), "read manifest")
        except (FileNotFoundError, LinkInRunError) as e:  # deleted between listing and reading; a link
            return _as_value(e)

    def read_many(self, paths: list[str]) -> dict[str, bytes | Exception]:
        """Each path's bytes, or the error that reading it met, read at once; keyed by `strip`ped path."""
        if not paths:
            return {}
        results: dict[str, bytes | Exception]
        if getattr(self.fs, "async_impl", False):
            with self.errors(self.url):  # gcsfs reads many paths concurrently in one call
                blobs = self.call(lambda: self.fs.cat(paths, on_error="return"), "read manifests")
            # cat() with one path returns bytes, with several a dict
            results = {paths[0]: blobs} if len(paths) == 1 and not isinstance(blobs, dict) else dict(blobs)
        else:
            # Local and Drive reads are blocking; on Drive's FUSE mount each one can wait on the network.
            with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
                results = dict(zip(paths, pool.map(self._read_once, paths), strict=True))
        for path, value in list(results.items()):
            if isinstance(value, Exception) and not isinstance(value, FileNotFoundError):
                results[path] = self.read(path)  # one more try, with retries, alone
        return {self.strip(path): value for path, value in results.items()}

    def _read_once(self, path: str) -> bytes | Exception:
        try:
            return self._cat(path)
        except Exception as e:  # reported per path, like fs.cat(on_error="return")
            return _as_value(e)

    def has_link(self, path: str) -> bool:
        """Locally: True when ``path``, or a folder between the run folder and it, is a symbolic link."""
        if not self.is_local or path == self.root:
            return False
        with self.errors(path):
            return self.call(lambda: link_below(self.root, path), "stat")

    def _cat(self, path: str, limit: int | None = None) -> bytes:
        """The bytes of ``path`` (the first ``limit + 1`` of them, with ``limit``); locally never
        through a link below the run folder (LinkInRunError)."""
        if self.is_local and link_below(self.root, path):  # then read through fs: wrappers see each read
            raise LinkInRunError(f"{path}: {LINK_PROBLEM}")
        if limit is not None:
            if self.is_local:  # a read sets its size aside first: ask for no more than the file holds
                limit = min(limit, os.stat(path).st_size)
            return bytes(self.fs.cat_file(path, start=0, end=limit + 1))  # one ranged read
        return bytes(self.fs.cat_file(path))

    def replace_file(self, path: str, data: bytes) -> None:
        """Overwrite a small file in one step: readers see the old or the new bytes, never a mix."""
        if not self.is_local:
            self.fs.pipe_file(path, data)  # one object write: atomic on GCS
            return
        temporary = f"{path}.{os.getpid()}.tmp"
        clear_for_write(self.root, temporary)  # a link planted at that name is removed, not written through
        try:
            with self.fs.open(temporary, "wb") as f:
                f.write(data)
            fsync(temporary)  # EIO raises: a retry writes it all again
            os.replace(temporary, path)  # a crash leaves the old file and a stray .tmp, never half a file
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        fsync(os.path.dirname(path))  # the new folder entry, so the new bytes survive a crash

    def strip(self, path: str) -> str:
        """A path as listings and reads name it: without the protocol or a trailing "/"."""
        return str(self._strip_protocol(path)).rstrip("/")

    # ----------------------------------------------------------------- listings

    def list_files(self, path: str | None = None) -> dict[str, dict[str, Any]]:
        """Every file under ``path`` (the run folder by default) with its details: one recursive listing."""
        path = path or self.root
        if self.has_link(path):
            return {}  # a checkpoint folder that is a link: never listed through (`Listing.get` says so)
        with self.errors(self.url):
            if self.is_gcs:
                self.fs.invalidate_cache(path)  # another process may have written since
            found = self.call(lambda: self.fs.find(path, detail=True), "list")
        if self.root in found and found[self.root].get("type") != "directory":
            raise NotAFolderError(
                f"{self.url} is a file, not a run folder; pass the folder that holds the checkpoints"
            )
        return dict(found)

    def listing(self, path: str | None = None) -> dict[str, dict[str, ListedFile]]:
        """Files under ``path`` grouped by checkpoint folder: {name: {relative path: ListedFile}}."""
        prefix = self.root + "/"
        grouped: dict[str, dict[str, ListedFile]] = {}
        for full, detail in self.list_files(path).items():
            full = full.rstrip("/")
            if not full.startswith(prefix) or detail.get("type") == "directory":
                continue
            name, _, rel = full[len(prefix):].partition("/")
            if not rel:
                continue  # a file directly in the run folder (a lease, the index) is no checkpoint
            if not is_plain_name(name) or not (rel == MANIFEST_NAME or is_safe_relative(rel)):
                continue  # `..` in an object name: never a checkpoint's file, never touched
            grouped.setdefault(name, {})[rel] = listed_file(detail)
        return grouped

    def folder_names(self) -> list[str]:
        """The names of the folders directly in the run folder: one delimiter listing."""
        with self.errors(self.url):
            if self.is_gcs:
                self.fs.invalidate_cache(self.root)  # another process may have written since
            try:
                entries = self.call(lambda: self.fs.ls(self.root, detail=True), "list")
            except FileNotFoundError:
                if self.is_gcs:
                    self.list_files()  # tells a missing bucket (an error) from an empty prefix
                return []
        return self.folder_names_in(entries)

    def folder_names_in(self, entries: list[dict[str, Any]]) -> list[str]:
        """The folder names among the entries of ``ls(root, detail=True)``; a file at the root raises."""
        names = []
        for entry in entries:
            path = entry["name"].rstrip("/")
            if "://" in path:
                path = self.strip(path)  # most filesystems list paths without their protocol
            if entry.get("type") != "directory":
                if path == self.root:
                    raise NotAFolderError(
                        f"{self.url} is a file, not a run folder; pass the folder that holds the checkpoints"
                    )
                continue
            name = path.rsplit("/", 1)[-1]
            if path != self.root and is_plain_name(name):
                names.append(name)
        return names


def listed_file(detail: dict[str, Any]) -> ListedFile:
    """A listing's record of one file (fsspec's ``info`` dict) as a `ListedFile`."""
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
        link=bool(detail.get("islink")),  # local listings never descend into a link
    )


def _as_value(error: Exception) -> Exception:
    """``error``, to be returned rather than raised: without its traceback and the error it
    replaced, whose frames lead (through their callers) back to the caller holding it, a cycle
    that would keep every caller's locals (a checkpoint's values among them) until Python's cycle
    collector ran."""
    error.__context__ = error.__cause__ = None
    return error.with_traceback(None)
