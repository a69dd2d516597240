"""The training state a checkpoint carries besides the model's variables.

Callbacks' states (`CALLBACK_FIELDS`, and callbacks with ``get_state``/``set_state``,
`user_state`), the metrics' running totals within an epoch, the optimizer's step count and
learning rate, the global RNG states (Python's, NumPy's, Keras', torch's) and the states of
the layers' seed generators (Dropout's masks continue), and epoch logs as plain floats.
"""

from __future__ import annotations

import contextlib
import logging
import random
import sys
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from resumable.core.display import printable
from resumable.keras import compat
from resumable.keras.checkpoint import torch_backend, user_state
from resumable.keras.checkpoint.snapshot import ARRAYS_FILE, STATE_FILE
from resumable.keras.checkpoint.state_file import from_json_number, is_number, shown

logger = logging.getLogger("resumable")


# Attributes of Keras callbacks that change during fit and are reset by their on_train_begin.
CALLBACK_FIELDS: dict[str, tuple[str, ...]] = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "cooldown_counter", "best"),
    # keras.callbacks.ModelCheckpoint and resumable.ModelCheckpoint (same class name): the best so far
    "ModelCheckpoint": ("best",),
    "TensorBoard": compat.TENSORBOARD_COUNTERS,  # its summaries' steps continue
}


def callback_key(callbacks: Sequence[keras.callbacks.Callback], callback: keras.callbacks.Callback) -> str:
    """``"EarlyStopping#0"``: class name and position among callbacks of the same class."""
    same = [c for c in callbacks if type(c) is type(callback)]
    return f"{type(callback).__name__}#{same.index(callback)}"


def callback_states(
    callbacks: Sequence[keras.callbacks.Callback],
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """JSON state and arrays of the callbacks whose state we know how to carry over."""
    states: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for callback in callbacks:
        fields = CALLBACK_FIELDS.get(type(callback).__name__)
        if fields is None:
            if user_state.has_protocol(callback):
                key = callback_key(callbacks, callback)
                saved = user_state.capture(callback, key)
                if saved is not None:
                    states[key] = saved
            continue
        key = callback_key(callbacks, callback)
        states[key] = {name: getattr(callback, name, None) for name in fields}
        best_weights = getattr(callback, "best_weights", None)
        if best_weights is not None:
            states[key]["best_weights"] = len(best_weights)
            arrays.update({f"{key}/best_weights/{i}": np.asarray(w) for i, w in enumerate(best_weights)})
    return states, arrays


def restore_callback_states(callbacks: Sequence[keras.callbacks.Callback], states: dict[str, Any],
                            arrays: dict[str, np.ndarray]) -> list[str]:
    """Set the saved attributes back; return the keys restored.

    Only the fields `callback_states` saves for that class (`CALLBACK_FIELDS`, plus
    ``best_weights`` from ``arrays``), each with a value of the kind saved: state.json is read
    from a run folder, and must never set ``on_epoch_end`` or ``model``. Anything else is
    skipped with one warning naming it. A callback of another class with ``get_state`` and
    ``set_state`` gets its saved state through ``set_state`` (`user_state`).
    """
    restored = []
    for callback in callbacks:
        fields = CALLBACK_FIELDS.get(type(callback).__name__)
        key = callback_key(callbacks, callback)
        if fields is None:
            if user_state.has_protocol(callback) and key in states and user_state.restore(
                    callback, key, states[key]):
                restored.append(key)
            continue
        if key not in states:
            continue
        saved = states[key]
        if type(saved) is not dict:
            _skip_state(key, None, "not a JSON object")
            continue
        for name, value in saved.items():
            if name == "best_weights":
                weights = _best_weights(key, value, arrays)
                if weights is not None:
                    callback.best_weights = weights
            elif name not in fields:
                _skip_state(key, name, "not a field resumable saves for this callback")
            elif not is_number(value, or_none=True):
                _skip_state(key, name, f"{shown(value)} is not a number")
            else:
                setattr(callback, name, from_json_number(value))
        restored.append(key)
    return restored


def _best_weights(key: str, count: Any, arrays: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """The ``count`` arrays saved as ``key``'s best weights; None (with a warning) unless all are there."""
    if type(count) is int and 0 <= count <= len(arrays):  # never a range of a hostile 10**18
        names = [f"{key}/best_weights/{i}" for i in range(count)]
        if all(name in arrays for name in names):
            return [arrays[name] for name in names]
    _skip_state(key, "best_weights", f"{shown(count)} arrays named, not all in {ARRAYS_FILE}")
    return None


def _skip_state(key: str, name: str | None, why: str) -> None:
    field = printable(f"{key}.{name}" if name is not None else key)
    logger.warning("resumable: not restoring %s from %s: %s", field, STATE_FILE, printable(why))


def metric_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """The running totals of the model's metrics (loss included) within the current epoch.

    Saved with mid-epoch checkpoints so the resumed epoch reports the same metrics as an
    uninterrupted one: Keras resets them when an epoch begins.
    """
    return {f"metrics/{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.metrics_variables)}


def metrics_so_far(model: keras.Model) -> dict[str, Any]:
    """The model's metrics so far in the epoch; empty when Keras cannot say (no metric built yet)."""
    try:
        result: dict[str, Any] = model.get_metrics_result()
    except Exception:  # noqa: BLE001 - only feeds the manifest's metrics
        return {}
    return result


def add_metrics(model: keras.Model, arrays: dict[str, np.ndarray]) -> bool:
    """Add saved running totals to the model's metrics; False (untouched) if they do not fit.

    Called after the first batch of a resumed epoch, once Keras has built the compiled metrics:
    their states are sums (Keras aggregates them across replicas by adding), so saved + this
    batch's contribution is exactly what an uninterrupted epoch holds at this point.
    """
    variables = model.metrics_variables
    saved = [arrays.get(f"metrics/{i}") for i in range(len(variables))]
    if not variables or len(arrays) != len(variables) or any(
        s is None or tuple(s.shape) != tuple(v.shape) or getattr(v, "aggregation", "sum") != "sum"
        for s, v in zip(saved, variables, strict=True)
    ):
        return False
    for variable, value in zip(variables, saved, strict=True):
        current = keras.ops.convert_to_numpy(variable)
        variable.assign(current + np.asarray(value, dtype=current.dtype))
    return True


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's, Keras' and (where imported) torch's global RNG states, as JSON-able values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }
    generator = compat.global_seed_generator()
    if generator is not None:
        state["keras"] = keras.ops.convert_to_numpy(generator.state).tolist()
    if "torch" in sys.modules:  # torch's state where torch is imported (`torch_backend`), else nothing to ask
        torch = torch_backend.rng_state()
        if torch is not None:
            state[torch_backend.STATE_KEY] = torch
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    generator = compat.global_seed_generator(create="keras" in state)
    if "keras" in state and generator is not None:
        generator.state.assign(np.asarray(state["keras"], dtype=generator.state.dtype))
    if torch_backend.STATE_KEY in state:
        torch_backend.set_rng_state(state[torch_backend.STATE_KEY])


def python_random(state: dict[str, Any]) -> random.Random:
    """A `random.Random` in the Python state of an `rng_state()` (the global RNG is left alone)."""
    generator = random.Random()
    if "python" in state:
        version, internal, gauss = state["python"]
        generator.setstate((version, tuple(internal), gauss))
    return generator


def _seed_generator_states(model: keras.Model) -> list[Any]:
    """Variables of the model that are not weights: the states of its layers' SeedGenerators."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def seed_generator_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """The layers' seed generator states, as ``arrays.npz`` holds them."""
    states = _seed_generator_states(model)
    return {f"seed_generators/{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(states)}


def restore_seed_generators(model: keras.Model, arrays: dict[str, np.ndarray], where: str) -> None:
    """Put back the states `seed_generator_arrays` saved; a warning (nothing changed) if their
    layout differs."""
    states = _seed_generator_states(model)
    saved = [arrays[key] for i in range(len(states)) if (key := f"seed_generators/{i}") in arrays]
    if len(saved) != len(states) or any(
        tuple(s.shape) != tuple(v.shape) for s, v in zip(saved, states, strict=True)
    ):
        logger.warning("resumable: %s: layers' random-number states not restored (layout differs)", where)
        return
    for variable, value in zip(states, saved, strict=True):
        variable.assign(value)


def optimizer_summary(model: keras.Model) -> dict[str, Any] | None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    summary: dict[str, Any] = {"class": type(optimizer).__name__, "iterations": iterations(model)}
    with contextlib.suppress(Exception):  # a schedule has no single value
        summary["learning_rate"] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    return summary


def learning_rate(model: keras.Model) -> Any:
    """The optimizer's learning rate as an array, when it is a variable (not a schedule); else None."""
    rate = getattr(getattr(model, "optimizer", None), "learning_rate", None)
    if not hasattr(rate, "assign"):
        return None
    return keras.ops.convert_to_numpy(rate)


def set_learning_rate(model: keras.Model, value: Any) -> None:
    """Put back a rate `learning_rate` read (nothing for None)."""
    if value is not None:
        model.optimizer.learning_rate.assign(value)


def iterations(model: keras.Model) -> int:
    """Optimizer steps done over the whole run (0 without an optimizer)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def logs_to_floats(logs: dict[str, Any] | None) -> dict[str, float]:
    """Epoch logs as plain floats (Keras may hand backend scalars)."""
    result = {}
    for key, value in (logs or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            result[str(key)] = float(keras.ops.convert_to_numpy(value))
    return result
