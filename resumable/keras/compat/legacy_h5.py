"""Keras 2's HDF5 files, through Keras' legacy saving (``keras.src.legacy.saving.legacy_h5_format``:
``save_weights_to_hdf5_group``, ``save_optimizer_weights_to_hdf5_group``), and the compile config
(``Model._compile_config``) its save takes the optimizer out of."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import keras


@contextlib.contextmanager
def compile_config_kept(model: keras.Model) -> Iterator[None]:
    """Keras' legacy HDF5 save pops ``"optimizer"`` out of ``model._compile_config.config`` (every
    Keras 3 up to 3.15): a later ``.keras`` save of the model then holds no optimizer (and loads
    with RMSprop). The config is put back after the save, with the model's optimizer where an
    earlier legacy save (Keras' own) had already taken it out."""
    holder = getattr(model, "_compile_config", None)
    config = getattr(holder, "config", None)
    saved = dict(config) if isinstance(config, dict) else None
    try:
        yield
    finally:
        now = getattr(holder, "config", None)
        if saved is not None and isinstance(now, dict):
            for key, value in saved.items():
                now.setdefault(key, value)
            if getattr(model, "optimizer", None) is not None:
                now.setdefault("optimizer", model.optimizer)


def _legacy_h5_format() -> ModuleType | None:
    try:
        from keras.src.legacy.saving import legacy_h5_format
    except ImportError:
        return None
    needed = ("save_weights_to_hdf5_group", "save_optimizer_weights_to_hdf5_group")
    return legacy_h5_format if all(hasattr(legacy_h5_format, name) for name in needed) else None


def can_write_legacy_weights() -> bool:
    """Whether this Keras can write a Keras 2 weights file (`write_legacy_weights`)."""
    return _legacy_h5_format() is not None


def write_legacy_weights(model: keras.Model, file: Any) -> None:
    """Write the model's weights into the open ``h5py.File`` as Keras 2's ``save_weights("w.h5")``
    did (and ``Model.load_weights`` of an ``.h5`` still reads), with the optimizer's variables
    when it is built."""
    legacy = _legacy_h5_format()
    assert legacy is not None
    legacy.save_weights_to_hdf5_group(file, model)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        legacy.save_optimizer_weights_to_hdf5_group(file, optimizer)
