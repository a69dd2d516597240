"""The one door through which a fetched checkpoint's files come back into memory.

A checkpoint's manifest vouches that its files arrived as they were committed, not that
resumable wrote them: whoever can write the run folder can write both. So before NumPy,
h5py or Keras read a file back, its sizes are bounded here, and whatever they refuse becomes
one `CorruptCheckpointError` line ending "the checkpoint is damaged, an older one will be
used": ``resume()`` and ``BackupAndRestore`` then warn once and use the checkpoint before it.

- ``.npz`` files (``arrays.npz``, ``trainable.npz``): each ``.npy`` header is read and checked
  before its array is allocated: a plain numeric dtype (never an object array: no pickle is
  ever loaded), a shape whose bytes are exactly the member's size, and, given a layout, the
  shape and dtype it names. `read_npz`, `check_npz`.
- zip archives (``.npz``, ``model.keras``): at most `MAX_MEMBERS` members, whose sizes once
  inflated add up to no more than the file's own size plus `SLACK` (resumable, NumPy and
  Keras write them uncompressed): a 1 MB file cannot become a gigabyte in memory.
  `check_zip`.
- HDF5 files (``model.weights.h5``, shards, the weights inside ``model.keras``): their datasets
  add up to no more than the file plus `SLACK` (Keras writes them uncompressed). `check_h5`.
- `refusals`: around NumPy's, h5py's and Keras' own reading (Keras' deserialization and its
  safe mode included): ValueError, TypeError, KeyError, OSError, zip and HDF5 errors become
  the damaged checkpoint's line. Errors of resumable itself (a checkpoint that does not fit
  ``build_model()``) pass unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import io
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np

from resumable.core.display import first_line, human_size, printable
from resumable.core.errors import CorruptCheckpointError, ResumableError
from resumable.keras.checkpoint import zip_member

MIB = 2**20
SLACK = 64 * MIB  # a file may hold at most this much more once inflated than its own size
MAX_MEMBERS = 100_000  # members of one zip: ours hold a few (model.keras) to a few thousand (.npz)
MAX_HEADER = 10_000  # bytes of one .npy header: NumPy's own default limit
NUMERIC_KINDS = frozenset("biufc")  # bool, ints, unsigned, floats, complex: what resumable saves
DAMAGED = "the checkpoint is damaged, an older one will be used"

# What NumPy, zipfile, h5py and Keras raise for a file they will not read (Keras' safe mode:
# ValueError; an unknown class: TypeError; h5py: OSError, KeyError; a config nested too deep:
# RecursionError).
REFUSED: tuple[type[BaseException], ...] = (
    ValueError, TypeError, LookupError, AttributeError, OSError, EOFError, zipfile.BadZipFile, zlib.error,
    struct.error, RecursionError, UnicodeError,
)
# OSErrors that say nothing about the file: the machine's own disk or memory is short.
NOT_THE_FILE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM})
UNSUPPORTED = "resumable does not know"  # compat.unsupported(): this Keras lacks an internal


def damaged(where: str, name: str, problem: str) -> CorruptCheckpointError:
    """The one line for file ``name`` of checkpoint ``where``, which cannot be used."""
    return CorruptCheckpointError(f"{where}: {name} {printable(problem)}; {DAMAGED}")


@contextlib.contextmanager
def refusals(where: str, name: str) -> Iterator[None]:
    """Around a library reading file ``name`` of checkpoint ``where``: whatever it refuses
    (see `REFUSED`) is raised as the damaged checkpoint's CorruptCheckpointError."""
    try:
        yield
    except ResumableError:
        raise
    except REFUSED as e:
        if isinstance(e, OSError) and e.errno in NOT_THE_FILE or str(e).startswith(UNSUPPORTED):
            raise
        raise damaged(where, name, f"cannot be read ({first_line(e)})") from None


# ----------------------------------------------------------------------------- zip archives


def check_zip(path: Path, where: str, name: str | None = None) -> None:
    """CorruptCheckpointError unless ``path`` is a zip archive of at most `MAX_MEMBERS` members
    whose inflated sizes add up to at most its own size plus `SLACK`; nothing is inflated."""
    name = name or path.name
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        members = _member_count(file, size)
        if members is None:
            raise damaged(where, name, "is not a zip archive")
        if members > MAX_MEMBERS:
            raise damaged(where, name, f"holds {members} members, more than any real one ({MAX_MEMBERS})")
        with refusals(where, name), zipfile.ZipFile(file) as archive:
            _check_inflated(archive.infolist(), size, where, name)


def _check_inflated(members: Sequence[zipfile.ZipInfo], size: int, where: str, name: str) -> None:
    inflated = sum(member.file_size for member in members)
    if inflated > size + SLACK:
        raise damaged(where, name, f"would inflate to {human_size(inflated)} from {human_size(size)}, "
                                   "more than resumable ever writes")


_END = struct.Struct("<4s4H2IH")  # end of central directory record: 22 bytes
_END_SIGNATURE = b"PK\x05\x06"
_ZIP64_LOCATOR = struct.Struct("<4sIQI")  # 20 bytes, right before the record above
_ZIP64_END = struct.Struct("<4sQ2H2I4Q")  # 56 bytes
_MAX_COMMENT = 0xFFFF


def _member_count(file: BinaryIO, size: int) -> int | None:
    """How many members the archive's end record declares, read before zipfile builds one
    object per member; None if there is no end record (not a zip archive)."""
    tail_size = min(size, _END.size + _MAX_COMMENT)
    file.seek(size - tail_size)
    tail = file.read(tail_size)
    at = tail.rfind(_END_SIGNATURE)
    if at < 0 or len(tail) - at < _END.size:
        return None
    count = int(_END.unpack_from(tail, at)[4])
    if count != 0xFFFF or at < _ZIP64_LOCATOR.size:
        return count
    signature, _, offset, _ = _ZIP64_LOCATOR.unpack_from(tail, at - _ZIP64_LOCATOR.size)
    if signature != b"PK\x06\x07" or offset + _ZIP64_END.size > size:
        return count
    file.seek(offset)
    record = file.read(_ZIP64_END.size)
    return int(_ZIP64_END.unpack(record)[7]) if record[:4] == b"PK\x06\x06" else count


# ----------------------------------------------------------------------------- .npz files

Layout = Mapping[str, tuple[Sequence[int], str]]  # key -> (shape, dtype name) an .npz must hold


def read_npz(path: Path, where: str, layout: Layout | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, each header checked before its array is allocated (see
    the module docstring); with ``layout``, exactly its keys, shapes and dtypes.
    CorruptCheckpointError for anything else."""
    return dict(_npz_arrays(path, where, layout, read=True))


def check_npz(path: Path, where: str, layout: Layout | None = None) -> None:
    """`read_npz`'s checks, headers only: no array is read."""
    for _ in _npz_arrays(path, where, layout, read=False):
        pass


def _npz_arrays(path: Path, where: str, layout: Layout | None, *, read: bool
                ) -> Iterator[tuple[str, np.ndarray]]:
    check_zip(path, where)
    name = path.name
    with open(path, "rb") as file, refusals(where, name), zipfile.ZipFile(file) as archive:
        keys = []
        for member in archive.infolist():
            if not member.filename.endswith(".npy"):
                raise damaged(where, name, f"holds {member.filename!r}, which is no .npy array")
            key = member.filename[: -len(".npy")]
            keys.append(key)
            with archive.open(member) as stream:
                shape, dtype = _checked_header(stream, member, where, name, key)
            if layout is not None:
                _check_against(layout, key, shape, dtype, where, name)
            if read:
                with archive.open(member) as stream:
                    yield key, np.lib.format.read_array(stream, allow_pickle=False,
                                                        max_header_size=MAX_HEADER)
        if layout is not None and (missing := [key for key in layout if key not in keys]):
            raise damaged(where, name, f"lacks {missing[0]!r}, which the checkpoint's layout names")


def _checked_header(stream: IO[bytes], member: zipfile.ZipInfo, where: str, name: str, key: str
                    ) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The shape and dtype of one member's ``.npy`` header, if its array is one resumable could
    have written and exactly fills the member."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=MAX_HEADER)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=MAX_HEADER)
    else:
        raise damaged(where, name, f"holds {key!r} in .npy format {version}, which resumable never writes")
    if dtype.hasobject or dtype.kind not in NUMERIC_KINDS or dtype.fields is not None:
        raise damaged(where, name, f"holds {key!r} of dtype {dtype}, not numbers (objects are never loaded)")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise damaged(where, name, f"holds {key!r} with shape {shape!r}")
    header = stream.tell() if isinstance(stream, io.IOBase) and stream.seekable() else None
    data = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if header is None or header + data != member.file_size:
        raise damaged(where, name, f"holds {key!r} whose header ({dtype} {tuple(shape)}) does not match its "
                                   f"{human_size(member.file_size)}")
    return tuple(shape), dtype


def _check_against(layout: Layout, key: str, shape: tuple[int, ...], dtype: np.dtype[Any], where: str,
                   name: str) -> None:
    """The array ``key`` as the checkpoint's layout names it: its shape, and its dtype or the
    unsigned integers of its width that stand for a dtype ``.npy`` cannot name (`npy.storable`)."""
    if key not in layout:
        raise damaged(where, name, f"holds {key!r}, which the checkpoint's layout does not name")
    saved_shape, saved_dtype = layout[key]
    expected = _numpy_dtype(saved_dtype)
    if expected is None:
        raise damaged(where, name, f"names dtype {saved_dtype!r}, which NumPy does not know")
    stand_in = np.dtype(f"u{expected.itemsize}")
    if tuple(shape) != tuple(saved_shape) or dtype not in (expected, stand_in):
        raise damaged(where, name, f"holds {key!r} as {dtype} {tuple(shape)}, the layout says {saved_dtype} "
                                   f"{tuple(saved_shape)}")


def _numpy_dtype(name: Any) -> np.dtype[Any] | None:
    """The dtype a layout names; bfloat16 and the float8s once ml_dtypes (Keras' own) named them."""
    for _ in range(2):
        try:
            return np.dtype(name)
        except TypeError:
            try:
                import ml_dtypes  # noqa: F401 - registers its dtypes' names with NumPy
            except ImportError:
                return None
    return None


# ----------------------------------------------------------------------------- HDF5 files


def check_h5(file: str | Path | BinaryIO, size: int, where: str, name: str) -> None:
    """CorruptCheckpointError unless ``file`` (a path or a file object of ``size`` bytes) is an
    HDF5 file whose datasets add up to at most its size plus `SLACK`; no dataset is read."""
    import h5py

    total = 0

    outside: list[str] = []
    links: list[str] = []

    groups: list[tuple[str, Any]] = []

    def add(path: str, item: Any) -> None:
        nonlocal total
        if isinstance(item, h5py.Dataset):
            total += math.prod(item.shape or ()) * item.dtype.itemsize
            if item.external or item.is_virtual:
                outside.append(path)
        else:
            groups.append((path + "/", item))

    with refusals(where, name), h5py.File(file, "r") as h5:
        h5.visititems(add)  # hard links only, each object once
        # A link to another file makes h5py read it: each group's links are looked at, never followed
        # (every h5py 3; visititems_links came in 3.11).
        for prefix, group in [("", h5), *groups]:
            links.extend(prefix + key for key in group
                         if isinstance(group.get(key, getlink=True), h5py.ExternalLink))
    if links:
        raise damaged(where, name, f"links {links[0]!r} to another file")
    if outside:
        raise damaged(where, name, f"reads {outside[0]!r} from outside itself (external or virtual storage)")
    if total > size + SLACK:
        raise damaged(where, name, f"declares {human_size(total)} of weights in {human_size(size)}, "
                                   "more than Keras ever writes")


# ----------------------------------------------------------------------------- a folder


def check_files(folder: Path, where: str, names: Iterable[str], layouts: Mapping[str, Layout] | None = None
                ) -> None:
    """The checks above for each file of ``names`` the fetched ``folder`` holds, by its kind:
    ``.npz`` (with its layout from ``layouts``, if any), ``.keras`` (the archive, then the
    weights inside it) and ``.h5``. Headers and directories only: nothing is loaded."""
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".npz"):
            check_npz(path, where, (layouts or {}).get(name))
        elif name.endswith(".keras"):
            check_keras_file(path, where)
        elif name.endswith(".h5"):
            check_h5(path, path.stat().st_size, where, name)


def check_keras_file(path: Path, where: str, weights: str = "model.weights.h5") -> None:
    """A ``.keras`` archive within bounds (`check_zip`), and the weights stored in it (`check_h5`)."""
    check_zip(path, where)
    with open(path, "rb") as file, refusals(where, path.name), zipfile.ZipFile(file) as archive:
        window = zip_member.stored_member(archive, file, weights)
        if window is not None:  # compressed: bounded by check_zip, read by Keras the usual way
            check_h5(window, archive.getinfo(weights).file_size, where, f"{path.name}'s {weights}")


__all__ = ["DAMAGED", "SLACK", "check_files", "check_h5", "check_keras_file", "check_npz", "check_zip",
           "damaged", "read_npz", "refusals"]
