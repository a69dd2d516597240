"""``state.json`` and ``arrays.npz`` of a fetched checkpoint folder, read and checked.

``state.json`` is read from a run folder that someone else may have written: `read_state`
refuses one over `STATE_LIMIT` unread, one that is not strict JSON, and one with a field of
the wrong type where a restore would read it (`check_state`). Numbers are written by
`jsonable` (NaN and infinities as strings) and read back by `from_json_number`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from resumable.core import safe_json
from resumable.core.display import printable
from resumable.core.errors import (
    CorruptCheckpointError,
)
from resumable.keras.checkpoint import checkpoint_reading, torch_backend
from resumable.keras.checkpoint.snapshot import ARRAYS_FILE, STATE_FILE

STATE_VERSION = 1
STATE_LIMIT = safe_json.STATE_LIMIT  # bytes: a larger state.json is refused unread


def read_state(folder: Path, where: str | None = None) -> dict[str, Any]:
    """``state.json`` of a fetched checkpoint folder ({} without one); ``where`` names it in errors.

    Raises CorruptCheckpointError when it is not what resumable writes: over `STATE_LIMIT`
    (never read whole), not strict UTF-8 JSON, or a field the restore uses of the wrong type.
    The checkpoint's CRC32C vouches only for the bytes, not for who wrote them.
    """
    path = folder / STATE_FILE
    if not path.is_file():
        return {}
    with path.open("rb") as f:  # read(n) sets n bytes aside first: no more than the file holds
        data = f.read(min(os.fstat(f.fileno()).st_size, STATE_LIMIT) + 1)
    try:
        state = safe_json.loads(data, STATE_LIMIT)
        check_state(state)
    except ValueError as e:  # safe_json.RefusedJSON is one
        raise CorruptCheckpointError(
            f"{where or folder}: {STATE_FILE} {printable(str(e))}; this checkpoint cannot be restored "
            "(resume() falls back to the one before it)"
        ) from None
    return state


def check_state(state: Any) -> None:
    """ValueError naming the first field of ``state.json`` a restore would trip over.

    Only what the restore reads is checked; callbacks' states are checked field by field as
    they are restored (`restore_callback_states`), where a bad one is skipped with a warning.
    """
    if type(state) is not dict:
        raise ValueError(f"is not a JSON object (got {shown(state)})")
    for key, kind in _STATE_TYPES.items():
        value = state.get(key)
        if key in state and type(value) is not kind and not (value is None and key in _MAY_BE_NULL):
            raise ValueError(f"field {key}: expected {_KIND_NAMES[kind]}, got {shown(value)}")
    if not is_number(state.get("best", None), or_none=True):
        raise ValueError(f"field best: expected a number, got {shown(state['best'])}")
    for i, logs in enumerate(state.get("history") or []):
        if type(logs) is not dict or not all(is_number(v) for v in logs.values()):
            raise ValueError(f"field history[{i}]: expected an object of numbers, got {shown(logs)}")
    for key in ("rng", "epoch_rng"):
        _check_rng(key, state.get(key) or {})
    weights = (state.get("model") or {}).get("weights")
    if weights is not None and not (type(weights) is list and all(
            type(w) is list and len(w) == 2 and type(w[0]) is str and type(w[1]) is list
            and all(type(d) is int and d >= 0 for d in w[1]) for w in weights)):
        raise ValueError("field model.weights: expected a list of [path, shape] pairs")
    optimizer = state.get("optimizer")
    if optimizer and not (type(optimizer.get("class")) is str and type(optimizer.get("iterations")) is int):
        raise ValueError("field optimizer: expected its class name and iterations")
    if "trainable" in state:
        _check_trainable_layout(state["trainable"])
    if "inputs" in state:
        _check_inputs(state["inputs"])


def _check_trainable_layout(layout: dict[str, Any]) -> None:
    """A trainable-only checkpoint's layout, as `trainable.save` writes it."""
    for key in ("weights", "optimizer"):
        entries = layout.get(key)
        if not (type(entries) is list and all(
                type(e) is list and len(e) == 3 and type(e[0]) is str and type(e[1]) is list
                and all(type(d) is int and d >= 0 for d in e[1]) and type(e[2]) is str for e in entries)):
            raise ValueError(f"field trainable.{key}: expected a list of [path, shape, dtype]")
    frozen = layout.get("frozen")
    if not (type(frozen) is dict and type(frozen.get("crc32c")) is str
            and all(type(frozen.get(k)) is int and frozen[k] >= 0 for k in ("variables", "bytes"))):
        raise ValueError("field trainable.frozen: expected its crc32c, variables and bytes")


_INPUT_ROLES = ("x", "validation_data")  # inputs.TRAIN, inputs.VALIDATION


def _check_inputs(inputs: dict[str, Any]) -> None:
    """Where run.fit's inputs stood (`inputs.Feed.state`): a role, a kind, whole-number positions."""
    for name, entry in inputs.items():
        if name not in _INPUT_ROLES or type(entry) is not dict or type(entry.get("kind")) is not str:
            raise ValueError(f"field inputs.{name}: expected an input's kind and position")
        for field in ("position", "order_seed"):
            if field in entry and not (type(entry[field]) is int and 0 <= entry[field] < 2**63):
                raise ValueError(f"field inputs.{name}.{field}: expected a whole number, "
                                 f"got {shown(entry[field])}")


_STATE_TYPES: dict[str, type] = {
    "monitor": str, "mode": str, "stopped_early": bool, "history": list, "callbacks": dict, "rng": dict,
    "epoch_rng": dict, "model": dict, "optimizer": dict, "trainable": dict, "inputs": dict,
}
# null reads as "none" for these; the others are read with .get(key, {}), where null would break
_MAY_BE_NULL = ("monitor", "mode", "stopped_early", "epoch_rng", "optimizer")
_KIND_NAMES = {str: "a string", bool: "true or false", list: "a list", dict: "an object"}
_NUMBER_TEXTS = ("nan", "inf", "-inf")  # how `jsonable` writes NaN and infinities


def is_number(value: Any, or_none: bool = False) -> bool:
    """A number as `jsonable` writes one (never a bool); None too with ``or_none``."""
    return (type(value) in (int, float) or value in _NUMBER_TEXTS or (or_none and value is None)) and (
        type(value) is not int or abs(value) < 2**63)


def _check_rng(key: str, rng: dict[str, Any]) -> None:
    """The RNG states `rng_state` writes, as `set_rng_state` needs them."""
    python, numpy, generator = rng.get("python"), rng.get("numpy"), rng.get("keras")
    if python is not None and not (
            type(python) is list and len(python) == 3 and type(python[0]) is int and _words(python[1], 625)
            and (python[2] is None or type(python[2]) is float)):
        raise ValueError(f"field {key}.python: not a Python random state")
    if numpy is not None and not (
            type(numpy) is list and len(numpy) == 5 and type(numpy[0]) is str and _words(numpy[1], 624)
            and type(numpy[2]) is int and 0 <= numpy[2] <= 624 and type(numpy[3]) is int
            and type(numpy[4]) in (int, float)):
        raise ValueError(f"field {key}.numpy: not a NumPy random state")
    if generator is not None and not _words(generator, None, low=-(2**63), high=2**63):  # int64 on TF
        raise ValueError(f"field {key}.keras: not a Keras seed generator state")
    torch = rng.get(torch_backend.STATE_KEY)
    if torch is not None and not torch_backend.is_rng_state(torch):
        raise ValueError(f"field {key}.torch: not a torch random state")


def _words(values: Any, length: int | None, low: int = 0, high: int = 2**32) -> bool:
    """A list of integers in [low, high), 32-bit unsigned by default (of ``length``, when given)."""
    return type(values) is list and (length is None or len(values) == length) and all(
        type(v) is int and low <= v < high for v in values)


def shown(value: Any) -> str:
    """A value as an error message quotes it: short, one line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_arrays(folder: Path, where: str | None = None) -> dict[str, np.ndarray]:
    """``arrays.npz`` of a fetched checkpoint folder ({} without one), read through the
    checkpoint reading boundary (`checkpoint_reading.read_npz`): CorruptCheckpointError if
    NumPy would refuse it or it would grow in memory."""
    path = folder / ARRAYS_FILE
    if not path.is_file():
        return {}
    return checkpoint_reading.read_npz(path, where or str(folder))


def jsonable(value: Any) -> Any:
    """Plain JSON, as ``state.json`` and the manifest's state hold it: numpy scalars to numbers, NaN
    and infinities to strings JSON can hold."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf'
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        return float(value)  # backend scalars (tf.Tensor, jax.Array)
    except (TypeError, ValueError):
        return str(value)


def from_json_number(value: Any) -> Any:
    """A number `jsonable` wrote, as a float again where it was NaN or an infinity."""
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value
