"""A member of a zip file stored without compression, read in place as a file.

``model.keras`` stores its ``model.weights.h5`` uncompressed. Loading it into a model built by
``build_model`` with Keras' ``load_weights`` reads through ``zipfile``'s member object, which
seeks by reading forward (3x slower than ``load_model``); copying the member out first costs
a write of the whole file. A window onto the member's bytes in the ``.keras`` file itself
costs neither: h5py reads it as any file object.

Written the same way (`write_in_place`): h5py writes the member's bytes straight into the
``.keras`` file being written, after the member's local header, and the zip's records get the
member's size and CRC-32 from the writes themselves (`ChecksummedFile`): the weights are
written once, never to a file of their own first, and never read back.
"""

from __future__ import annotations

import functools
import io
import struct
import zipfile
from collections.abc import Callable
from typing import BinaryIO, cast

from resumable.core.checksum import CRC32_POLY
from resumable.manager import ChecksummedFile

_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # a zip local file header, 30 bytes
_LOCAL_SIGNATURE = b"PK\x03\x04"


class _Window:
    """Seek, tell and read over the bytes ``[start, start + size)`` of an open file: what a
    member read in place and a member written in place share."""

    _file: BinaryIO | ChecksummedFile
    _start: int
    _pos: int
    size: int

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: memoryview | bytearray) -> int:
        view = memoryview(buffer).cast("B")
        wanted = max(0, min(len(view), self.size - self._pos))
        self._file.seek(self._start + self._pos)
        got = cast(io.BufferedIOBase, self._file).readinto(view[:wanted]) or 0
        self._pos += got
        return got


class MemberWindow(_Window, io.BytesIO):  # type: ignore[misc]  # readinto takes the buffers h5py passes
    """The bytes ``[start, start + size)`` of an open binary file, read-only, as a file object.

    A BytesIO only by type: Keras' HDF5 store takes a path or a BytesIO (see
    ``compat.load_weights_from``); every method h5py calls is this class's own, and the
    BytesIO's buffer stays empty.
    """

    def __init__(self, file: BinaryIO, start: int, size: int) -> None:
        super().__init__()
        self._file, self._start, self.size, self._pos = file, start, size, 0

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self.size - self._pos)
        buffer = bytearray(left if size is None or size < 0 else min(size, left))
        return bytes(buffer[: self.readinto(buffer)])

    def write(self, data: object) -> int:
        raise io.UnsupportedOperation("read-only")

    def truncate(self, size: int | None = None) -> int:
        raise io.UnsupportedOperation("read-only")


def stored_member(archive: zipfile.ZipFile, file: BinaryIO, name: str) -> MemberWindow | None:
    """A window onto member ``name`` of ``archive`` (opened from ``file``), or None when it is
    compressed or its local header does not match the central directory: read it the usual way."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    file.seek(info.header_offset)
    header = file.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        return None
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != _LOCAL_SIGNATURE:
        return None
    start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]  # name and extra lengths
    file.seek(0, io.SEEK_END)
    if start + info.file_size > file.tell():
        return None
    return MemberWindow(file, start, info.file_size)


class _Region(_Window, io.RawIOBase):  # type: ignore[misc]  # as MemberWindow
    """The bytes of ``file`` from ``start`` on, as a file of their own (for h5py to write in)."""

    def __init__(self, file: ChecksummedFile, start: int) -> None:
        super().__init__()
        self._file, self._start, self._pos = file, start, 0
        self.size = 0

    def __repr__(self) -> str:
        return repr(self._file)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._file.seek(self._start + self._pos)
        written = self._file.write(data)
        self._pos += written
        self.size = max(self.size, self._pos)
        return written

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        self._file.truncate(self._start + size)
        self.size = size
        return size

    def flush(self) -> None:
        pass


@functools.cache
def can_write_in_place() -> bool:
    """Whether this Python's zipfile lets a member's size and CRC be set after its bytes are in
    place (its member writer's ``_file_size`` and ``_crc``, Python 3.6 to 3.13 at least)."""
    import inspect

    try:
        source = inspect.getsource(zipfile._ZipWriteFile.close)  # type: ignore[attr-defined]
    except (AttributeError, OSError, TypeError):  # renamed, or no source to read
        return False
    return "self._file_size" in source and "self._crc" in source


def abandon(archive: zipfile.ZipFile) -> None:
    """Give up ``archive`` half-written (its file is discarded): closing it, at the end of a
    ``with`` or when it is collected, would otherwise raise "Can't close the ZIP file while there
    is an open writing handle" in place of the error that stopped the writing (a full disk), or
    print that error's traceback from ``ZipFile.__del__``."""
    archive._writing = False  # type: ignore[attr-defined]
    archive.fp = None  # close() then does nothing


def write_in_place(archive: zipfile.ZipFile, file: ChecksummedFile, name: str,
                   write: Callable[[BinaryIO], None]) -> None:
    """Member ``name`` of ``archive`` (writing into ``file``), stored: ``write`` writes its bytes,
    at any offsets, into the file object it is given; its size and CRC-32 come from the writes."""
    member = archive.open(name, "w", force_zip64=True)  # its local header, rewritten on close
    start = file.tell()
    region = _Region(file, start)
    file.zip_crcs = True
    try:
        write(cast(BinaryIO, region))
    except BaseException:
        abandon(archive)
        raise
    finally:
        file.zip_crcs = False
    file.seek(start + region.size)
    member._file_size = member._compress_size = region.size  # type: ignore[attr-defined]
    member._crc = file.crc_of(start, start + region.size, CRC32_POLY)  # type: ignore[attr-defined]
    member.close()
