"""One file at its final name, never seen half-written, with a checksum record next to it.

What `resumable.ModelCheckpoint` writes: a file where Keras would put it (``best.keras``,
``weights-03-0.41.hdf5``) on a local folder, a Google Drive mount, ``gs://`` or any fsspec URL,
and beside it a hidden record, ``.<name>.resumable.json``, with the file's size and CRC32C
(see docs/format.md). Landing a file, in three steps:

1. the record is rewritten to vouch for both the file there now and the new one (its
   ``previous`` entry): whichever of the two a kill leaves at the final name checks out;
2. the file lands whole: locally (Drive included) it is written to ``.<name>.<pid>.partial`` in
   the same folder, fsynced, and renamed over the final name with ``os.replace`` (atomic), then
   the folder is fsynced; on GCS an object only appears when its upload completes; other
   filesystems write through fsspec. The stored copy's size (and CRC32C on GCS) is checked;
3. the record is rewritten for the new file alone.

`verify` re-reads a stored file and compares it with its record; `fetch` downloads it (or
reads it in place, locally) and checks it, raising `CorruptCheckpointError` on a mismatch.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resumable.core import safe_json
from resumable.core.checksum import CHUNK_SIZE, RunningCrc32c
from resumable.core.display import printable
from resumable.core.errors import CorruptCheckpointError, NoSpaceError
from resumable.storage.errors import NO_SPACE_ERRNOS, free_space
from resumable.storage.folder import RunFolder, listed_file
from resumable.storage.local_files import fsync
from resumable.storage.transfers import put_streamed

RECORD_SUFFIX = ".resumable.json"
RECORD_FORMAT = "resumable.file"
RECORD_VERSION = 1
RECORD_LIMIT = safe_json.RECORD_LIMIT  # bytes: a record is a few hundred
_HEX = set("0123456789abcdef")


def record_name(name: str) -> str:
    """The record of file ``name``: ``.<name>.resumable.json`` in the same folder."""
    return f".{name}{RECORD_SUFFIX}"


def split_url(url: str) -> tuple[str, str]:
    """(folder URL, file name) of a file path or URL; a bare name is in the current folder."""
    url = os.fspath(url)
    if "://" in url:
        folder, _, name = url.rpartition("/")
        return folder, name
    path = os.path.abspath(url)
    return os.path.dirname(path), os.path.basename(path)


@dataclass(frozen=True)
class FileRecord:
    """What a record says of its file: size, CRC32C, and what the writer added (epoch, metrics)."""

    name: str
    size: int
    crc32c: str
    details: dict[str, Any]
    previous: FileRecord | None = None  # while the file is being replaced: the one there before

    def to_json(self) -> bytes:
        return (json.dumps(self._body(), indent=1, sort_keys=True, allow_nan=False) + "\n").encode()

    def _body(self) -> dict[str, Any]:
        body = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "file": self.name, "size": self.size,
                "crc32c": self.crc32c, **self.details}
        if self.previous is not None:
            body["previous"] = self.previous._body()
        return body

    @classmethod
    def _parse(cls, body: dict[str, Any]) -> FileRecord:
        """The record of parsed JSON; ValueError or TypeError for a field of the wrong type.

        `safe_json` bounds the nesting, so the ``previous`` chain recursion is bounded too.
        """
        keys = ("format", "version", "file", "size", "crc32c", "previous")
        details = {k: v for k, v in body.items() if k not in keys}
        name, size, crc32c = body["file"], body["size"], body["crc32c"]
        if type(name) is not str or type(size) is not int or not 0 <= size < 2**63:
            raise ValueError(f"file {_shown(name)} of size {_shown(size)}")
        if type(crc32c) is not str or len(crc32c) != 8 or not set(crc32c) <= _HEX:
            raise ValueError(f"crc32c {_shown(crc32c)} is not 8 lowercase hex digits")
        previous = body.get("previous")
        if previous is not None and type(previous) is not dict:
            raise ValueError(f"previous {_shown(previous)} is not an object")
        return cls(name, size, crc32c, details, cls._parse(previous) if previous is not None else None)

    def matching(self, size: int, crc32c: str) -> FileRecord | None:
        """This record, or its previous entry, when it describes a file of this size and CRC32C."""
        if (size, crc32c) == (self.size, self.crc32c):
            return FileRecord(self.name, self.size, self.crc32c, self.details)
        return self.previous.matching(size, crc32c) if self.previous is not None else None

    @classmethod
    def from_json(cls, data: bytes, where: str) -> FileRecord:
        """The record in ``data`` (at most `RECORD_LIMIT` bytes); CorruptCheckpointError if it is none."""
        try:
            body = safe_json.loads(data, RECORD_LIMIT)
            if type(body) is not dict or body.get("format") != RECORD_FORMAT:
                raise ValueError(f"format {_shown(body.get('format') if type(body) is dict else body)}")
            return cls._parse(body)
        except (ValueError, KeyError, TypeError) as e:  # safe_json.RefusedJSON is a ValueError
            raise CorruptCheckpointError(
                f"{where}: unreadable checksum record ({printable(str(e))}); save the file again, or "
                f"delete {record_name(where.rsplit('/', 1)[-1])} to load it unchecked"
            ) from None


class FileTarget:
    """One file URL: its folder (filesystem, retries, one-line errors) and its name."""

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None) -> None:
        self.url = os.fspath(url)
        folder_url, self.name = split_url(self.url)
        self.folder = RunFolder(folder_url, storage_options=storage_options)

    def __repr__(self) -> str:
        return f"FileTarget({self.url!r})"

    @property
    def path(self) -> str:
        return self.folder.path(self.name)

    @property
    def record_path(self) -> str:
        return self.folder.path(record_name(self.name))

    def is_dir(self) -> bool:
        with self.folder.errors(self.url):
            return bool(self.folder.call(lambda: self.folder.fs.isdir(self.path), f"check {self.url}"))

    def exists(self) -> bool:
        with self.folder.errors(self.url):
            return bool(self.folder.call(lambda: self.folder.fs.exists(self.path), f"check {self.url}"))

    # ------------------------------------------------------------------ writing

    def land(self, local: Path, details: dict[str, Any], *,
             between_chunks: Callable[[], None] = lambda: None) -> FileRecord:
        """Put ``local`` at this URL, whole or not at all, then its record; the record written."""
        folder = self.folder
        size, crc32c = _checksum_local(local)
        if folder.is_local:  # what a writer killed mid-copy or mid-record left beside the file
            clear_leftovers(os.path.dirname(self.path), self.name)
        try:
            old = self.read_record()
        except CorruptCheckpointError:
            old = None
        stored = old.matching(*self._stored_checksum()) if old is not None else None
        record = FileRecord(self.name, size, crc32c, details)
        with folder.errors(self.url):
            if stored is not None:  # a kill from here on leaves a file this record vouches for
                both = FileRecord(self.name, size, crc32c, details, previous=stored)
                folder.call(lambda: self._put_bytes(both.to_json(), self.record_path), f"record {self.url}")
            else:
                folder.call(self._drop_record, f"delete the record of {self.url}")
            sent = folder.call(lambda: self._put(local, self.path, between_chunks), f"upload {self.url}")
            if sent != (size, crc32c):
                raise OSError(errno.EIO, f"{local} changed while it was copied to {self.url}")
            folder.call(lambda: self._put_bytes(record.to_json(), self.record_path), f"record {self.url}")
        return record

    def _stored_checksum(self) -> tuple[int, str]:
        """Size and CRC32C of the file at the final name now (GCS: from the listing); (-1, "") if none."""
        fs = self.folder.fs
        try:
            if not self.folder.is_local:
                with contextlib.suppress(AttributeError):
                    fs.invalidate_cache(self.path)
                listed = listed_file(fs.info(self.path))
                if listed.crc32c:
                    return listed.size, listed.crc32c
            with fs.open(self.path, "rb") as f:
                return _checksum_stream(f)
        except FileNotFoundError:
            return -1, ""

    def delete(self) -> None:
        """Delete the file and its record (retention); missing ones are let be."""
        with self.folder.errors(self.url):
            for path in (self.record_path, self.path):
                with contextlib.suppress(FileNotFoundError):
                    self.folder.call(lambda p=path: self.folder.fs.rm_file(p), f"delete {path}")  # type: ignore[misc]

    def _drop_record(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.folder.fs.exists(self.record_path):
                self.folder.fs.rm_file(self.record_path)

    def _put(self, local: Path, remote: str, between_chunks: Callable[[], None]) -> tuple[int, str]:
        if self.folder.is_local:
            return _replace_local(local, remote, between_chunks)
        sent, crc32c = put_streamed(self.folder, local, remote, between_chunks=between_chunks)
        self._check_stored(remote, sent, crc32c)
        return sent, crc32c

    def _put_bytes(self, data: bytes, remote: str) -> None:
        self.folder.replace_file(remote, data)  # locally: temporary file, fsync, os.replace

    def _check_stored(self, remote: str, size: int, crc32c: str) -> None:
        fs = self.folder.fs
        with contextlib.suppress(AttributeError):
            fs.invalidate_cache(remote)
        stored = listed_file(fs.info(remote))
        if stored.size != size or (stored.crc32c and stored.crc32c != crc32c):
            raise OSError(errno.EIO, f"uploaded copy of {remote} differs: {stored.size} bytes, "
                                     f"CRC32C {stored.crc32c}; sent {size} bytes, CRC32C {crc32c}")

    # ------------------------------------------------------------------ reading

    def read_record(self) -> FileRecord | None:
        """The file's record; None when it has none (written by Keras, or killed before the record)."""
        with self.folder.errors(self.url):
            data = self.folder.read(self.record_path, RECORD_LIMIT)  # a larger one is refused unread
        if isinstance(data, FileNotFoundError):
            return None
        if isinstance(data, Exception):
            raise data
        return FileRecord.from_json(data, self.url)

    def verify(self) -> FileRecord | None:
        """Re-read the stored file and compare it with its record (CorruptCheckpointError if not equal)."""
        record = self.read_record()
        if record is None:
            return None
        with self.folder.errors(self.url):
            def read() -> tuple[int, str]:
                checksum = RunningCrc32c()
                size = 0
                with self.folder.fs.open(self.path, "rb") as f:
                    for chunk in iter(lambda: f.read(CHUNK_SIZE), b""):
                        checksum.update(chunk)
                        size += len(chunk)
                return size, checksum.hex()

            try:
                size, crc32c = self.folder.call(read, f"read {self.url}")
            except FileNotFoundError:
                size, crc32c = -1, "missing"
        return _compare(self.url, record, size, crc32c)

    def fetch(self, local_dir: Path) -> tuple[Path, FileRecord | None]:
        """A local copy to load (locally: the file itself) and its record, checked against each other."""
        record = self.read_record()
        if self.folder.is_local:
            path = Path(self.path)
            if not path.is_file():
                raise FileNotFoundError(errno.ENOENT, "no such file", self.url)
        else:
            path = self._download(local_dir / self.name)
        if record is not None:
            with open(path, "rb") as f:
                record = _compare(self.url, record, *_checksum_stream(f))
        return path, record

    def _download(self, path: Path) -> Path:
        """The file downloaded to ``path`` through ``<name>.part``: never left half-written."""
        partial = path.with_name(path.name + ".part")

        def download() -> None:
            try:
                self.folder.fs.get_file(self.path, str(partial))
            except OSError as e:  # told apart here, before `folder.errors` blames the remote file
                if e.errno in NO_SPACE_ERRNOS:
                    free = free_space(str(path.parent))
                    raise NoSpaceError(
                        f"{path.parent}: no space left on this machine's disk to download {self.url} into"
                        f"{f' ({free[2:]})' if free else ''}; free space there and load it again"
                    ) from None
                raise

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with self.folder.errors(self.url):
                self.folder.call(download, f"download {self.url}")
            os.replace(partial, path)
        except BaseException:  # a failed or interrupted download (Ctrl-C included)
            with contextlib.suppress(OSError):
                partial.unlink()
            raise
        return path


def _checksum_local(path: Path) -> tuple[int, str]:
    with open(path, "rb") as f:
        return _checksum_stream(f)


def _checksum_stream(f: Any) -> tuple[int, str]:
    checksum = RunningCrc32c()
    size = 0
    for chunk in iter(lambda: f.read(CHUNK_SIZE), b""):
        checksum.update(chunk)
        size += len(chunk)
    return size, checksum.hex()


def _compare(url: str, record: FileRecord, size: int, crc32c: str) -> FileRecord:
    """The entry of ``record`` the file matches; CorruptCheckpointError when none does."""
    found_entry = record.matching(size, crc32c)
    if found_entry is not None:
        return found_entry
    found = "missing" if size < 0 else f"{size} bytes, CRC32C {crc32c}"
    raise CorruptCheckpointError(
        f"{url} does not match its checksum record {record_name(record.name)} "
        f"({record.size} bytes, CRC32C {record.crc32c}; found {found}): damaged or replaced"
    )


def _replace_local(local: Path, final: str, between_chunks: Callable[[], None]) -> tuple[int, str]:
    """Copy to a hidden temporary file beside ``final``, fsync, rename over it, fsync the folder."""
    folder, name = os.path.split(final)
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.partial")
    checksum = RunningCrc32c()
    size = 0
    try:
        with open(local, "rb") as source, open(temporary, "wb") as target:
            for chunk in iter(lambda: source.read(CHUNK_SIZE), b""):
                between_chunks()
                target.write(chunk)
                checksum.update(chunk)
                size += len(chunk)
        fsync(temporary)
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync(folder)
    return size, checksum.hex()


def leftover_owner(name: str) -> tuple[str, int] | None:
    """``(file name, writer's pid)`` when ``name`` is a temporary copy a writer makes beside a file:
    ``.<name>.<pid>.partial`` (the file) or ``.<name>.resumable.json.<pid>.tmp`` (its record); else None."""
    for suffix, hidden in ((".partial", True), (".tmp", False)):
        if not name.endswith(suffix):
            continue
        stem, _, pid = name[: -len(suffix)].rpartition(".")
        if hidden and stem.startswith("."):
            stem = stem[1:]
        elif not hidden and stem.startswith(".") and stem.endswith(RECORD_SUFFIX):
            stem = stem[1: -len(RECORD_SUFFIX)]
        else:
            continue
        if stem and pid.isdigit():
            return stem, int(pid)
    return None


def clear_leftovers(folder: str, name: str) -> None:
    """Delete the temporary copies of file ``name`` and of its record that a killed writer left
    in the local ``folder`` (or this process, after an error); a live writer's are let be."""
    for pattern in (f".{glob.escape(name)}.*.partial", f"{glob.escape(record_name(name))}.*.tmp"):
        for stale in glob.glob(os.path.join(glob.escape(folder), pattern)):
            owner = leftover_owner(os.path.basename(stale))
            if owner is not None and owner[0] == name and (owner[1] == os.getpid() or not _alive(owner[1])):
                with contextlib.suppress(OSError):
                    os.unlink(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


__all__ = ["RECORD_SUFFIX", "FileRecord", "FileTarget", "clear_leftovers", "leftover_owner", "record_name",
           "split_url"]


def _shown(value: Any) -> str:
    """A value as an error message quotes it: short, one line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
