"""Snapshots through Keras' saving internals: what ``model.save`` would write, recorded as host
copies by Keras' own traversal (``saving_lib._save_state``) while training waits, to be written
later (`stores`); and the ``config.json``/``metadata.json`` texts (``_serialize_model_as_json``).
Optimizers' ``save_own_variables`` is stood in for during the snapshot (the variables, not copies).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import keras

from resumable.keras.compat.loading import read_back, sharding_works
from resumable.keras.compat.messages import unsupported, warn_once
from resumable.keras.compat.probing import probe, probe_class
from resumable.keras.compat.saving_lib import keras_saving_lib, sharded_store
from resumable.keras.compat.stores import SavedValue, new_recorder, write_weights


def saved_values(model: keras.Model, copy: Any, assets_dir: str | None) -> list[SavedValue] | None:
    """What ``model.save`` / ``model.save_weights`` would write to the weights file, as host copies.

    Runs Keras' own traversal (``saving_lib._save_state``) with a store that keeps
    ``copy(value)`` of each value instead of writing it, so `write_weights` later writes the
    same file in another thread while training goes on. Assets (vocabularies and the like)
    go to ``assets_dir`` now, when given (``model.save``; ``save_weights`` writes none).
    None when this Keras lacks those internals, or they do not behave as `snapshots_work`
    expects, or they fail on this model: the caller saves the usual way (``model.save``).
    """
    saving_lib = keras_saving_lib()
    if saving_lib is None or not snapshots_work():
        return None
    recorder = new_recorder(saving_lib)
    recorder.copy = copy
    assets = saving_lib.DiskIOStore("assets", mode="w") if assets_dir is not None else None
    try:
        with _optimizers_hand_over_variables(model):
            saving_lib._save_state(model, weights_store=recorder, assets_store=assets, inner_path="",
                                   visited_saveables=set())
        if assets is not None and assets_dir is not None:
            import shutil

            shutil.copytree(assets.working_dir, assets_dir, dirs_exist_ok=True)
    except Exception as e:  # noqa: BLE001 - model.save, the fallback, raises the model's own errors
        _snapshots_failed(f"{type(e).__name__}: {e}")
        return None
    finally:
        if assets is not None:
            assets.close()
    return recorder.values


_snapshot_failure: list[str] = []  # set once a snapshot failed on a real model: never tried again


def _snapshots_failed(why: str) -> None:
    if not _snapshot_failure:
        _snapshot_failure.append(why)
        warn_once(f"resumable: a snapshot of the model failed in Keras {keras.__version__} ({why}); "
                  "checkpoints are saved with model.save while training waits")


@contextlib.contextmanager
def _optimizers_hand_over_variables(model: keras.Model) -> Iterator[None]:
    """Keras' optimizers save ``variable.numpy()``: a copy of all their state (two thirds of a
    checkpoint with Adam) while training waits. For an optimizer with the base class's
    ``save_own_variables``, the store gets the variables themselves for the time of the
    snapshot, as layers give theirs; `copy` then takes its view. Same keys, same values."""
    base = keras.optimizers.Optimizer.save_own_variables
    optimizer = getattr(model, "optimizer", None)
    found = [optimizer, getattr(optimizer, "inner_optimizer", None)]
    patched = [o for o in found if o is not None and type(o).save_own_variables is base
               and "save_own_variables" not in vars(o)]

    def hand_over(optimizer: Any) -> Callable[[Any], None]:
        def save_own_variables(store: Any) -> None:
            for i, variable in enumerate(optimizer.variables):
                store[str(i)] = variable
        return save_own_variables

    for o in patched:
        o.save_own_variables = hand_over(o)
    try:
        yield
    finally:
        for o in patched:
            del o.save_own_variables


@functools.cache
def snapshots_work() -> bool:
    """Whether snapshots (`saved_values`, then `write_weights`) give files Keras reads: a probe's
    values recorded by ``_save_state``, written, then read by Keras' own ``H5IOStore`` and
    ``_load_state`` (what ``load_weights`` does) come back equal. Once per process; when not,
    checkpoints are saved with ``model.save`` while training waits (said once)."""

    def check(saving_lib: ModuleType, folder: Path) -> str | None:
        written = probe_class().pair()
        recorder = new_recorder(saving_lib)
        saving_lib._save_state(written, weights_store=recorder, assets_store=None, inner_path="",
                               visited_saveables=set())
        with open(folder / "probe.weights.h5", "w+b") as file:  # as snapshots write: into a file object
            write_weights(recorder.values, file)
        loaded = read_back(saving_lib, saving_lib.H5IOStore(str(folder / "probe.weights.h5"), mode="r"))
        return None if written.same(loaded) else "values written by a snapshot read back different"

    return probe("saving_lib's _save_state and H5IOStore", "checkpoints are saved with model.save while "
                  "training waits", check)


def can_shard() -> bool:
    """Whether checkpoints may be written as Keras' sharded weights here: this Keras has
    ``ShardedH5IOStore`` and what it writes reads back (`sharding_works`). Asked when a
    checkpoint is over ``max_shard_size``; a Keras without it (3.8, 3.9) is said once."""
    if sharded_store() is None:
        warn_once(unsupported("keras.src.saving.saving_lib.ShardedH5IOStore")
                  + "; big checkpoints are written as one file")
        return False
    return snapshots_work() and sharding_works()


def model_json(model: keras.Model) -> tuple[str, str]:
    """The ``config.json`` and ``metadata.json`` texts of a ``.keras`` file, as ``model.save`` writes them."""
    saving_lib = keras_saving_lib()
    assert saving_lib is not None
    config, metadata = saving_lib._serialize_model_as_json(model)
    return config, metadata
