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

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


def take(value: Any, process_index: int) -> OwnedShards:
    """The shards of ``value`` (a ``jax.Array``) this process writes, copied to host memory now.

    Replica 0 of each shard, on whichever device holds it; an array every process holds whole
    (fully addressable) is written by process 0 alone. Copies, not views: the next training
    step may donate the buffers.
    """
    shape = tuple(int(d) for d in value.shape)
    chunks = tuple(max(1, int(d)) for d in value.sharding.shard_shape(shape))
    ours = not value.is_fully_addressable or process_index == 0
    shards = [(shard.index, np.array(shard.data, copy=True))
              for shard in value.addressable_shards if ours and shard.replica_id == 0]
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


def chunk_files(metadata: dict[str, Any], indices: Iterable[Index]) -> set[str]:
    """Names of the chunk files (as zarr names them) holding the parts ``indices`` select of an
    array with this ``.zarray`` ``metadata``."""
    shape = [int(d) for d in metadata["shape"]]
    chunks = [max(1, int(d)) for d in metadata["chunks"]]
    separator = metadata.get("dimension_separator") or "."
    names: set[str] = set()
    for index in indices:
        ranges = []
        for size, chunk, part in zip(shape, chunks, _full(index, len(shape)), strict=True):
            start, stop, _ = part.indices(size)
            ranges.append(range(start // chunk, (stop - 1) // chunk + 1) if stop > start else range(0))
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


__all__ = ["OwnedShards", "chunk_files", "read", "take", "write"]
