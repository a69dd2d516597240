"""New local files checksummed as they are written: each byte written once and never read back.

A checkpoint's files are written where they will live (a local or Drive run's not yet committed
checkpoint folder, or one staging folder before a ``gs://`` upload), each through a
`ChecksummedFile`: a seekable binary file that computes the CRC32C of what the file holds once
closed from the writes themselves. HDF5 writes out of order and rewrites its headers, so each
big write's checksum is kept with its place in the file, small writes (headers, a zip's
records) are kept in memory until the file closes, and the pieces' checksums are joined in file
order (`checksum.combine`); a hole HDF5 never wrote reads as zeros and is checksummed as such.
Only a big write later cut by another would need its surviving bytes read back (`reread`
counts them; the tests hold it at zero for every file a checkpoint writes). A big write is
hashed in a second thread while this one writes it (zlib's CRC-32 and the write both let go of
the GIL): the last save of a ``fit``, which training waits for, takes the longer of the two, not
their sum.

`WrittenFiles` creates the files of one folder (exclusive creates, never through a link below
a run folder's root) and hands back each file's size and CRC32C for the manifest.
"""

from __future__ import annotations

import bisect
import io
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from resumable.core.checksum import CRC32_POLY, CRC32C_POLY, combine, crc32c_of_bytes
from resumable.core.manifest import FileEntry
from resumable.storage.local_files import make_parents_inside, open_inside, read_inside

SMALL_WRITE = 64 * 1024  # writes below this are kept until the file closes; bigger ones hashed at once
_ZEROS = bytes(2**20)
_PIECE = 2**20  # bytes copied at a time to be hashed

Buffer = bytes | bytearray | memoryview  # what is written: any bytes-like

_hashers: dict[int, ThreadPoolExecutor] = {}


def _hasher() -> ThreadPoolExecutor:
    """The thread that hashes big writes beside the one writing them, shared by every file (a
    save writes one file at a time). One per process: a forked child has none of its parent's
    threads."""
    pid = os.getpid()
    if pid not in _hashers:
        _hashers[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resumable-hash")
    return _hashers[pid]


def _crc(poly: int, data: Buffer, crc: int = 0) -> int:
    view = memoryview(data).cast("B")
    if poly == CRC32_POLY:
        return zlib.crc32(view, crc)
    if isinstance(data, bytes):
        return int(google_crc32c.extend(crc, data))
    # google_crc32c takes bytes only: copied a cache-sized piece at a time
    for at in range(0, len(view), _PIECE):
        crc = int(google_crc32c.extend(crc, view[at:at + _PIECE].tobytes()))
    return crc


@dataclass
class _Piece:
    """Bytes ``start`` to ``end`` of the file: held (``data``), or hashed when written (``crcs``),
    or neither (a hashed piece another write cut: read back at close)."""

    start: int
    end: int
    data: bytes | None = None
    crcs: dict[int, int] | None = None

    def part(self, start: int, end: int) -> _Piece:
        if self.data is not None:
            return _Piece(start, end, self.data[start - self.start:end - self.start])
        return _Piece(start, end)  # what a hashed piece keeps of itself has no checksum


class ChecksummedFile(io.RawIOBase):
    """A new local file, written at any offset, whose size and CRC32C come from its writes.

    ``zip_crcs``: also compute zlib's CRC-32 of big writes from then on (`crc_of` a zip member's
    bytes, which a zip's records need). `reread` is the bytes `crc_of` had to read back.
    """

    def __init__(self, fd: int, name: str) -> None:
        super().__init__()
        self._fd = fd
        self.name = name
        self._pos = 0
        self._size = 0
        self._pieces: list[_Piece] = []
        self._starts: list[int] = []
        self.zip_crcs = False
        self.reread = 0
        self.entry: FileEntry | None = None  # once closed

    def __repr__(self) -> str:  # h5py names a file object's HDF5 file after it
        return self.name

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Buffer) -> int:  # type: ignore[override]  # HDF5 may read what it wrote: served from the file
        view = memoryview(buffer).cast("B")
        data = os.pread(self._fd, len(view), self._pos)
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def write(self, data: Buffer) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        size = len(view)
        if not size:
            return 0
        start = self._pos
        if size >= SMALL_WRITE:
            polys = (CRC32C_POLY, CRC32_POLY) if self.zip_crcs else (CRC32C_POLY,)
            hashed = _hasher().submit(lambda: {poly: _crc(poly, view) for poly in polys})
            try:
                self._write_at(view, start)
            finally:  # the caller may reuse its buffer once this returns: the hash is done first
                crcs = hashed.result()
            self._place(_Piece(start, start + size, crcs=crcs))
        else:
            self._write_at(view, start)
            self._place(_Piece(start, start + size, data=bytes(view)))
        self._pos = start + size
        self._size = max(self._size, self._pos)
        return size

    def _write_at(self, view: memoryview, start: int) -> None:
        written = 0
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], start + written)

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        os.ftruncate(self._fd, size)
        if size < self._size:
            self._place(_Piece(size, self._size))  # cut what lies beyond...
            self._pieces.pop(bisect.bisect_left(self._starts, size))  # ...and forget it
            self._starts = [p.start for p in self._pieces]
        self._size = size
        return size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.entry = FileEntry(self._size, f"{self.crc_of(0, self._size):08x}")
        finally:
            os.close(self._fd)
            super().close()

    def crc_of(self, start: int, end: int, poly: int = CRC32C_POLY) -> int:
        """The CRC of bytes ``start`` to ``end`` as the file holds them now, from its writes."""
        crc = 0
        held: list[bytes] = []  # consecutive held bytes, hashed together
        for piece_start, piece_end, piece in self._walk(start, end):
            if piece is not None and piece.data is not None:
                held.append(piece.data[piece_start - piece.start:piece_end - piece.start])
                continue
            if held:
                crc = _crc(poly, b"".join(held), crc)
                held = []
            if piece is None:  # a hole: zeros
                for at in range(piece_start, piece_end, len(_ZEROS)):
                    crc = _crc(poly, _ZEROS[:min(len(_ZEROS), piece_end - at)], crc)
            elif (piece.crcs is not None and poly in piece.crcs and piece_start == piece.start
                  and piece_end == piece.end):
                crc = combine(crc, piece.crcs[poly], piece_end - piece_start, poly)
            else:  # cut by a later write, or hashed before zip_crcs: read back
                for at in range(piece_start, piece_end, 2**24):
                    chunk = os.pread(self._fd, min(2**24, piece_end - at), at)
                    self.reread += len(chunk)
                    crc = _crc(poly, chunk, crc)
        if held:
            crc = _crc(poly, b"".join(held), crc)
        return crc

    def _walk(self, start: int, end: int) -> Iterator[tuple[int, int, _Piece | None]]:
        """(from, to, piece) covering ``start`` to ``end`` in order; piece None for a hole."""
        at = start
        first = max(bisect.bisect_right(self._starts, start) - 1, 0)
        for piece in self._pieces[first:]:
            if piece.start >= end:
                break
            if piece.end <= at:
                continue
            if piece.start > at:
                yield at, piece.start, None
                at = piece.start
            to = min(piece.end, end)
            yield at, to, piece
            at = to
        if at < end:
            yield at, end, None

    def _place(self, new: _Piece) -> None:
        """Put ``new`` in the map of pieces, cutting those it overlaps."""
        lo = max(bisect.bisect_right(self._starts, new.start) - 1, 0)
        if lo < len(self._pieces) and self._pieces[lo].end <= new.start:
            lo += 1
        hi = bisect.bisect_left(self._starts, new.end)
        replaced = [new]
        if lo < hi:
            first, last = self._pieces[lo], self._pieces[hi - 1]
            if first.start < new.start:
                replaced.insert(0, first.part(first.start, new.start))
            if last.end > new.end:
                replaced.append(last.part(new.end, last.end))
        self._pieces[lo:hi] = replaced
        self._starts[lo:hi] = [p.start for p in replaced]


class WrittenFiles:
    """The new files of one folder, each checksummed as it is written (`ChecksummedFile`).

    ``root``: a run folder the files are below: each folder on the way is made and opened
    without following a link, and each file is an exclusive create (never through a link,
    never over another file's data). Without it, the folder is a private staging folder.
    """

    def __init__(self, folder: Path, root: str | None = None) -> None:
        self.folder = folder
        self._root = root
        self._files: dict[str, ChecksummedFile] = {}
        self._adopted: dict[str, FileEntry] = {}
        self.adopted = 0  # bytes of adopted files, read to checksum them

    def create(self, rel: str) -> ChecksummedFile:
        """A new file ``rel`` (a path below the folder) to write; closed, it is in `entries`."""
        path = str(self.folder / rel)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        if self._root is not None:
            make_parents_inside(self._root, path)
            fd = open_inside(self._root, path, flags)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, flags, 0o666)
        file = ChecksummedFile(fd, path)
        self._files[rel] = file
        return file

    def write_bytes(self, rel: str, data: bytes) -> None:
        with self.create(rel) as file:
            file.write(data)

    def adopt(self, rel: str) -> None:
        """Add a small file another library wrote itself into the folder (Keras' shard map):
        read once to checksum it; `adopted` counts those bytes."""
        path = str(self.folder / rel)
        data = read_inside(self._root, path) if self._root is not None else Path(path).read_bytes()
        self.adopted += len(data)
        self._adopted[rel] = FileEntry(len(data), crc32c_of_bytes(data))

    def close(self) -> None:
        """Close every file still open (after a failure: the files are left as they are)."""
        for file in self._files.values():
            file.close()

    @property
    def reread(self) -> int:
        """Bytes read back to checksum them: zero unless a big write was cut by a later one."""
        return sum(file.reread for file in self._files.values())

    @property
    def entries(self) -> dict[str, FileEntry]:
        """Each file's size and CRC32C, by path below the folder (every file closed)."""
        open_files = [rel for rel, file in self._files.items() if file.entry is None]
        if open_files:
            raise RuntimeError(f"files still open: {', '.join(open_files)}")
        entries = {rel: file.entry for rel, file in self._files.items() if file.entry is not None}
        return dict(sorted({**entries, **self._adopted}.items()))


__all__ = ["SMALL_WRITE", "ChecksummedFile", "WrittenFiles"]
