"""Trainable-only checkpoints: what trains is saved; the frozen rest is named by a fingerprint.

Fine-tuning a keras-hub model with LoRA trains megabytes of a model of gigabytes. With
``save_trainable_only=True`` a checkpoint holds ``trainable.npz`` instead of the model:

- ``weights/<i>``: the variables that change while training: ``model.trainable_variables`` (in
  the optimizer's order), then the variables that layers being trained create non-trainable
  (BatchNormalization's moving statistics; integer ones, quantized kernels, never train);
- ``optimizer/<i>``: every optimizer variable (iterations, learning rate, Adam's moments, a
  LossScaleOptimizer's scale).

Bytes are stored as they are (``npy.py``: bfloat16 as uint16), dtypes in ``state.json``'s layout.

The frozen weights come back from the user's ``build_model()`` (``from_preset`` and
``enable_lora``); the checkpoint records their fingerprint (CRC32C of their bytes, shapes and
dtypes, in ``model.weights`` order), and a model whose frozen weights differ is refused. A
CRC tells another base model from the run's; it is no defence against a forged one.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import keras
import numpy as np

from resumable.core.checksum import CHUNK_SIZE
from resumable.core.display import human_size
from resumable.core.errors import CheckpointMismatchError
from resumable.keras import compat
from resumable.keras.checkpoint import checkpoint_reading, npy

TRAINABLE_FILE = "trainable.npz"


@dataclass(frozen=True)
class Fingerprint:
    """The frozen weights of a model: a CRC32C over them, their count and their size in bytes."""

    crc32c: str
    variables: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"crc32c": self.crc32c, "variables": self.variables, "bytes": self.bytes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(str(data["crc32c"]), int(data["variables"]), int(data["bytes"]))

    def describe(self) -> str:
        return f"{self.crc32c} over {self.variables} variables, {human_size(self.bytes)}"


# ----------------------------------------------------------------------------- which variables


def trained_variables(model: keras.Model) -> list[Any]:
    """The variables a trainable-only checkpoint holds, trainable ones first (the optimizer's order)."""
    trainable = list(model.trainable_variables)
    others = compat.trained_non_trainable_variables(model)
    if others is None:  # cannot tell the frozen from the trained: hold every float non-trainable weight
        others = list(model.non_trainable_weights)
    ids = {id(v) for v in trainable}
    weights = {id(w) for w in model.weights}  # not seed generators: arrays.npz holds those
    return trainable + [v for v in others if id(v) not in ids and id(v) in weights and _is_float(v)]


def frozen_variables(model: keras.Model) -> list[Any]:
    """Every weight a trainable-only checkpoint leaves to ``build_model()``, in ``model.weights`` order."""
    trained = {id(v) for v in trained_variables(model)}
    return [w for w in model.weights if id(w) not in trained]


def _is_float(variable: Any) -> bool:
    return "float" in keras.backend.standardize_dtype(variable.dtype)


# ----------------------------------------------------------------------------- fingerprint

# model -> (ids of its frozen variables, their fingerprint): frozen weights do not change, and
# reading gigabytes off the accelerator at every save would cost more than the save.
_fingerprints: weakref.WeakKeyDictionary[keras.Model, tuple[tuple[int, ...], Fingerprint]] = (
    weakref.WeakKeyDictionary())


def fingerprint(model: keras.Model) -> Fingerprint:
    """The fingerprint of the model's frozen weights; computed once per model and set of variables."""
    frozen = frozen_variables(model)
    ids = tuple(id(v) for v in frozen)
    cached = _fingerprints.get(model)
    if cached is not None and cached[0] == ids:
        return cached[1]
    total = google_crc32c.Checksum()
    size = 0
    for variable in frozen:  # one variable at a time: host memory holds one, never the model
        value = npy.storable(keras.ops.convert_to_numpy(variable))
        total.update(f"{keras.backend.standardize_dtype(variable.dtype)}{list(value.shape)};".encode())
        for chunk in _chunks(value):
            total.update(chunk)
        size += value.nbytes
    found = Fingerprint(total.digest().hex(), len(frozen), size)
    _fingerprints[model] = (ids, found)
    return found


def _chunks(value: np.ndarray) -> Iterator[bytes]:
    """The array's bytes a few MB at a time: a variable may be a gigabyte, and crc32c takes bytes."""
    flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    for start in range(0, flat.size, CHUNK_SIZE):
        yield flat[start:start + CHUNK_SIZE].tobytes()


def check_fingerprint(model: keras.Model, saved: dict[str, Any], where: str) -> None:
    theirs = Fingerprint.from_json(saved)
    ours = fingerprint(model)
    if ours != theirs:
        raise CheckpointMismatchError(
            f"{where} was trained on other frozen weights than the model from build_model() has "
            f"(checkpoint: {theirs.describe()}; model: {ours.describe()}); build_model() must build "
            "the base model the run started from (the same preset and version, the same weights)"
        )


# ----------------------------------------------------------------------------- saving and loading


def save(model: keras.Model, folder: Path) -> dict[str, Any]:
    """Write ``trainable.npz``; return its layout and the frozen fingerprint, for ``state.json``."""
    weights = trained_variables(model)
    optimizer = list(getattr(model.optimizer, "variables", [])) if getattr(model, "optimizer", None) else []
    arrays: dict[str, np.ndarray] = {}
    for kind, variables in (("weights", weights), ("optimizer", optimizer)):
        for i, variable in enumerate(variables):
            arrays[f"{kind}/{i}"] = npy.storable(keras.ops.convert_to_numpy(variable))
    np.savez(folder / TRAINABLE_FILE, **arrays)  # type: ignore[arg-type]
    return {"weights": _layout(weights), "optimizer": _layout(optimizer),
            "frozen": fingerprint(model).to_json()}


def load(model: keras.Model, folder: Path, layout: dict[str, Any], where: str) -> None:
    """Check the model's frozen weights against the checkpoint's, then load what trains.

    The model's optimizer must exist (checked by the caller); it is built here if it is not yet.
    """
    weights = trained_variables(model)
    _check(weights, layout["weights"], "trained variables", where,
           "build_model() must make the same variables trainable as the run did (enable_lora with the "
           "same rank, the same layers frozen)")
    check_fingerprint(model, layout["frozen"], where)
    optimizer = getattr(model, "optimizer", None)
    variables: list[Any] = []
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables = list(optimizer.variables)
    _check(variables, layout["optimizer"], "optimizer variables", where,
           "compile with the optimizer and settings the run was started with")
    data = checkpoint_reading.read_npz(folder / TRAINABLE_FILE, where, npz_layout(layout))
    for kind, targets in (("weights", weights), ("optimizer", variables)):
        for i, variable in enumerate(targets):
            variable.assign(npy.for_variable(data[f"{kind}/{i}"], variable))


def npz_layout(layout: dict[str, Any]) -> dict[str, tuple[list[int], str]]:
    """What ``trainable.npz`` must hold by its layout in ``state.json``: key -> (shape, dtype)."""
    return {f"{kind}/{i}": (shape, dtype) for kind in ("weights", "optimizer")
            for i, (_, shape, dtype) in enumerate(layout[kind])}


def _layout(variables: list[Any]) -> list[list[Any]]:
    return [[v.path, [int(d) for d in v.shape], keras.backend.standardize_dtype(v.dtype)] for v in variables]


def _check(variables: list[Any], saved: list[list[Any]], what: str, where: str, advice: str) -> None:
    """Name the first variable whose shape or dtype differs, or the first one only one side has."""
    ours = _layout(variables)
    for i, ((path, shape, dtype), (saved_path, saved_shape, saved_dtype)) in enumerate(
            zip(ours, saved, strict=False)):
        if (list(shape), dtype) != (list(saved_shape), saved_dtype):
            raise CheckpointMismatchError(
                f"{where} does not fit the model from build_model(): of the {what}, number {i} is "
                f"{path!r} ({dtype} {tuple(shape)}) in the model but {saved_path!r} ({saved_dtype} "
                f"{tuple(saved_shape)}) in the checkpoint; {advice}"
            )
    if len(ours) != len(saved):
        extra = (ours if len(ours) > len(saved) else saved)[min(len(ours), len(saved))][0]
        raise CheckpointMismatchError(
            f"{where} holds {len(saved)} {what} and the model from build_model() has {len(ours)} "
            f"({extra!r} is only in the {'model' if len(ours) > len(saved) else 'checkpoint'}); {advice}"
        )
