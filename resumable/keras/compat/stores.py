"""Keras' weights-file stores, writing what a snapshot recorded: ``H5IOStore`` (into a path or
a file object of ours, through ``_get_h5_file``) and ``ShardedH5IOStore``, fed host arrays
without the copies their ``convert_to_numpy`` would make; and the recorder that stands in for a
store while Keras' ``_save_state`` walks the model. Their reads for a load: `in_place_reads`.

A big variable of a streamed snapshot (#54: `snapshot.LiveValue` with ``slice_rows``) is never
read whole: the store is handed a stand-in of its shape and dtype that takes no memory (Keras'
sharded store sizes its shards by it), and `_SlicedWrites` creates the dataset as Keras' store
would (h5py's ``group[key] = array``: an anonymous dataset, then linked) and writes it slice by
slice along its first axis: the same bytes, at most one slice on the host. On a Keras whose
stores write through entry objects (3.8, 3.9) the variable is read whole."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, NamedTuple, Protocol

import numpy as np

from resumable.keras.compat.saving_lib import keras_saving_lib, sharded_store


class SavedValue(NamedTuple):
    """One value Keras' saving writes to ``model.weights.h5``: its group, group attributes, key, value."""

    path: str
    metadata: dict[str, Any] | None
    key: str
    value: Any  # a host copy (numpy), never the live variable


def new_recorder(saving_lib: ModuleType) -> Any:
    """A store for ``_save_state`` that records host copies instead of writing (an H5IOStore by
    type: Keras 3.14+ checks it). ``make`` returns the store itself, as Keras 3.10+ does; Keras
    3.8 and 3.9 return an entry object, which the traversal uses the same way."""

    class Recorder(saving_lib.H5IOStore):  # type: ignore[name-defined]
        def __init__(self) -> None:  # no file: nothing of H5IOStore's own state is used
            self.values: list[SavedValue] = []
            self._entry: tuple[str, dict[str, Any] | None] = ("", None)
            self.copy: Callable[[Any], Any] = np.array

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: dict[str, Any] | None = None) -> Recorder:
            self._entry = (path, metadata)
            return self

        def __setitem__(self, key: str, value: Any) -> None:
            self.values.append(SavedValue(*self._entry, key, self.copy(value)))

    return Recorder()


class _HostView:
    """A snapshot's value as handed to Keras' store: ``np.array`` of it is the value itself.

    Keras' stores pass every value through ``convert_to_numpy`` (``np.array``: a copy; the
    sharded store converts twice), which would hold a copy of the biggest variable (two,
    sharded) beside the snapshot while it is written. A snapshot's values are host arrays
    nobody changes (`snapshot._host_copy`), so they are written from where they are.
    """

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # a streamed snapshot's value (`snapshot.LiveValue`) is read here, as it is written
        array = self.array if isinstance(self.array, np.ndarray) else np.asarray(self.array)
        return array if dtype is None else array.astype(dtype, copy=False)


class Sliced(Protocol):
    """A value written in slices (`snapshot.LiveValue` of a big variable)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    slice_rows: int | None  # rows of the first axis per slice; None: read whole

    def read(self, start: int, stop: int) -> np.ndarray: ...


def _stand_in(value: Sliced) -> np.ndarray:
    """An array of the value's shape and dtype that takes no memory (one element, broadcast)."""
    return np.broadcast_to(np.zeros((), value.dtype), value.shape)


@functools.cache
def _sliced_store() -> type | None:
    """Keras' ``H5IOStore`` writing a value set aside by `_fill` (``_resumable_sliced``) slice
    by slice; None without Keras' saving."""
    saving_lib = keras_saving_lib()
    if saving_lib is None:
        return None

    class SlicedWrites(saving_lib.H5IOStore):  # type: ignore[name-defined]
        def __setitem__(self, key: str, value: Any) -> None:
            sliced = self.__dict__.pop("_resumable_sliced", None)
            if sliced is None:
                super().__setitem__(key, value)
                return
            if not self._h5_entry_initialized:
                self._create_h5_group(self._h5_entry_path)
            _write_in_slices(self._h5_entry_group, key, sliced)

    return SlicedWrites


def _writes_slices(store: Any) -> bool:
    sliced = _sliced_store()
    return sliced is not None and isinstance(store, sliced)


def _write_in_slices(group: Any, key: str, value: Sliced) -> None:
    """What H5IOStore.__setitem__ writes for ``value``, one slice of rows at a time."""
    from keras import backend

    rows = value.slice_rows
    assert rows is not None
    bfloat16 = backend.standardize_dtype(value.dtype) == "bfloat16"
    # Keras: create_dataset(key, data=...) for bfloat16, else group[key] = array, which h5py
    # makes an anonymous dataset linked after its data is written
    dataset = group.create_dataset(key if bfloat16 else None, shape=value.shape, dtype=value.dtype)
    for start in range(0, value.shape[0], rows):
        stop = min(start + rows, value.shape[0])
        dataset[start:stop] = value.read(start, stop)
    if bfloat16:
        dataset.attrs["dtype"] = "bfloat16"
    else:
        from h5py import h5o

        name, lcpl = group._e(key, lcpl=True)
        h5o.link(dataset.id, group.id, name, lcpl=lcpl)


def write_weights(values: list[SavedValue], target: str | io.RawIOBase | BinaryIO) -> None:
    """Write `saved_values` as the ``.weights.h5`` file Keras would have written, with its store:
    to a path, or into a seekable binary file object (h5py writes it there directly, through
    ``H5IOStore._get_h5_file``; a Keras without it writes a temporary file, copied in)."""
    saving_lib = keras_saving_lib()
    assert saving_lib is not None  # saved_values returned values
    store = _sliced_store() or saving_lib.H5IOStore
    if isinstance(target, str):
        _fill(store(target, mode="w"), values)
        return
    into_file = _store_into_file()
    if into_file is not None:
        _fill(into_file(target), values)
        return
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="resumable-weights-") as folder:
        path = str(Path(folder) / "model.weights.h5")
        _fill(store(path, mode="w"), values)
        with open(path, "rb") as written:
            shutil.copyfileobj(written, target, 2**22)


@functools.cache
def _store_into_file() -> type | None:
    """Keras' ``H5IOStore`` writing into a file object of ours (any offsets, as HDF5 does); None on
    a Keras whose store opens its file elsewhere than ``_get_h5_file`` (before 3.10)."""
    saving_lib = keras_saving_lib()
    store = _sliced_store()
    if saving_lib is None or store is None or "_get_h5_file" not in vars(saving_lib.H5IOStore):
        return None

    class IntoFile(store):  # type: ignore[misc, valid-type]
        def __init__(self, file: io.RawIOBase | BinaryIO) -> None:
            self._target = file
            super().__init__(str(file), mode="w")  # a name only: the file is ours

        def _get_h5_file(self, path_or_io: Any, mode: str | None = None) -> Any:
            import h5py

            return h5py.File(self._target, mode="w")

    return IntoFile


def write_sharded_weights(values: list[SavedValue], path: str, max_shard_size: float,
                          create: Callable[[str], io.RawIOBase] | None = None) -> None:
    """Write `saved_values` as Keras' sharded weights: ``path`` (a ``.weights.json`` map) and its
    ``*_00000.weights.h5`` shards of at most ``max_shard_size`` GiB each, as
    ``model.save_weights(path, max_shard_size=...)`` writes them; ``model.load_weights(path)`` reads them.

    ``create(name)``: a new binary file object for each shard, h5py writes into (closed here).
    """
    sharded = _uncopied_sharded_store()
    assert sharded is not None  # the caller asked can_shard()
    if create is None:
        _fill(sharded(path, max_shard_size, mode="w"), values)
        return
    opened: list[io.RawIOBase] = []
    make = create

    class IntoFiles(sharded):  # type: ignore[misc, valid-type]
        def _get_h5_file(self, path_or_io: Any, mode: str | None = None) -> Any:
            if (mode or self.mode) != "w":
                return super()._get_h5_file(path_or_io, mode)
            import h5py

            opened.append(make(Path(path_or_io).name))
            return h5py.File(opened[-1], mode="w")  # named after the file object: the shard's path

    try:
        _fill(IntoFiles(path, max_shard_size, mode="w"), values)
    finally:
        for file in opened:
            file.close()


@functools.cache
def _uncopied_sharded_store() -> type | None:
    """Keras' ``ShardedH5IOStore`` taking values as `_HostView`: its own ``__setitem__`` converts
    (to size the value), then calls H5IOStore's, which converts again; the class between
    them wraps the converted value again, so neither conversion copies."""
    sharded = sharded_store()
    sliced = _sliced_store()
    if sharded is None or sliced is None:
        return None

    class Uncopied(sliced):  # type: ignore[misc, valid-type]
        def __setitem__(self, key: str, value: Any) -> None:
            super().__setitem__(key, value if isinstance(value, _HostView) else _HostView(value))

    class ShardedUncopied(sharded, Uncopied):  # type: ignore[misc, valid-type]
        pass

    return ShardedUncopied


def _fill(store: Any, values: list[SavedValue]) -> None:
    try:
        entry: Any = None
        group: tuple[str, dict[str, Any] | None] | None = None
        for value in values:
            if group != (value.path, value.metadata):
                group = (value.path, value.metadata)
                entry = store.make(value.path, metadata=value.metadata)  # Keras 3.8, 3.9: an entry
            if getattr(value.value, "slice_rows", None) and entry is store and _writes_slices(store):
                store._resumable_sliced = value.value  # taken by SlicedWrites.__setitem__
                entry[value.key] = _HostView(_stand_in(value.value))
            else:
                entry[value.key] = _HostView(value.value)
    finally:
        store.close()
