"""Keras' weights-file stores, writing what a snapshot recorded: ``H5IOStore`` (into a path or
a file object of ours, through ``_get_h5_file``) and ``ShardedH5IOStore``, fed host arrays
without the copies their ``convert_to_numpy`` would make; and the recorder that stands in for a
store while Keras' ``_save_state`` walks the model. Their reads for a load: `in_place_reads`."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, NamedTuple

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


def write_weights(values: list[SavedValue], target: str | io.RawIOBase | BinaryIO) -> None:
    """Write `saved_values` as the ``.weights.h5`` file Keras would have written, with its store:
    to a path, or into a seekable binary file object (h5py writes it there directly, through
    ``H5IOStore._get_h5_file``; a Keras without it writes a temporary file, copied in)."""
    saving_lib = keras_saving_lib()
    assert saving_lib is not None  # saved_values returned values
    if isinstance(target, str):
        _fill(saving_lib.H5IOStore(target, mode="w"), values)
        return
    into_file = _store_into_file()
    if into_file is not None:
        _fill(into_file(target), values)
        return
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="resumable-weights-") as folder:
        path = str(Path(folder) / "model.weights.h5")
        _fill(saving_lib.H5IOStore(path, mode="w"), values)
        with open(path, "rb") as written:
            shutil.copyfileobj(written, target, 2**22)


@functools.cache
def _store_into_file() -> type | None:
    """Keras' ``H5IOStore`` writing into a file object of ours (any offsets, as HDF5 does); None on
    a Keras whose store opens its file elsewhere than ``_get_h5_file`` (before 3.10)."""
    saving_lib = keras_saving_lib()
    if saving_lib is None or "_get_h5_file" not in vars(saving_lib.H5IOStore):
        return None

    class IntoFile(saving_lib.H5IOStore):  # type: ignore[name-defined]
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
    saving_lib = keras_saving_lib()
    if sharded is None or saving_lib is None:
        return None

    class Uncopied(saving_lib.H5IOStore):  # type: ignore[name-defined]
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
            entry[value.key] = _HostView(value.value)
    finally:
        store.close()
