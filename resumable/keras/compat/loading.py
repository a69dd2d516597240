"""Fast loads through Keras' saving internals: a ``.weights.h5`` from a file object (in place,
in a ``.keras`` zip), sharded weights a shard at a time as they land, a ``.keras`` file's or an
unzipped one's model. Each falls back (returns False or None, having loaded nothing) where this
Keras lacks the internals or they misbehave (`sharding_works`, `_loading_works`).

Reaches ``saving_lib._load_state``, ``_raise_loading_failure``, ``_model_from_config``,
``H5IOStore``, ``ShardedH5IOStore._get_h5_file`` and ``DiskIOStore``. Weights are read
through `in_place_reads.in_place_store`: a JAX variable on the CPU takes each big array as it was read,
a TensorFlow one reads it into its own buffer. A model built from its config for a load skips
its initializers on JAX (`deferred_init`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import keras

from resumable.keras.compat.deferred_init import initial_values_deferred
from resumable.keras.compat.in_place import assigned_in_place
from resumable.keras.compat.in_place_reads import in_place_store, keep_unread
from resumable.keras.compat.probing import probe, probe_class
from resumable.keras.compat.saving_lib import keras_saving_lib, sharded_store
from resumable.keras.compat.stores import new_recorder, write_sharded_weights


def load_weights_from(model: keras.Model, file: Any) -> bool:
    """``model.load_weights`` of a ``.weights.h5`` given as a path or a file object (a BytesIO,
    as Keras' store requires: `zip_member.MemberWindow`), as ``load_weights`` reads it: Keras'
    ``H5IOStore`` and ``_load_state``. False, having loaded nothing, when this Keras lacks
    them or they misbehave: the caller uses ``load_weights``. Raises ValueError as ``load_weights`` does."""
    saving_lib = keras_saving_lib()
    if saving_lib is None or not _loading_works():
        return False
    _load_into(saving_lib, model, in_place_store(saving_lib)(file, mode="r"), None)
    return True


def load_sharded_weights(model: keras.Model, weights: str, landed: Callable[[str], object]) -> bool:
    """``model.load_weights`` of sharded weights (``weights``: the ``.weights.json`` map), a shard
    at a time, each opened once ``landed(file name)`` returns: the next may still be coming.
    False, having loaded nothing, on a Keras whose sharded store is missing or misbehaves
    (`sharding_works`): the caller merges the shards into one file for ``load_weights``."""
    saving_lib = keras_saving_lib()
    if saving_lib is None or not sharding_works() or not _loading_works():
        return False
    _load_into(saving_lib, model, _waiting_store(landed)(weights, mode="r"), None)
    return True


def load_unzipped_model(config: str, weights: str, assets: str | None,
                        landed: Callable[[str], object]) -> keras.Model | None:
    """The model of an unzipped ``.keras`` whose weights are sharded: what ``keras.saving.load_model``
    does for a folder, reading the weights a shard at a time as `load_sharded_weights` does
    (Keras' own folder loader knows only one ``model.weights.h5``). ``config``: config.json's
    text; ``weights``: the ``.weights.json`` map; ``assets``: the assets folder, if any.
    None, having loaded nothing, where `load_sharded_weights` returns False. Raises ValueError as
    Keras does."""
    saving_lib = keras_saving_lib()
    if saving_lib is None or not sharding_works() or not _loading_works():
        return None
    with initial_values_deferred() as deferred:  # the load replaces them all
        model = saving_lib._model_from_config(config, None, True, True)
    assets_store = saving_lib.DiskIOStore(assets, mode="r") if assets is not None else None
    _load_into(saving_lib, model, _waiting_store(landed)(weights, mode="r"), assets_store)
    deferred.finish()
    return model


def load_keras_archive(archive: Any, weights: Any) -> keras.Model | None:
    """``keras.saving.load_model`` of an open ``.keras`` zip whose weights are read from the file
    object ``weights`` (`zip_member.MemberWindow`: in place, where Keras reads the whole member
    into memory first): the model from ``config.json``, compiled, its weights, optimizer state
    and assets loaded as Keras does. None, having loaded nothing, when this Keras lacks the
    internals or they misbehave: the caller uses ``load_model``. Raises ValueError as Keras does."""
    saving_lib = keras_saving_lib()
    if saving_lib is None or not _loading_works():
        return None
    with initial_values_deferred() as deferred:  # the load replaces them all
        model = saving_lib._model_from_config(archive.read("config.json").decode(), None, True, True)
    has_assets = len(archive.namelist()) > 3  # as Keras: anything beyond metadata, config and weights
    assets = saving_lib.DiskIOStore("assets", archive=archive, mode="r") if has_assets else None
    _load_into(saving_lib, model, in_place_store(saving_lib)(weights, mode="r"), assets)
    deferred.finish()
    return model


def _waiting_store(landed: Callable[[str], object]) -> type:
    """Keras' ``ShardedH5IOStore``, opening each shard (``_get_h5_file``) once it has landed. A
    shard that cannot be opened (missing, not HDF5) is kept as ``arrival_error``: Keras' loader
    may fold it into "could not be loaded" (3.13) or let it through (3.15); `_load_into`
    raises it either way."""
    sharded = sharded_store()
    saving_lib = keras_saving_lib()

    class Waiting(sharded, in_place_store(saving_lib)):  # type: ignore[misc, valid-type]
        arrival_error: BaseException | None = None

        def _get_h5_file(self, path_or_io: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                landed(Path(str(path_or_io)).name)
                return super()._get_h5_file(path_or_io, *args, **kwargs)  # mode= from Keras 3.11
            except BaseException as e:
                self.arrival_error = e
                raise

    return Waiting


def _load_into(saving_lib: ModuleType, model: Any, weights_store: Any, assets_store: Any) -> None:
    """Keras' ``_load_state`` of the stores into ``model`` (closed after), failures raised as Keras
    does; each variable assigned in place (`in_place.assigned_in_place`)."""
    failed: set[int] = set()
    errors: dict[int, Any] = {}
    try:
        with assigned_in_place(model):
            saving_lib._load_state(model, weights_store=weights_store, assets_store=assets_store,
                                   inner_path="", visited_saveables=set(), failed_saveables=failed,
                                   error_msgs=errors)
        keep_unread(weights_store)
    finally:
        weights_store.close()
        if assets_store is not None:
            assets_store.close()
    arrival_error = getattr(weights_store, "arrival_error", None)
    if arrival_error is not None:  # a shard that did not arrive (damaged): that, not Keras' summary
        raise arrival_error
    if failed:
        saving_lib._raise_loading_failure(errors)


def read_back(saving_lib: ModuleType, store: Any) -> Any:
    """A probe pair loaded from ``store`` by Keras' ``_load_state`` (raising as Keras does)."""
    loaded = probe_class().pair(fill=0.0)
    _load_into(saving_lib, loaded, store, None)
    return loaded


@functools.cache
def sharding_works() -> bool:
    """Whether sharded weights written with Keras' ``ShardedH5IOStore`` read back: a probe whose
    groups span three shards, written by `write_sharded_weights`, then read both by Keras'
    own ``ShardedH5IOStore`` and by `load_sharded_weights`' store, comes back equal. Keras 3.10's
    does not (a group's later shards are missing from its map): big checkpoints are then
    written as one file (said once), and sharded ones written elsewhere are still read."""
    if sharded_store() is None:
        return False

    def check(saving_lib: ModuleType, folder: Path) -> str | None:
        written = probe_class().pair()
        recorder = new_recorder(saving_lib)
        saving_lib._save_state(written, weights_store=recorder, assets_store=None, inner_path="",
                               visited_saveables=set())
        path = str(folder / "probe.weights.json")
        write_sharded_weights(recorder.values, path, 100 / 2**30)  # 64-byte values: one per shard
        if len(list(folder.glob("probe_*.weights.h5"))) < 3:
            return "values over max_shard_size were not split into shards"
        for store in (sharded_store()(path, mode="r"), _waiting_store(lambda name: None)(path, mode="r")):
            if not written.same(read_back(saving_lib, store)):
                return "sharded weights read back different"
        return None

    return probe("saving_lib.ShardedH5IOStore", "big checkpoints are written as one file", check)


@functools.cache
def _loading_works() -> bool:
    """Whether Keras' ``H5IOStore`` reads a file object and ``_load_state`` loads from it, as the
    fast loads (`load_weights_from`, `load_keras_archive`) need: a probe written by Keras' own
    store, read from a BytesIO, comes back equal. When not, ``load_weights``/``load_model`` load."""

    def check(saving_lib: ModuleType, folder: Path) -> str | None:
        import io

        written = probe_class().pair()
        path = str(folder / "probe.weights.h5")
        store = saving_lib.H5IOStore(path, mode="w")
        try:
            saving_lib._save_state(written, weights_store=store, assets_store=None, inner_path="",
                                   visited_saveables=set())
        finally:
            store.close()
        data = io.BytesIO(Path(path).read_bytes())
        if not written.same(read_back(saving_lib, in_place_store(saving_lib)(data, mode="r"))):
            return "weights read from a file object come back different"
        parameters = tuple(inspect.signature(saving_lib._model_from_config).parameters)
        if parameters[:4] != ("config_json", "custom_objects", "compile", "safe_mode"):
            return f"_model_from_config takes {parameters}"
        return None

    return probe("saving_lib's H5IOStore on a file object and _load_state",
                  "checkpoints are loaded with load_weights and load_model", check)
