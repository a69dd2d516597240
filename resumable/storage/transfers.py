"""Moving checkpoint files: upload files and check the stored copies, download and check, verify.

Files are streamed in chunks and checksummed (CRC32C) as they go, never read whole into
memory. ``progress`` shows the progress of files of `PROGRESS_MIN_BYTES` or more: a tqdm bar
on a terminal or in a notebook, a few plain lines and a summary in a log (`progress`).

A checkpoint with several big files (a model's weights in shards) sends `FILES_AT_ONCE` of
them at a time, under one progress bar for all of them: one stream is limited by its round
trips, several share the bandwidth. It downloads files one after another (each big one from
GCS as concurrent ranged reads, so as many streams), those the caller names ``last`` after the
others and in that order, announcing each as it lands (`fetch`'s ``landed``): a loader reads
the first shards while the next come down.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from resumable.core.checksum import CHUNK_SIZE, RunningCrc32c, crc32c_of_chunks, crc32c_of_file
from resumable.core.display import human_size
from resumable.core.errors import CorruptCheckpointError, NoSpaceError, ResumableError
from resumable.core.manifest import MANIFEST_NAME, FileEntry, Manifest
from resumable.storage import gcs_upload, gcsfs_compat, landed
from resumable.storage.errors import NO_SPACE_ERRNOS, free_space
from resumable.storage.folder import RunFolder, listed_file
from resumable.storage.local_files import LINK_PROBLEM, LinkInRunError, clear_for_write, fsync, open_inside
from resumable.storage.progress import Progress, byte_progress, fsspec_callback
from resumable.storage.records import CheckpointInfo, Status, mismatch

PROGRESS_MIN_BYTES = 4 * 1024 * 1024  # files at least this big get a progress bar when asked
UPLOAD_BLOCK = 50 * 2**20  # bytes per GCS upload request, as gcsfs' put_file sends them
# Downloads of objects this big go as concurrent ranged reads, SLICES_AT_ONCE of SLICE_BYTES
# in flight (so at most 64 MiB in memory). Measured against gcsfs' get_file in docs/benchmarks.md.
SLICED_MIN_BYTES = 32 * 2**20
SLICE_BYTES = 16 * 2**20
SLICES_AT_ONCE = 4
STREAM_MIN_BYTES = 8 * 2**20  # GCS files this big go up as one streamed request (see gcs_upload)
FILES_AT_ONCE = 4  # big files of one checkpoint in flight at a time (each its own stream)
TOGETHER_MIN_BYTES = PROGRESS_MIN_BYTES  # files this big move together (one progress bar), when two or more


class Transfers:
    """Uploads, downloads and re-reads the files of checkpoints in one run folder."""

    def __init__(self, folder: RunFolder) -> None:
        self._folder = folder

    def upload_all(self, files: dict[str, Path], name: str, *, progress: bool,
                   between_chunks: Callable[[], None]) -> dict[str, FileEntry]:
        """Upload files (by path relative to checkpoint ``name``) and check the stored copies;
        each one's size and CRC32C as sent. Big files go several at a time (module docstring).

        ``between_chunks`` is called before each chunk is sent (background uploads wait there).
        """
        together = _together({rel: path.stat().st_size for rel, path in files.items()})
        entries = {rel: self.upload(files[rel], name, rel, progress=progress, between_chunks=between_chunks)
                   for rel in files if rel not in together}
        if together:
            total = sum(files[rel].stat().st_size for rel in together)
            bar = byte_progress(total, f"upload {name} ({len(together)} files)") if progress else None
            stop = threading.Event()

            def paced() -> None:  # the others stop at their next chunk once one has failed
                if stop.is_set():
                    raise _Stopped()
                between_chunks()

            def one(rel: str) -> FileEntry:
                return self.upload(files[rel], name, rel, progress=False, between_chunks=paced, bar=bar)

            try:
                entries.update(_at_once(together, one, stop))
            finally:
                if bar is not None:
                    bar.close()
        return {rel: entries[rel] for rel in files}

    def upload(self, local: Path, name: str, rel: str, *, progress: bool,
               between_chunks: Callable[[], None], bar: Progress | None = None) -> FileEntry:
        """Upload one file to ``name/rel`` and check the stored copy; its size and CRC32C as sent.

        ``between_chunks`` is called before each chunk is sent (background uploads wait there).
        ``bar``: a progress bar this file's bytes add to (one for several files).
        """
        folder = self._folder
        remote = folder.path(name, rel)

        def put_and_check() -> FileEntry:
            if folder.is_local:
                clear_for_write(folder.root, remote)  # a new file: never through a link, nor a hard link
            size = local.stat().st_size
            own = _progress_bar(size, f"upload {rel}") if progress and size >= PROGRESS_MIN_BYTES else None
            try:
                sent = self._put(local, remote, own or bar, between_chunks)
            finally:
                if own is not None:
                    own.close()
            if folder.is_local:
                fsync(remote)  # on disk before the manifest that vouches for it
            stored = listed_file(folder.fs.info(remote))
            if stored.size != sent.size or (stored.crc32c and stored.crc32c != sent.crc32c):
                # a short or damaged upload: worth another try
                found = FileEntry(stored.size, stored.crc32c or "?")
                raise OSError(errno.EIO, f"uploaded copy differs: {mismatch(sent, found)}")
            return sent

        with folder.errors(folder.url_of(name, rel)):
            return folder.call(put_and_check, f"upload {name}/{rel}")

    def fetch(self, info: CheckpointInfo, local_dir: str | Path, *, progress: bool,
              landed: Callable[[str], None] | None = None, last: Sequence[str] = ()) -> Path:
        """Download a checkpoint into ``local_dir`` and check every file's size and CRC32C.

        Files already in ``local_dir`` with the right checksum are not downloaded again. The
        files named in ``last`` come after the others, in that order; ``landed(rel)`` is called
        as each file is in place, checked. Raises CorruptCheckpointError if a file disagrees
        with the manifest (or is a link, in a local run folder), NoSpaceError naming
        ``local_dir`` when its disk is full.
        """
        manifest = _restorable_manifest(info)
        target = Path(local_dir)
        files = manifest.files
        order = [rel for rel in files if rel not in last] + [rel for rel in last if rel in files]
        together = set(_together({rel: entry.size for rel, entry in files.items()}))  # under one bar
        bar = None
        if progress and together:
            bar = byte_progress(sum(files[rel].size for rel in together), f"download {info.name} "
                                f"({len(together)} files)")
        try:
            target.mkdir(parents=True, exist_ok=True)
            for rel in order:
                shared = bar if rel in together else None
                self._fetch_file(info.name, rel, files[rel], target, progress, bar=shared)
                (landed or _ignore)(rel)
            (target / MANIFEST_NAME).write_bytes(manifest.to_json())
        except (OSError, _CacheFull) as e:
            if isinstance(e, _CacheFull) or not isinstance(e, ResumableError) and e.errno in NO_SPACE_ERRNOS:
                raise _cache_full(target, manifest) from None
            raise
        finally:
            if bar is not None:
                bar.close()
        return target

    def _fetch_file(self, name: str, rel: str, entry: FileEntry, target: Path, progress: bool, *,
                    bar: Progress | None = None) -> None:
        """One file into ``target``, through ``<file>.part``: never left behind, whatever happens.

        ``bar``: a progress bar this file's bytes add to (one for several files).
        """
        folder = self._folder
        url = folder.url_of(name, rel)
        local = target / rel
        if local.is_file() and FileEntry(local.stat().st_size, crc32c_of_file(local)) == entry:
            if bar is not None:
                bar.update(entry.size)
            return  # already in the cache
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(local.name + ".part")

        def download() -> None:
            try:
                remote = folder.path(name, rel)
                if bar is None and progress and entry.size >= PROGRESS_MIN_BYTES:
                    with byte_progress(entry.size, f"download {rel}") as own:
                        self._download(remote, str(partial), entry.size, own)
                else:
                    self._download(remote, str(partial), entry.size, bar)
            except OSError as e:  # told apart here, before `folder.errors` blames the run folder
                if e.errno in NO_SPACE_ERRNOS:
                    raise _CacheFull() from e
                raise

        try:
            try:
                with folder.errors(url):
                    folder.call(download, f"download {rel}")
            except LinkInRunError:
                raise CorruptCheckpointError(f"{url} is {LINK_PROBLEM}; the checkpoint is damaged, "
                                             "an older one will be used") from None
            actual = FileEntry(partial.stat().st_size, crc32c_of_file(partial))
            if actual != entry:
                raise CorruptCheckpointError(
                    f"{url}: {mismatch(entry, actual)}; the checkpoint is damaged, an older one will be used"
                )
            os.replace(partial, local)
        except BaseException:  # a failed, damaged or interrupted download (Ctrl-C included)
            with contextlib.suppress(OSError):
                partial.unlink()
            raise

    def checked_in_place(self, info: CheckpointInfo) -> Path:
        """A local run's checkpoint folder itself, once every file's size and CRC32C checked out.

        On a local disk or a Drive mount a copy into a cache would only read the files twice:
        the checksums are read here, and the loader reads the same files next, from the page
        cache. Raises CorruptCheckpointError as `fetch` does.
        """
        _restorable_manifest(info)
        problems = self.verify(info)
        if problems:
            raise CorruptCheckpointError(
                f"{problems[0]}; the checkpoint is damaged, an older one will be used")
        return Path(self._folder.path(info.name))

    def verify(self, info: CheckpointInfo) -> list[str]:
        """Re-read every file of a checkpoint; one line per problem (empty if good)."""
        if info.manifest is None:
            return [f"{info.url}: {info.problem}"]
        folder = self._folder
        problems = []
        for rel, entry in info.manifest.files.items():
            url = folder.url_of(info.name, rel)
            if rel not in info.listed:
                problems.append(f"{url}: missing")
                continue
            try:
                with folder.errors(url):
                    actual = folder.call(functools.partial(self._checksum, folder.path(info.name, rel)),
                                         f"read {rel}")
            except LinkInRunError:  # locally: the file, or a folder on its way, is a link
                problems.append(f"{url}: {LINK_PROBLEM}")
                continue
            if actual != entry:
                problems.append(f"{url}: {mismatch(entry, actual)}")
        return problems

    # ----------------------------------------------------------------- helpers

    def _put(self, local: Path, remote: str, bar: Progress | None,
             between_chunks: Callable[[], None]) -> FileEntry:
        """Stream ``local`` to ``remote`` (`put_streamed`); the size and CRC32C of what was sent."""
        on_sent = bar.update if bar is not None else _ignore
        return FileEntry(*put_streamed(self._folder, local, remote, between_chunks=between_chunks,
                                       on_sent=on_sent))

    def _download(self, remote: str, local: str, size: int, bar: Progress | None) -> None:
        """``fs.get_file`` (big GCS objects in slices), its bytes added to ``bar`` if given."""
        get_file = self._folder.fs.get_file
        if self._folder.is_local:
            get_file = self._copy_inside
        elif size >= SLICED_MIN_BYTES and gcsfs_compat.awaits_listing_and_reads(self._folder.fs):
            get_file = functools.partial(self._get_in_slices, size=size)
        if bar is None:
            get_file(remote, local)
            return
        before = bar.done
        get_file(remote, local, callback=fsspec_callback(bar, relative=True))
        if bar.done < before + size:  # local copies ignore the callback
            bar.update(before + size - bar.done)

    def _get_in_slices(self, remote: str, local: str, callback: Any = None, *, size: int) -> None:
        """A big object in concurrent ranged reads: several streams outrun gcsfs' one."""
        fs = self._folder.fs
        on_piece = callback.relative_update if callback is not None else _ignore
        gcsfs_compat.run(fs, lambda: gcsfs_compat.get_file_in_slices(
            fs, remote, local, size, piece=SLICE_BYTES, at_once=SLICES_AT_ONCE, on_piece=on_piece))

    def _copy_inside(self, remote: str, local: str, callback: Any = None) -> None:
        """A local run's file copied to ``local``, never read through a link (LinkInRunError)."""
        with os.fdopen(open_inside(self._folder.root, remote), "rb") as source, open(local, "wb") as target:
            shutil.copyfileobj(source, target, CHUNK_SIZE)

    def _open_stored(self, path: str) -> Any:
        if self._folder.is_local:
            return os.fdopen(open_inside(self._folder.root, path), "rb")
        return self._folder.fs.open(path, "rb", block_size=CHUNK_SIZE)

    def _checksum(self, path: str) -> FileEntry:
        """Size and CRC32C of a stored file, read a chunk at a time."""
        size = 0

        def chunks() -> Iterator[bytes]:
            nonlocal size
            with self._open_stored(path) as f:
                while chunk := f.read(CHUNK_SIZE):
                    size += len(chunk)
                    yield chunk

        crc = crc32c_of_chunks(chunks())
        return FileEntry(size, crc)


def _together(sizes: dict[str, int]) -> list[str]:
    """The files that move at once: those of `TOGETHER_MIN_BYTES` or more, when there are two or more."""
    big = [rel for rel, size in sizes.items() if size >= TOGETHER_MIN_BYTES]
    return big if len(big) > 1 else []


class _Stopped(BaseException):
    """Another file of the same transfer failed: this one stops too (never reported itself, never
    retried: a BaseException, like Ctrl-C, goes through the error translation and retries)."""


def _at_once(names: Iterable[str], work: Callable[[str], Any], stop: threading.Event) -> dict[str, Any]:
    """``work(name)`` for each name, `FILES_AT_ONCE` at a time; the results by name.

    The first failure sets ``stop`` (an upload's other files give up at their next chunk),
    the files not started are not, and that failure is raised once the others have ended.
    """
    results: dict[str, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(FILES_AT_ONCE, thread_name_prefix="resumable-files") as pool:
        futures = {pool.submit(work, name): name for name in names}
        try:
            for future in concurrent.futures.as_completed(futures):
                if future.exception() is not None:
                    break
                results[futures[future]] = future.result()
        finally:  # a failure or Ctrl-C: stop the rest, wait for those running
            stop.set()
            for future in futures:
                future.cancel()
    errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
    first = next((e for e in errors if not isinstance(e, _Stopped)), errors[0] if errors else None)
    if first is not None:
        raise first
    return results


class _CacheFull(ResumableError):
    """The local disk filled up while downloading (`Transfers.fetch` says where, and how much)."""


def _cache_full(target: Path, manifest: Manifest) -> NoSpaceError:
    """No room in the local folder a checkpoint is downloaded into: say which one, and what it needs."""
    needed = human_size(sum(entry.size for entry in manifest.files.values()))
    return NoSpaceError(
        f"{target}: no space left on this machine's disk to download the checkpoint into ({needed} needed"
        f"{free_space(str(target))}); free space there, or pass staging_dir= a folder on a bigger disk"
    )


def _restorable_manifest(info: CheckpointInfo) -> Manifest:
    if info.manifest is None or info.status is not Status.OK:
        raise CorruptCheckpointError(f"{info.url}: {info.problem or info.status}; cannot restore it")
    return info.manifest


def _ignore(_: object) -> None:
    """Nobody to tell: no progress bar to move, no loader waiting for a file."""


def put_streamed(folder: RunFolder, local: Path, remote: str, *, between_chunks: Callable[[], None],
                 on_sent: Callable[[int], None] = _ignore) -> tuple[int, str]:
    """Stream ``local`` to ``remote`` a chunk at a time; the size and CRC32C of what was sent.

    One read of the file serves the upload and its checksum. On GCS a file of `STREAM_MIN_BYTES`
    or more goes up as one request streamed in pieces (`gcs_upload`); anything else through the
    filesystem's file object (on GCS, a smaller file in one request of up to `UPLOAD_BLOCK`).
    ``between_chunks()`` is called before each chunk is sent (background uploads wait there),
    ``on_sent(n)`` after. A failure abandons the half-written file (a GCS upload is cancelled,
    never finished). A reply lost after GCS made the object (a reset, a 5xx, a finished
    session's 404) is settled by asking the bucket (`landed`). Checkpoint folders (`Transfers`)
    and single files (`single_file`) both upload through here.
    """
    try:
        return _put_once(folder, local, remote, between_chunks=between_chunks, on_sent=on_sent)
    except Exception as e:
        if not (folder.is_gcs and landed.reply_may_be_lost(e)):
            raise
        return landed.settle(folder.fs, local, remote, e)  # the object sent, or raised for a retry


def _put_once(folder: RunFolder, local: Path, remote: str, *, between_chunks: Callable[[], None],
              on_sent: Callable[[int], None]) -> tuple[int, str]:
    """`put_streamed` without the look at what landed after a lost reply."""
    if folder.is_gcs and local.stat().st_size >= STREAM_MIN_BYTES:
        with contextlib.suppress(gcs_upload.NotStreamable):
            return gcs_upload.upload(folder.fs, local, remote, before_piece=between_chunks, on_sent=on_sent)
    options = {"block_size": UPLOAD_BLOCK} if folder.is_gcs else {}
    checksum = RunningCrc32c()
    sent = 0
    with open(local, "rb") as source:
        target = folder.fs.open(remote, "wb", **options)
        try:
            for chunk in iter(lambda: source.read(CHUNK_SIZE), b""):
                between_chunks()
                target.write(chunk)
                checksum.update(chunk)
                sent += len(chunk)
                on_sent(len(chunk))
        except BaseException:
            _abandon(target)
            raise
        target.close()
    return sent, checksum.hex()


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
    return byte_progress(size, what)  # a bar, or plain lines where a bar would not show
