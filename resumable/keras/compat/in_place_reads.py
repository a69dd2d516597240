"""Keras' ``H5IOStore`` reading a weights file for a load in place (`in_place`): each big
array handed out as the backend's variables take it best (`in_place_store`, through the
store's ``_h5_entry_group``): read into a buffer JAX takes without a copy, or left unread
(`UnreadValue`) for TensorFlow to read straight into its variable's buffer, and for JAX to read
once the variable's old array is let go."""

from __future__ import annotations

import functools
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ALIGNMENT = 64  # bytes: JAX's CPU client takes a NumPy array this aligned as its own buffer
# Values this big are read aligned, so that JAX keeps the array read as the variable: a copy of
# one beside the model costs more memory than the fresh pages of the read cost time. Smaller
# ones are read as Keras reads them and copied (a 25M-parameter model's 82 MB values read
# aligned made its resume about 10% slower: docs/benchmarks.md).
ALIGNED_FROM_BYTES = 256 * 2**20


def aligned_read(dataset: Any) -> np.ndarray:
    """The h5py ``dataset`` read into a new array whose buffer is aligned to `ALIGNMENT` bytes.

    NumPy's big arrays start 16 bytes into a page: JAX (Keras' assign) copies one, and takes an
    aligned one's buffer as it is (on the CPU). The read is the same either way."""
    if not dataset.size:
        return np.empty(dataset.shape, dataset.dtype)
    raw = np.empty(dataset.nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    array = raw[start:start + dataset.nbytes].view(dataset.dtype).reshape(dataset.shape)
    dataset.read_direct(array)
    return array


# On TensorFlow, values this big are handed out unread: the load reads each straight into its
# variable's buffer, so that no value is held beside the model (JAX: from ALIGNED_FROM_BYTES).
# Smaller ones are read whole, as Keras reads them: a layer may keep what its store hands it
# (Keras' Discretization does).
UNREAD_FROM_BYTES = 16 * 2**20


class UnreadValue:
    """An array of a weights file, handed out by `in_place_store` instead of the array read:
    ``read_direct(buffer)`` reads it into a buffer of the caller's (a TensorFlow variable's own,
    `in_place`); ``np.asarray`` of it reads it whole, for anything else that uses it.

    Keras' sharded store may close the shard before the value is used (it goes back to the
    shard it was on after a read in another): the shard is then reopened by its path, read only.
    A value still held when its store closes (a layer that kept what it was handed) is read
    then (`keep_unread`), so it never depends on a closed file."""

    __slots__ = ("_dataset", "_path", "_name", "_kept", "shape", "dtype", "__weakref__")

    def __init__(self, dataset: Any, path: str | None) -> None:
        self._dataset, self._path, self._name = dataset, path, dataset.name
        self._kept: np.ndarray | None = None
        self.shape: tuple[int, ...] = tuple(dataset.shape)
        self.dtype: np.dtype = dataset.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def read_direct(self, buffer: np.ndarray) -> None:
        """Read the whole value into ``buffer`` (this shape and dtype, C-contiguous), as h5py's
        ``Dataset.read_direct`` does."""
        if self._kept is not None:
            np.copyto(buffer, self._kept)
        elif self._dataset.id.valid:
            self._dataset.read_direct(buffer)
        elif self._path is not None:
            import h5py

            with h5py.File(self._path, "r") as file:
                dataset = file[self._name]
                if tuple(dataset.shape) != self.shape or dataset.dtype != self.dtype:
                    raise ValueError(f"{self._name} in {self._path} changed while it was being loaded")
                dataset.read_direct(buffer)
        else:
            raise ValueError(f"{self._name} was used after its weights file was closed")

    def keep(self) -> None:
        """Read the value now, for uses after its file is closed."""
        if self._kept is None:
            self._kept = np.asarray(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._kept is not None:
            array = self._kept
        else:
            array = np.empty(self.shape, self.dtype)
            if array.size:
                self.read_direct(array)
        return array if dtype is None else array.astype(dtype, copy=False)


@functools.cache
def in_place_store(saving_lib: ModuleType) -> type:
    """Keras' ``H5IOStore`` handing out its big plain arrays as the load in place (`in_place`)
    takes them best (Keras 3.10+; Keras 3.8 and 3.9 hand out the datasets themselves):

    - as `UnreadValue`, read later: on TensorFlow values of `UNREAD_FROM_BYTES` or more,
      straight into the variable's buffer; on JAX values of `ALIGNED_FROM_BYTES` or more, read
      aligned once the variable's old array is let go, and taken as its new buffer;
    - other values of `ALIGNED_FROM_BYTES` or more as `aligned_read` reads them.

    Any other value (smaller, a tagged dtype such as bfloat16, a link, a scalar) is Keras' own
    read, checks included."""

    class InPlaceReads(saving_lib.H5IOStore):  # type: ignore[name-defined]
        def __getitem__(self, key: str) -> Any:
            dataset = _plain_dataset(getattr(self, "_h5_entry_group", None), key)
            if dataset is None:
                return super().__getitem__(key)
            if dataset.nbytes >= _unread_from_bytes():
                unread = UnreadValue(dataset, _path_on_disk(dataset))
                self.__dict__.setdefault("_unread", weakref.WeakSet()).add(unread)
                return unread
            if dataset.nbytes < ALIGNED_FROM_BYTES:
                return super().__getitem__(key)
            return aligned_read(dataset)

    return InPlaceReads


def keep_unread(store: Any) -> None:
    """Before ``store`` (an `in_place_store`) closes: read each `UnreadValue` it handed out that
    is still held (a layer that kept it), so that it does not depend on a closed file."""
    for unread in list(vars(store).get("_unread", ())):
        unread.keep()


def _unread_from_bytes() -> float:
    """The size from which this backend's values are handed out unread: read later into their
    variable's buffer (TensorFlow), or once the variable's old array is let go (JAX)."""
    import keras

    sizes = {"tensorflow": UNREAD_FROM_BYTES, "jax": ALIGNED_FROM_BYTES}
    return sizes.get(keras.backend.backend(), float("inf"))


def _path_on_disk(dataset: Any) -> str | None:
    """The path of the file ``dataset`` is in, when h5py opened it by its path (not a file object)."""
    file = dataset.file
    if file.driver in ("fileobj", "core") or not Path(file.filename).is_file():
        return None
    return str(file.filename)


def _plain_dataset(group: Any, key: str) -> Any:
    """``group[key]`` when it is an array as Keras writes one: a hard link to a numeric dataset
    with at least one dimension, stored inside the file, with no dtype tag; None otherwise."""
    import h5py

    if not isinstance(group, h5py.Group) or "/" in key or key not in group:
        return None
    if not isinstance(group.get(key, getlink=True), h5py.HardLink):
        return None  # a soft or external link: Keras' read refuses or follows it as it does
    dataset = group[key]
    if not isinstance(dataset, h5py.Dataset) or dataset.external or dataset.is_virtual:
        return None
    if "dtype" in dataset.attrs or dataset.dtype.kind not in "fiub" or not dataset.shape:
        return None
    return dataset
