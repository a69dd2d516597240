"""Variables split across the processes of a multi-host job, to files and back, through TensorStore.

Each variable is a zarr array (format 2, uncompressed) in a folder of its own: ``.zarray``
(shape, dtype, and the chunk shape, one device's shard at save time), written by process 0,
and one file per chunk, named by its place in the chunk grid (``0.3``: row 0, column 3;
``0`` for a scalar), written by the process whose device holds replica 0 of that shard. So
each process writes only what it holds, and no process ever holds a whole split variable.

TensorStore does the array I/O both ways; this module only says what a process writes, and on
restore which chunk files the shards of its devices need under the current layout (another
mesh, another number of processes: TensorStore reads the overlapping parts of the saved
chunks). A chunk file a read needs and does not find is an error, never zeros
(``fill_missing_data_reads: false``).
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from resumable.core.errors import ResumableError

Index = tuple[slice, ...]


@dataclass
class OwnedShards:
    """What one process writes of one variable: its shards (copied to host memory) and the layout."""

    shape: tuple[int, ...]
    dtype: str  # as TensorStore and JAX name it: "float32", "bfloat16", ...
    chunks: tuple[int, ...]
    shards: list[tuple[Index, np.ndarray]]

    @property
    def nbytes(self) -> int:
        return sum(int(data.nbytes) for _, data in self.shards)


def check_installed() -> None:
    """ResumableError in one line when TensorStore, which writes and reads the parts, is missing."""
    if importlib.util.find_spec("tensorstore") is None:
        raise ResumableError(
            "resumable: a model split across processes is saved with TensorStore, which is not installed: "
            "pip install tensorstore (Colab's runtimes have it, with orbax-checkpoint)")


def owned(value: Any, process_index: int) -> list[Any]:
    """The shards of ``value`` (a ``jax.Array``) this process writes: replica 0 of each, on
    whichever device holds it; of an array every process holds whole (fully addressable),
    process 0 alone writes it."""
    if value.is_fully_addressable and process_index != 0:
        return []
    return [shard for shard in value.addressable_shards if shard.replica_id == 0]


def start_transfers(values: Iterable[Any], process_index: int) -> None:
    """Start copying every shard this process writes to host memory, all at once (as Orbax
    does): on an accelerator the copies overlap, and `take` then only waits for them."""
    for value in values:
        for shard in owned(value, process_index):
            shard.data.copy_to_host_async()


def take(value: Any, process_index: int) -> OwnedShards:
    """The shards of ``value`` this process writes, in host memory now (what training waits for).

    On an accelerator the arrays are host copies; on JAX's CPU backend they view the device
    buffers, which stay as they are: JAX does not donate a buffer an array still views to the
    next step (it allocates a new one), as Orbax relies on too.
    """
    shape = tuple(int(d) for d in value.shape)
    chunks = tuple(max(1, int(d)) for d in value.sharding.shard_shape(shape))
    shards = [(shard.index, np.asarray(shard.data)) for shard in owned(value, process_index)]
    return OwnedShards(shape, _dtype_name(value.dtype), chunks, shards)


def write(folder: Path, owned: OwnedShards, *, create: bool) -> None:
    """Write ``owned`` into the zarr array at ``folder``; ``create``: also its ``.zarray`` (process 0)."""
    import tensorstore as ts

    spec = {
        "driver": "zarr", "kvstore": {"driver": "file", "path": str(folder)}, "dtype": owned.dtype,
        "metadata": {"shape": list(owned.shape), "chunks": list(owned.chunks), "compressor": None},
    }
    if create:
        store = ts.open(spec, create=True, open=True).result()
    elif owned.shards:
        store = ts.open(spec, open=True, assume_metadata=True).result()
    else:
        return
    # The snapshot's copies are never changed: TensorStore may write from them without a copy of its own.
    writes = [store[index].write(data, can_reference_source_data_indefinitely=True)
              for index, data in owned.shards]
    for pending in writes:
        pending.result()


def chunk_files(metadata: dict[str, Any], indices: Iterable[Index], limit: int | None = None) -> set[str]:
    """Names of the chunk files (as zarr names them) holding the parts ``indices`` select of an
    array with this ``.zarray`` ``metadata``; ValueError when a part would need more than
    ``limit`` of them (metadata no checkpoint of this size can hold)."""
    shape = [int(d) for d in metadata["shape"]]
    chunks = [max(1, int(d)) for d in metadata["chunks"]]
    separator = metadata.get("dimension_separator") or "."
    names: set[str] = set()
    for index in indices:
        ranges = []
        for size, chunk, part in zip(shape, chunks, _full(index, len(shape)), strict=True):
            start, stop, _ = part.indices(size)
            ranges.append(range(start // chunk, (stop - 1) // chunk + 1) if stop > start else range(0))
        if limit is not None and math.prod(len(r) for r in ranges) > limit:
            raise ValueError(f"chunks of {chunks} would need more files than the checkpoint's {limit}")
        names.update(separator.join(map(str, grid)) if grid else "0" for grid in itertools.product(*ranges))
    return names


def read(folder: Path, sharding: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """The array at ``folder`` laid out as ``sharding``: each of this process's devices gets its part.

    Reads only those parts (each distinct one once), so the whole array is never in memory.
    """
    import jax
    import tensorstore as ts

    store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder)},
                     "fill_missing_data_reads": False}, open=True).result()
    if tuple(store.shape) != tuple(shape):
        raise ValueError(f"shape {tuple(store.shape)} in the checkpoint, {tuple(shape)} in the model")
    by_part: dict[tuple[tuple[int, int], ...], list[Any]] = {}
    for device, index in sharding.addressable_devices_indices_map(tuple(shape)).items():
        key = tuple(part.indices(size)[:2]
                    for part, size in zip(_full(index, len(shape)), shape, strict=True))
        by_part.setdefault(key, [index]).append(device)
    arrays: list[Any] = []
    for index, *devices in by_part.values():  # one part in host memory at a time
        data = np.asarray(store[index].read().result()).astype(dtype, copy=False)
        arrays.extend(jax.device_put(data, device) for device in devices)
        del data
    return jax.make_array_from_single_device_arrays(tuple(shape), sharding, arrays)


def _full(index: Index, rank: int) -> Index:
    """An index of ``rank`` slices (JAX may leave trailing dimensions out)."""
    return tuple(index) + (slice(None),) * (rank - len(index))


def _dtype_name(dtype: Any) -> str:
    return str(np.dtype(dtype).name) if not hasattr(dtype, "name") else str(dtype.name)


__all__ = ["OwnedShards", "check_installed", "chunk_files", "owned", "read", "start_transfers", "take",
           "write"]
