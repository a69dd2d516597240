"""Keras 2's HDF5 files (``.h5`` and ``.hdf5`` names), written and read back with their optimizer.

The names of older articles and Keras 2 notebooks (``weights-{epoch:02d}-{val_acc:.3f}.hdf5``)
hold Keras' legacy HDF5 format, which Keras 3 still writes and reads, with faults that stop a
Keras 2 notebook's resume (every Keras 3 up to 3.15):

- loading builds the optimizer for none of the model's variables: the saved moments are
  dropped and the first ``fit`` fails with "Unknown variable ... This optimizer can only be
  called for the variables it was originally built with";
- loading cannot compile a model whose loss or metric is a short alias (``loss="mse"``:
  "Could not deserialize 'keras.metrics.mse'");
- saving pops the optimizer out of the model's compile config, so a later ``.keras`` save of
  the same model holds none (it loads with RMSprop);
- every save logs the same "legacy HDF5" warning.

So a model file written here also holds the Keras 3 compile config (attribute
`COMPILE_ATTRIBUTE`); `load_model` compiles from it as a ``.keras`` file is compiled
(``Model.compile_from_config``), builds the optimizer for the model's trainable variables and
sets the saved optimizer variables. The compile config is put back after each save, and the
warning is logged once per process. A weights-only file is Keras 2's weights file (each layer's
weights by layer name, then the optimizer's variables): ``model.load_weights(path)`` reads the
weights, `load_weights` the optimizer's too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import h5py
import keras
import numpy as np

from resumable.core import user_warnings
from resumable.core.display import printable
from resumable.keras import compat

LEGACY_SUFFIXES = (".h5", ".hdf5")
COMPILE_ATTRIBUTE = "resumable_compile_config"
OPTIMIZER_GROUP = "optimizer_weights"
_KERAS_WARNING = "as an HDF5 file via"  # in Keras' "You are saving your model as an HDF5 file via ..."


def is_legacy_name(name: str) -> bool:
    """``.h5``/``.hdf5`` names, not ``.weights.h5`` (Keras 3's own weights format)."""
    return name.endswith(LEGACY_SUFFIXES) and not name.endswith(".weights.h5")


# ----------------------------------------------------------------------------- saving


def save(model: keras.Model, path: Path, *, weights_only: bool = False, **kwargs: Any) -> None:
    """Write ``model`` to ``path`` in Keras' legacy HDF5 format: the whole model (``model.save``,
    plus its Keras 3 compile config) or, with ``weights_only``, Keras 2's weights file."""
    if weights_only and compat.can_write_legacy_weights():
        with h5py.File(path, "w") as f:
            compat.write_legacy_weights(model, f)
        return
    config = model.get_compile_config() if getattr(model, "compiled", False) else {}
    if config and "optimizer" not in config and getattr(model, "optimizer", None) is not None:
        config["optimizer"] = keras.saving.serialize_keras_object(model.optimizer)  # taken by Keras' own save
    _say_keras_warning_once()
    with compat.compile_config_kept(model):
        model.save(str(path), overwrite=True, **kwargs)
    if config and kwargs.get("include_optimizer", True):
        try:
            text = json.dumps(config)
        except (TypeError, ValueError):  # a custom object Keras serialized as something JSON is not
            return
        with h5py.File(path, "a") as f:
            f.attrs[COMPILE_ATTRIBUTE] = text


class _OnceFilter(logging.Filter):
    """Lets Keras' "legacy HDF5" warning through once per process: a save every epoch says it once."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if _KERAS_WARNING not in str(record.msg):
            return True
        if _OnceFilter.said:
            return False
        _OnceFilter.said = True
        return True


def _say_keras_warning_once() -> None:
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _OnceFilter) for f in absl.filters):
        absl.addFilter(_OnceFilter())


# ----------------------------------------------------------------------------- loading


def load_model(path: Path, **kwargs: Any) -> keras.Model:
    """``keras.saving.load_model`` of a legacy HDF5 model file, compiled, with its optimizer state."""
    compile_model = kwargs.pop("compile", True)
    config = _compile_config(path) if compile_model else None
    if config is not None:
        model = keras.saving.load_model(str(path), compile=False, **kwargs)
        with keras.saving.custom_object_scope(kwargs.get("custom_objects") or {}):
            model.compile_from_config(config)
    else:
        try:
            model = keras.saving.load_model(str(path), compile=compile_model, **kwargs)
        except (ValueError, TypeError) as e:
            if not compile_model:
                raise
            try:  # Keras 3 could not compile it (a loss saved as "mse"): the model itself may load
                model = keras.saving.load_model(str(path), compile=False, **kwargs)
            except Exception:
                raise e from None
            user_warnings.warn(f"resumable: {path.name}: Keras {keras.__version__} cannot compile the model "
                               f"from this file's training config ({printable(str(e))[:200]}); loaded "
                               "uncompiled: call model.compile(...) before fit")
            return model
    if compile_model:
        restore_optimizer(model, path)
    return model


def load_weights(model: keras.Model, path: Path, **kwargs: Any) -> None:
    """``model.load_weights`` of a legacy HDF5 file, then the optimizer's saved variables."""
    model.load_weights(str(path), **kwargs)
    restore_optimizer(model, path)


def restore_optimizer(model: keras.Model, path: Path) -> None:
    """Set the optimizer variables saved in ``path`` (its ``optimizer_weights`` group) on the
    model's optimizer, built for the model's trainable variables first. Keras' legacy loader
    builds it for none of them: such an optimizer is replaced by a fresh one of the same config."""
    optimizer = getattr(model, "optimizer", None)
    values = _optimizer_values(path)
    if optimizer is None or not values:
        return
    if optimizer.built and len(optimizer.variables) != len(values):
        optimizer = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        model.optimizer = optimizer
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    shapes = [tuple(v.shape) for v in optimizer.variables]
    saved = [tuple(np.shape(v)) for v in values]
    if shapes != saved:
        user_warnings.warn(
            f"resumable: {path.name}: the optimizer state saved there ({len(saved)} variables) does not fit "
            f"this model's {type(optimizer).__name__} ({len(shapes)} variables): training continues with "
            "a fresh optimizer state (a file written by Keras 2, or by another model)")
        return
    optimizer.set_weights(values)


def _compile_config(path: Path) -> dict[str, Any] | None:
    with h5py.File(path, "r") as f:
        text = f.attrs.get(COMPILE_ATTRIBUTE)
    if text is None:
        return None
    try:
        config = json.loads(text.decode() if isinstance(text, bytes) else str(text))
    except ValueError:
        return None
    return config if isinstance(config, dict) and config else None


def _optimizer_values(path: Path) -> list[np.ndarray]:
    """The optimizer variables saved in the file, in the order saved (Keras' ``optimizer.variables``)."""
    with h5py.File(path, "r") as f:
        group = f.get(OPTIMIZER_GROUP)
        if not isinstance(group, h5py.Group):
            return []
        names = _attribute_list(group, "weight_names")
        return [np.asarray(group[name]) for name in names if name in group]


def _attribute_list(group: h5py.Group, name: str) -> list[str]:
    """A list attribute Keras may have split into ``name0``, ``name1``, ... (over 64 KB)."""
    if name in group.attrs:
        chunks = [group.attrs[name]]
    else:
        chunks = []
        while f"{name}{len(chunks)}" in group.attrs:
            chunks.append(group.attrs[f"{name}{len(chunks)}"])
    return [item.decode() if isinstance(item, bytes) else str(item) for chunk in chunks for item in chunk]


def staged_name(name: str) -> str:
    """The local name Keras is asked to write or read: ``.hdf5`` as ``.h5`` (the same format)."""
    return name.rsplit(".", 1)[0] + ".h5" if is_legacy_name(name) else name


__all__ = ["COMPILE_ATTRIBUTE", "LEGACY_SUFFIXES", "is_legacy_name", "load_model", "load_weights",
           "restore_optimizer", "save", "staged_name"]

