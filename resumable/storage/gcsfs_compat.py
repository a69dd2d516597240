"""The few private fsspec and gcsfs members the listing and reading code uses, in one place.

Each is looked up once per filesystem class. Where one is missing (another fsspec or gcsfs
release), a public API serves instead, slower; where none can, the call fails with one line
that names the installed gcsfs. (`gcs_client` hands gcsfs' credentials to google-cloud-storage;
`run_files` still sends its GCS requests through gcsfs until `gcs_objects` takes them over.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import fsspec.asyn

from resumable.core.errors import StorageError
from resumable.storage import heap, retry

T = TypeVar("T")


_probed: dict[tuple[type, str], Any] = {}


def _member(cls: type, name: str) -> Any:
    """``cls.name`` when the class has it, else None: probed once per class."""
    key = (cls, name)
    if key not in _probed:
        _probed[key] = getattr(cls, name, None)
    return _probed[key]


def strip_protocol(fs: Any, path: str) -> str:
    """``path`` as ``fs`` names it internally: ``gs://b/k/`` -> ``b/k``."""
    return str(protocol_stripper(fs)(path)).rstrip("/")


def protocol_stripper(fs: Any) -> Callable[[str], str]:
    """What `strip_protocol` calls for ``fs``, chosen once (a `RunFolder` keeps it): the
    filesystem's own ``_strip_protocol`` (a classmethod of every fsspec filesystem), else the
    text after ``://``. Its result may end in "/": strip that."""
    strip = _member(type(fs), "_strip_protocol")
    return strip if strip is not None else _after_protocol


def _after_protocol(path: str) -> str:
    _, separator, rest = path.partition("://")
    return rest if separator else path


def awaits_listing_and_reads(fs: Any) -> bool:
    """True when ``fs`` can list a folder and read a file at once on its event loop (gcsfs)."""
    cls = type(fs)
    return bool(getattr(fs, "async_impl", False)) and all(
        _member(cls, name) is not None for name in ("_ls", "_cat_file", "loop"))


async def ls(fs: Any, path: str) -> list[dict[str, Any]]:
    """``fs.ls(path, detail=True)``, awaited (only where `awaits_listing_and_reads`)."""
    entries: list[dict[str, Any]] = await fs._ls(path, detail=True)
    return entries


async def cat_file(fs: Any, path: str, limit: int | None = None) -> bytes:
    """``fs.cat_file(path)``, awaited (only where `awaits_listing_and_reads`); with ``limit``, its
    first ``limit + 1`` bytes at most (one ranged read)."""
    if limit is None:
        return bytes(await fs._cat_file(path))
    return bytes(await fs._cat_file(path, start=0, end=limit + 1))


async def get_file_in_slices(fs: Any, path: str, local: str, size: int, *, piece: int, at_once: int,
                             on_piece: Callable[[int], None]) -> None:
    """Download ``path`` (``size`` bytes) to ``local`` as ranged reads of ``piece`` bytes,
    ``at_once`` of them in flight: one stream's throughput times several, and at most
    ``piece * at_once`` bytes in memory. ``on_piece(n)`` after each piece lands."""
    slots = asyncio.Semaphore(at_once)
    fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        async def fetch(start: int) -> None:
            async with slots:
                data = await fs._cat_file(path, start=start, end=min(start + piece, size))
                os.pwrite(fd, data, start)
            on_piece(len(data))

        tasks = [asyncio.ensure_future(fetch(start)) for start in range(0, size, piece)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # stop the other pieces before the file closes under them
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    finally:
        os.close(fd)
        heap.give_back()  # the pieces' buffers: the load that follows needs the memory


# gcsfs' request methods wrapped in its retry decorator (`decorator` keeps the bare one in
# ``__wrapped__``): the ones resumable's reads, listings and downloads go through.
_RETRIED_REQUESTS = ("_request", "_get_file_request")


def bound_requests(fs: Any) -> None:
    """Let a time budget (`retry.deadline_in`, a command's) bound gcsfs' requests on ``fs``.

    gcsfs retries each failing request 6 times, 1 to 16 s apart, inside any caller's retries, and
    waits 5 minutes for an answer: a command against a failing server took three minutes to say
    so. Within a deadline each request is tried once, for the time left (`retry.OutOfTime` when
    none comes); the caller's `RetryPolicy` retries within the same budget. Without a deadline
    (training) gcsfs retries as it always does. Installed once per filesystem object; a gcsfs
    whose methods are not wrapped this way is left as it is.
    """
    for name in _RETRIED_REQUESTS:
        bare = getattr(_member(type(fs), name), "__wrapped__", None)
        if bare is None or not asyncio.iscoroutinefunction(bare) or name in vars(fs):
            continue
        setattr(fs, name, _bounded(fs, bare, getattr(fs, name)))


def _bounded(fs: Any, bare: Callable[..., Awaitable[Any]], retried: Callable[..., Awaitable[Any]]
             ) -> Callable[..., Awaitable[Any]]:
    async def request(*args: Any, **kwargs: Any) -> Any:
        left = retry.time_left()
        if left is None:
            return await retried(*args, **kwargs)
        try:
            return await asyncio.wait_for(bare(fs, *args, **kwargs), left)
        except asyncio.TimeoutError:
            raise retry.OutOfTime(f"no answer from the storage within the {_seconds(left)} left of the "
                                  "time budget") from None

    return request


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def run(fs: Any, coroutine: Callable[[], Awaitable[T]]) -> T:
    """Run ``coroutine()`` on the filesystem's event loop and wait for its result."""
    result: T = fsspec.asyn.sync(fs.loop, coroutine)
    return result


def split_path(fs: Any, path: str) -> tuple[str, str]:
    """``(bucket, key)`` of a GCS path ``bucket/key`` (no protocol)."""
    split = _member(type(fs), "split_path")
    if split is not None:
        bucket, key, _ = fs.split_path(path)
        return str(bucket), str(key)
    if "://" in path:
        path = path.split("://", 1)[1]
    bucket, _, key = path.partition("/")
    return bucket, key


async def folder_prefixes(fs: Any, path: str) -> list[str]:
    """The keys of the folders directly under GCS ``path``, each ending in "/", as listed.

    gcsfs' ``_do_list_objects`` sends one delimiter listing (paged, with gcsfs' session,
    retries and ``userProject``) and hands back the prefixes as they come, without building,
    sorting and caching a record per entry as ``ls`` does; ``ls`` serves where it is missing.
    """
    cls = type(fs)
    if _member(cls, "_do_list_objects") is not None:
        _, prefixes = await fs._do_list_objects(path)  # delimiter "/": one level
        return [str(prefix) for prefix in prefixes]
    if _member(cls, "_ls") is None:
        raise StorageError(f"{path}: cannot list folders with gcsfs {_gcsfs_version()}; "
                           "install a gcsfs release this resumable supports")
    bucket_length = len(split_path(fs, path)[0]) + 1
    return [entry["name"].rstrip("/")[bucket_length:] + "/"
            for entry in await ls(fs, path) if entry.get("type") == "directory"]


def google_credentials(fs: Any) -> tuple[Any, contextlib.AbstractContextManager[Any]] | None:
    """The google-auth credentials of a gcsfs filesystem and the lock gcsfs refreshes them under.

    None for anonymous access, and where this gcsfs keeps them elsewhere: then the first request
    finds out, with gcsfs' own (slower) retries.
    """
    holder = getattr(fs, "credentials", None)  # gcsfs' GoogleCredentials
    credentials = getattr(holder, "credentials", None)
    if credentials is None:
        return None
    return credentials, getattr(holder, "lock", None) or contextlib.nullcontext()


def _gcsfs_version() -> str:
    try:
        import gcsfs
    except ImportError:
        return "(not installed)"
    return str(getattr(gcsfs, "__version__", "(unknown version)"))
