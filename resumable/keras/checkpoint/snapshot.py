"""A checkpoint held in host memory: taken while training waits, written to files later.

Training waits only for `take`: Keras' own traversal of what ``model.save`` would write, each
variable's value copied to host memory as it goes, and the model's config. `ModelSnapshot.write`
then writes, in any thread and while training goes on, the files `model_to_files.save` documents:
``model.keras`` (or ``model.weights.h5``), ``state.json`` and ``arrays.npz``, which plain
``keras.saving.load_model`` and ``model.load_weights`` read. The values are those of the step
the snapshot was taken at, so a resume from it is as exact as from a synchronous save.

Weights over ``max_shard_size`` GiB are written as Keras' sharded weights instead: the map
``model.weights.json`` and shards ``model_00000.weights.h5``, ... of at most that size (the
biggest single variable, when it is bigger), which ``model.load_weights("model.weights.json")``
reads; a full model adds what an unzipped ``.keras`` holds beside them (``config.json``,
``metadata.json``, ``assets/``). Each shard is a file of its own in the manifest, with its own
checksum, moved concurrently with the others and loaded one at a time.

Each file is written once, where it stays, and checksummed (CRC32C) as it is written: `write`
hands back each file's size and checksum for the manifest, and nothing is read back.

A save has a memory budget (#54, `memory_budget`): a checkpoint over it is copied only in
part. The variables that fit the budget, counted from the end of the save order, are copied;
the others stay references to the live variables (`LiveValue`), each read to host memory only
as `write` reaches it and let go once written (``streamed``). `write` writes in save order, so
training waits only until the live part is written (``live_written``); the copied tail is
written after it while training goes on. Never more than one variable's copy held at a time
beyond the budget (a slice of it, for a big one: `compat.write_weights`), the same files byte
for byte.

On a Keras without the internals this needs (`compat.saved_values`), `take` returns None and
the caller serializes the usual way.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
import tempfile
import threading
import weakref
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from resumable.core.manifest import FileEntry
from resumable.keras import compat
from resumable.keras.checkpoint import zip_member
from resumable.manager import ChecksummedFile, WrittenFiles

MODEL_FILE = "model.keras"
WEIGHTS_FILE = "model.weights.h5"
SHARDS_FILE = "model.weights.json"  # Keras' map of sharded weights, beside model_00000.weights.h5, ...
SHARD_NAME = re.compile(r"model_[0-9]{5,}\.weights\.h5")  # as Keras' ShardedH5IOStore names them
CONFIG_FILE = "config.json"  # an unzipped .keras: config.json, metadata.json, assets/
METADATA_FILE = "metadata.json"
ASSETS_FOLDER = "assets"
STATE_FILE = "state.json"
ARRAYS_FILE = "arrays.npz"
SPACE_MARGIN = 4 * 2**20  # bytes beyond the values: HDF5's and the zip's own records, state.json
GIB = 2**30  # Keras' max_shard_size counts in these
SLICE_BYTES = 16 * 2**20  # a live variable bigger than this is read and written in slices of about this


@dataclass
class ModelSnapshot:
    """The values, config and state of one checkpoint, in memory; `write` makes its files."""

    values: list[compat.SavedValue]
    model_json: tuple[str, str] | None  # config.json and metadata.json; None: weights only
    state: dict[str, Any]  # JSON-ready: state.json
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    assets: Path | None = None  # a temporary folder of the model's assets, if it has any
    max_shard_size: float | None = None  # GiB; weights over this are written in shards
    streamed: bool = False  # over its memory budget: values read as written, while training waits
    copied_bytes: int = 0  # of a streamed snapshot: the variables copied (a tail of the save order)
    live_written: threading.Event = field(default_factory=threading.Event)  # set once the live part is

    @property
    def partial(self) -> bool:
        """Streamed, with a tail copied: training waits for the live part of `write` only."""
        return self.streamed and self.copied_bytes > 0

    @property
    def sharded(self) -> bool:
        """Whether the weights go to shards: bigger than ``max_shard_size``, on a Keras that shards."""
        return (self.max_shard_size is not None and self.nbytes > self.max_shard_size * GIB
                and compat.can_shard())

    @property
    def payload(self) -> str:
        """The file a loader opens (the manifest's ``payload``)."""
        return SHARDS_FILE if self.sharded else WEIGHTS_FILE if self.model_json is None else MODEL_FILE

    @property
    def nbytes(self) -> int:
        """The values' bytes: what a background save holds on top of training (a streamed one
        holds one variable's at a time)."""
        held = sum(int(getattr(v.value, "nbytes", 0)) for v in self.values)
        return held + sum(int(a.nbytes) for a in self.arrays.values())

    @property
    def space_needed(self) -> int:
        """Disk bytes `write` needs: each byte is written once, where it stays."""
        return self.nbytes + SPACE_MARGIN

    def fits_in(self, folder: Path) -> bool:
        """True when the disk holding ``folder`` (or its nearest existing parent) has the space."""
        existing = folder
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        return shutil.disk_usage(existing).free >= self.space_needed

    def write(self, folder: Path, root: str | None = None) -> dict[str, FileEntry]:
        """Write the checkpoint's files into ``folder``; each one's size and CRC32C, by name.

        Each file is written once, where it stays, and checksummed as it is written
        (`WrittenFiles`): the weights go straight into the ``.keras`` zip, never through a
        file of their own. ``root``: a run folder ``folder`` is below (nothing is written
        through a link below it; every file is a new one). OSError(ENOSPC) before anything is
        written when the disk cannot hold them: HDF5 can crash the process when it closes a
        file whose writes failed for want of space.
        """
        files = WrittenFiles(folder, root)
        try:
            if not self.fits_in(folder):
                raise OSError(errno.ENOSPC, f"{self.space_needed:,} bytes needed", str(folder))
            if self.sharded:
                self._write_shards(files, folder)
            elif self.model_json is None:
                with files.create(WEIGHTS_FILE) as weights:
                    compat.write_weights(self.values, weights)
            else:
                with files.create(MODEL_FILE) as archive:
                    self._write_archive(archive)
            files.write_bytes(STATE_FILE, json.dumps(self.state, indent=1).encode())
            if self.arrays:
                with files.create(ARRAYS_FILE) as arrays:
                    np.savez(arrays, **self.arrays)  # type: ignore[arg-type]
        finally:
            files.close()
            self.live_written.set()  # written or failed: whoever waits for the live part goes on
        return files.entries

    def _write_shards(self, files: WrittenFiles, folder: Path) -> None:
        """Keras' sharded weights and, for a full model, an unzipped ``.keras``'s other files."""
        assert self.max_shard_size is not None
        if self.model_json is not None:
            config, metadata = self.model_json
            files.write_bytes(CONFIG_FILE, config.encode())
            files.write_bytes(METADATA_FILE, metadata.encode())
            if self.assets is not None:
                for path in sorted(self.assets.rglob("*")):
                    if path.is_file():
                        files.write_bytes(f"{ASSETS_FOLDER}/{path.relative_to(self.assets).as_posix()}",
                                          path.read_bytes())
        # Keras refuses a variable bigger than a shard; here it gets a shard of its own.
        biggest = max((int(getattr(v.value, "nbytes", 0)) for v in self.values), default=0)
        compat.write_sharded_weights(self.values, str(folder / SHARDS_FILE),
                                     max(self.max_shard_size, biggest / GIB), create=files.create)
        files.adopt(SHARDS_FILE)  # the map Keras writes itself: a few hundred bytes per variable

    def _write_archive(self, file: ChecksummedFile) -> None:
        """A ``.keras`` zip as ``model.save`` writes it: metadata, config, weights, assets; the
        weights written by h5py straight into the zip (`zip_member.write_in_place`)."""
        assert self.model_json is not None
        config, metadata = self.model_json
        with zipfile.ZipFile(file, "w") as archive:
            archive.writestr("metadata.json", metadata)
            archive.writestr("config.json", config)
            if zip_member.can_write_in_place():
                zip_member.write_in_place(archive, file, WEIGHTS_FILE,
                                          lambda weights: compat.write_weights(self.values, weights))
            else:  # a zipfile without the writer's internals: a temporary weights file, copied in
                with tempfile.TemporaryDirectory(prefix="resumable-weights-") as folder:
                    compat.write_weights(self.values, f"{folder}/{WEIGHTS_FILE}")
                    archive.write(f"{folder}/{WEIGHTS_FILE}", WEIGHTS_FILE)
            if self.assets is not None:
                _add_folder(archive, self.assets, "assets")


def _add_folder(archive: zipfile.ZipFile, folder: Path, name: str) -> None:
    """Every file under ``folder`` into ``archive``, under ``name/``."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            archive.write(path, f"{name}/{path.relative_to(folder).as_posix()}")


def take(model: keras.Model, *, weights_only: bool, state: dict[str, Any],
         arrays: dict[str, np.ndarray], max_shard_size: float | None = None,
         budget: int | None = None, copy_part: bool = True) -> ModelSnapshot | None:
    """Copy what a checkpoint of ``model`` holds into host memory; None without Keras' internals.

    ``budget``: the bytes the copy may take (None: no limit). Over it, only the variables that fit,
    counted from the end of the save order, are copied (none without ``copy_part``): the
    snapshot is ``streamed``, its live part to be written at once, while training waits
    (`ModelSnapshot.live_written`).
    """
    assets = None if weights_only else Path(tempfile.mkdtemp(prefix="resumable-assets-"))
    try:
        values = compat.saved_values(model, _live_or_copy, str(assets) if assets is not None else None)
        if values is None:
            return None
        held = (sum(int(getattr(v.value, "nbytes", 0)) for v in values)
                + sum(int(a.nbytes) for a in arrays.values()))
        streamed = budget is not None and held > budget
        copied_bytes = 0
        live_written = threading.Event()
        if not streamed:
            values = [v._replace(value=_host_copy(v.value.variable)) if isinstance(v.value, LiveValue) else v
                      for v in values]
        elif copy_part:
            assert budget is not None
            values, copied_bytes = _copy_tail(values, budget - held + _live_bytes(values), live_written)
        model_json = None if weights_only else compat.model_json(model)
    except BaseException:
        if assets is not None:
            shutil.rmtree(assets, ignore_errors=True)
        raise
    if assets is not None and not any(assets.iterdir()):
        shutil.rmtree(assets, ignore_errors=True)
        assets = None
    taken = ModelSnapshot(values, model_json, state, arrays, assets, max_shard_size, streamed, copied_bytes,
                          live_written)
    if assets is not None:  # a snapshot dropped unwritten (a newer one replaced it) leaves nothing
        weakref.finalize(taken, shutil.rmtree, assets, True)
    return taken


def _live_bytes(values: list[compat.SavedValue]) -> int:
    return sum(v.value.nbytes for v in values if isinstance(v.value, LiveValue))


def _copy_tail(values: list[compat.SavedValue], room: int,
               live_written: threading.Event) -> tuple[list[compat.SavedValue], int]:
    """The values with the variables that fit ``room`` bytes copied, counted from the end (a
    write in save order is then past the live ones when it reaches the copies); the bytes copied.

    The first variable copied sets ``live_written`` when the write reads it: everything before
    it is written by then, and training may go on.
    """
    copied = list(values)
    first = None
    used = 0
    for i in range(len(values) - 1, -1, -1):
        value = values[i].value
        if not isinstance(value, LiveValue):
            continue  # a host copy already (counted in the room)
        if used + value.nbytes > room:
            break
        used += value.nbytes
        copied[i] = values[i]._replace(value=_host_copy(value.variable))
        first = i
    if first is None:
        return values, 0
    copied[first] = copied[first]._replace(value=_Released(copied[first].value, live_written))
    return copied, used


class _Released:
    """The first copied value of a partly copied snapshot: read by the write, it says that the
    live part before it is written (``event``)."""

    __slots__ = ("array", "event", "nbytes")

    def __init__(self, array: np.ndarray, event: threading.Event) -> None:
        self.array = array
        self.event = event
        self.nbytes = array.nbytes

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.event.set()
        return self.array if dtype is None else self.array.astype(dtype, copy=False)


class LiveValue:
    """A variable recorded for a streamed snapshot: read to host memory when written
    (``np.asarray``), each time afresh, and held no longer than its write. One over
    `SLICE_BYTES` whose whole read would be a copy (a GPU's, a TPU's, torch's) is read and
    written in slices of rows instead (``slice_rows``, `read`), so that a save's host memory
    stays within its budget and one slice even for one big embedding."""

    __slots__ = ("variable", "nbytes", "shape", "dtype", "slice_rows")

    def __init__(self, variable: keras.Variable) -> None:
        self.variable = variable
        self.shape = tuple(int(n) for n in variable.shape)
        self.dtype = _numpy_dtype(variable.dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        row = self.nbytes // self.shape[0] if self.shape and self.shape[0] else 0
        sliced = row and self.nbytes > SLICE_BYTES and not whole_read_is_free(variable)
        self.slice_rows = max(1, SLICE_BYTES // row) if sliced else None

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = _host_copy(self.variable)
        return array if dtype is None else array.astype(dtype, copy=False)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the first axis, as a host array."""
        return np.asarray(keras.ops.convert_to_numpy(self.variable.value[start:stop]), self.dtype)


def whole_read_is_free(variable: keras.Variable) -> bool:
    """Whether reading the whole variable to the host copies nothing: a TensorFlow or JAX
    variable on the CPU, which `_host_copy` views (slices would copy). A GPU's or TPU's, or
    torch's, is read in slices."""
    backend = keras.backend.backend()
    try:
        value = variable.value
        if backend == "tensorflow":
            return "CPU" in str(getattr(value, "device", "")).upper()
        if backend == "jax":
            devices = getattr(value, "devices", None)
            return callable(devices) and all(d.platform == "cpu" for d in devices())
    except Exception:  # noqa: BLE001 - a value that cannot say where it lives (a distributed one): sliced
        return False
    return False


def _numpy_dtype(dtype: Any) -> np.dtype[Any]:
    name = keras.backend.standardize_dtype(dtype)
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16, float8_*: NumPy knows them through ml_dtypes, as Keras does
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _live_or_copy(value: Any) -> Any:
    """What the traversal records: a variable as itself (`LiveValue`, copied or not once the
    snapshot's size is known), any other value as a host copy now."""
    return LiveValue(value) if isinstance(value, keras.Variable) else _host_copy(value)


def _host_copy(value: Any) -> np.ndarray:
    """The value as a host array that training can no longer change, without copying if it can.

    A JAX array is immutable (each step makes new ones; a GPU's or TPU's is copied to the
    host here) and a CPU buffer a NumPy view holds is never donated to the next step. A
    TensorFlow variable's read shares its buffer until the next update, which then writes a
    new one (copy on write). Either way the view keeps the values of this step, and
    training pays at most one copy, not two. Other backends' values are copied.
    tests/jobs/snapshot_job.py checks the written values against the step's on both backends.
    """
    raw = value.value if isinstance(value, keras.Variable) else value
    backend = keras.backend.backend()
    if backend == "jax":
        return np.asarray(raw)
    if backend == "tensorflow" and hasattr(raw, "read_value"):  # any tf.Variable
        return compat.shared_buffer(np.asarray(raw.read_value()))  # a load must not write into it
    return np.array(keras.ops.convert_to_numpy(value), copy=True)
