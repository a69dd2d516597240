"""Keras' saving library (``keras.src.saving.saving_lib``), found once: what snapshots, the
probes and the fast loads go through."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from resumable.keras.compat.messages import unsupported, warn_once


@functools.cache
def keras_saving_lib() -> ModuleType | None:
    """``keras.src.saving.saving_lib`` with what snapshots and loads use; None (said once) without it."""
    try:
        from keras.src.saving import saving_lib

        # Read now what the snapshot and its writer use: AttributeError here, not mid-training.
        _ = (saving_lib._save_state, saving_lib._load_state, saving_lib.H5IOStore, saving_lib.DiskIOStore,
             saving_lib._serialize_model_as_json)
        return saving_lib
    except Exception:  # noqa: BLE001 - moved or renamed in this Keras version
        warn_once(unsupported("keras.src.saving.saving_lib (_save_state, _load_state, H5IOStore)")
                  + "; checkpoints are saved with model.save while training waits")
        return None


@functools.cache
def sharded_store() -> Any:
    """Keras' ``ShardedH5IOStore`` (Keras 3.10+); None when this Keras lacks it."""
    saving_lib = keras_saving_lib()
    return getattr(saving_lib, "ShardedH5IOStore", None) if saving_lib is not None else None
