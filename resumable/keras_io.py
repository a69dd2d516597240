"""A model and its training state to files in a local folder, and back.

The only module that saves or loads Keras models. Keras and h5py only ever see local paths:
the storage layer copies the folder to Drive or ``gs://`` afterwards. That keeps h5py's
"Unable to create file" on gs:// paths, TensorFlow's gfile (which ignores emulators and does not
exist on JAX runtimes) and TPU file-system errors out of reach. No SavedModel and no
``tf.train.Checkpoint`` is written: Keras 3 reads variable values through the host, so saving
under a TPU strategy needs no ``experimental_io_device``.

Files of a checkpoint folder:

- ``model.keras`` (or ``model.weights.h5`` with ``save_weights_only``): weights and optimizer state.
- ``state.json``: history, callback states, RNG states, the weight layout (to name mismatches).
- ``arrays.npz``: states of the model's seed generators (Dropout's masks continue, Keras does not
  save them) and arrays held by callbacks (EarlyStopping's best weights).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from resumable.errors import CheckpointMismatchError, CheckpointNotFoundError

logger = logging.getLogger("resumable")

MODEL_FILE = "model.keras"
WEIGHTS_FILE = "model.weights.h5"
STATE_FILE = "state.json"
ARRAYS_FILE = "arrays.npz"
STATE_VERSION = 1

# Attributes of Keras callbacks that change during fit and are reset by their on_train_begin.
CALLBACK_FIELDS: dict[str, tuple[str, ...]] = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "cooldown_counter", "best"),
}


# ----------------------------------------------------------------------------- saving


def save(model: keras.Model, folder: Path, *, weights_only: bool, state: dict[str, Any],
         arrays: dict[str, np.ndarray] | None = None) -> None:
    """Write the model (with its optimizer state), ``state.json`` and callback arrays to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {**(arrays or {}), **_seed_generator_arrays(model)}
    if weights_only:
        model.save_weights(str(folder / WEIGHTS_FILE))
    else:
        model.save(str(folder / MODEL_FILE))
    state = {**state, "version": STATE_VERSION, "model": model_summary(model)}
    (folder / STATE_FILE).write_text(json.dumps(_jsonable(state), indent=1))
    if arrays:
        np.savez(folder / ARRAYS_FILE, **arrays)  # type: ignore[arg-type]


def _seed_generator_states(model: keras.Model) -> list[Any]:
    """Variables of the model that are not weights: the states of its layers' SeedGenerators."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _seed_generator_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    states = _seed_generator_states(model)
    return {f"seed_generators/{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(states)}


def restore_seed_generators(model: keras.Model, arrays: dict[str, np.ndarray], where: str) -> None:
    states = _seed_generator_states(model)
    saved = [arrays[key] for i in range(len(states)) if (key := f"seed_generators/{i}") in arrays]
    if len(saved) != len(states) or any(
        tuple(s.shape) != tuple(v.shape) for s, v in zip(saved, states, strict=True)
    ):
        logger.warning("resumable: %s: layers' random-number states not restored (layout differs)", where)
        return
    for variable, value in zip(states, saved, strict=True):
        variable.assign(value)


def model_summary(model: keras.Model) -> dict[str, Any]:
    """The weight layout and build config, so a later load can name a mismatch or build the model."""
    summary: dict[str, Any] = {
        "class": type(model).__name__,
        "weights": [[w.path, list(w.shape)] for w in model.weights],
    }
    with contextlib.suppress(Exception):  # not every model can describe how it was built
        summary["build_config"] = model.get_build_config()
    return summary


def optimizer_summary(model: keras.Model) -> dict[str, Any] | None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    summary: dict[str, Any] = {"class": type(optimizer).__name__, "iterations": iterations(model)}
    with contextlib.suppress(Exception):  # a schedule has no single value
        summary["learning_rate"] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    return summary


def iterations(model: keras.Model) -> int:
    """Optimizer steps done over the whole run (0 without an optimizer)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


# ----------------------------------------------------------------------------- loading


def read_state(folder: Path) -> dict[str, Any]:
    path = folder / STATE_FILE
    if not path.is_file():
        return {}
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def read_arrays(folder: Path) -> dict[str, np.ndarray]:
    path = folder / ARRAYS_FILE
    if not path.is_file():
        return {}
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def load_model(folder: Path, build_model: Callable[[], keras.Model] | None, *, strategy: Any = None,
               where: str) -> keras.Model:
    """Rebuild the model of a fetched checkpoint folder, optimizer state included.

    With ``build_model``, its model receives the checkpoint's weights (the user's code keeps
    defining the architecture, custom objects and compile arguments); without it, the
    ``.keras`` file is loaded as saved. ``where`` names the checkpoint in errors.
    """
    state = read_state(folder)
    weights_file = folder / (WEIGHTS_FILE if (folder / WEIGHTS_FILE).is_file() else MODEL_FILE)
    if not weights_file.is_file():
        raise CheckpointMismatchError(f"{where}: holds neither {MODEL_FILE} nor {WEIGHTS_FILE}")
    with scope(strategy):
        if build_model is None:
            if weights_file.name == WEIGHTS_FILE:
                raise CheckpointNotFoundError(
                    f"{where} holds weights only (save_weights_only=True); pass build_model=<a function "
                    "returning the compiled model> to resumable.resume()"
                )
            model = keras.saving.load_model(str(weights_file))
        else:
            model = build(build_model)
            _ensure_built(model, state.get("model", {}), where)
            _check_layout(model, state.get("model", {}).get("weights"), where)
            _check_optimizer_class(model, state.get("optimizer"), where)
            optimizer = getattr(model, "optimizer", None)
            if optimizer is not None and not optimizer.built:
                # Keras 3 skips optimizer variables in load_weights unless the optimizer exists.
                optimizer.build(model.trainable_variables)
            try:
                model.load_weights(str(weights_file))
            except ValueError as e:
                raise CheckpointMismatchError(
                    f"{where} does not fit the model from build_model(): {e}"
                ) from e
    _check_optimizer(model, state.get("optimizer"), where)
    with scope(strategy):
        restore_seed_generators(model, read_arrays(folder), where)
    return model


def build(build_model: Callable[[], keras.Model]) -> keras.Model:
    model = build_model()
    if not isinstance(model, keras.Model):
        raise ValueError(
            "Invalid value for argument `build_model`. Received: a function returning "
            f"{type(model).__name__}. Expected a function that returns a compiled keras.Model."
        )
    return model


def scope(strategy: Any) -> contextlib.AbstractContextManager[Any]:
    """``strategy.scope()``, or nothing without a strategy."""
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def _ensure_built(model: keras.Model, saved: dict[str, Any], where: str) -> None:
    if model.built and model.weights:
        return
    config = saved.get("build_config")
    if config:
        with contextlib.suppress(Exception):
            model.build_from_config(config)
    if not (model.built and model.weights):
        raise CheckpointMismatchError(
            f"{where}: the model from build_model() has no weights yet; start it with keras.Input(shape=...) "
            "or call model.build(input_shape) inside build_model"
        )


def _check_layout(model: keras.Model, saved: Sequence[Sequence[Any]] | None, where: str) -> None:
    """Name the first weight whose shape differs, before Keras says something vaguer."""
    if saved is None:
        return
    ours = [(w.path, [int(d) for d in w.shape]) for w in model.weights]
    prefix = f"{where} does not fit the model from build_model()"
    for i, ((path, shape), (saved_path, saved_shape)) in enumerate(zip(ours, saved, strict=False)):
        if list(shape) != [int(d) for d in saved_shape]:
            raise CheckpointMismatchError(
                f"{prefix}: weight {i} {path!r} has shape {tuple(shape)} in the model but "
                f"{tuple(saved_shape)} in the checkpoint (saved as {saved_path!r})"
            )
    if len(ours) != len(saved):
        more, fewer = ("model", "checkpoint") if len(ours) > len(saved) else ("checkpoint", "model")
        extra = (ours if len(ours) > len(saved) else saved)[min(len(ours), len(saved))][0]
        raise CheckpointMismatchError(
            f"{prefix}: the model has {len(ours)} weights and the checkpoint {len(saved)}; "
            f"the {more} has more, starting with {extra!r} which the {fewer} lacks"
        )


def _check_optimizer(model: keras.Model, saved: dict[str, Any] | None, where: str) -> None:
    """Fail where Keras would silently continue with a fresh optimizer."""
    if not saved:
        return
    _check_optimizer_class(model, saved, where)
    restored = iterations(model)
    if restored != int(saved["iterations"]):
        raise CheckpointMismatchError(
            f"{where}: the optimizer state was not restored (iterations {restored}, checkpoint "
            f"{saved['iterations']}); does build_model() compile with the same optimizer settings?"
        )


def _check_optimizer_class(model: keras.Model, saved: dict[str, Any] | None, where: str) -> None:
    if not saved:
        return
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise CheckpointMismatchError(
            f"{where} holds {saved['class']} optimizer state but the model is not compiled; "
            "compile it inside build_model (model.compile(optimizer=...))"
        )
    if type(optimizer).__name__ != saved["class"]:
        raise CheckpointMismatchError(
            f"{where} holds {saved['class']} optimizer state but the model's optimizer is "
            f"{type(optimizer).__name__}; compile with the optimizer the run was started with"
        )


# ----------------------------------------------------------------------------- callback states


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
    """Set the saved attributes back; return the keys restored."""
    restored = []
    for callback in callbacks:
        key = callback_key(callbacks, callback) if type(callback).__name__ in CALLBACK_FIELDS else None
        if key is None or key not in states:
            continue
        for name, value in states[key].items():
            if name == "best_weights":
                callback.best_weights = [arrays[f"{key}/best_weights/{i}"] for i in range(int(value))]
            else:
                setattr(callback, name, _from_json_number(value))
        restored.append(key)
    return restored


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's and Keras' global RNG states, as JSON-able values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }
    generator = _keras_global_seed_generator()
    if generator is not None:
        state["keras"] = keras.ops.convert_to_numpy(generator.state).tolist()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    generator = _keras_global_seed_generator(create="keras" in state)
    if "keras" in state and generator is not None:
        generator.state.assign(np.asarray(state["keras"], dtype=generator.state.dtype))


def _keras_global_seed_generator(create: bool = False) -> Any:
    """Keras' global SeedGenerator (unseeded random ops draw from it); private API, so guarded."""
    try:
        from keras.src.backend.common import global_state

        generator = global_state.get_global_attribute("global_seed_generator")
        if generator is None and create:
            from keras.src.random.seed_generator import global_seed_generator

            generator = global_seed_generator()
        return generator
    except Exception:
        return None


# ----------------------------------------------------------------------------- environment


def versions() -> dict[str, str]:
    from resumable import __version__

    backend = keras.backend.backend()
    found = {"resumable": __version__, "keras": keras.__version__}
    module = sys.modules.get(backend)
    if module is not None:
        found[backend] = str(getattr(module, "__version__", "?"))
    return found


def is_chief(model: keras.Model | None, strategy: Any = None) -> bool:
    """False on the workers of a multi-worker run, which must not write to the run folder."""
    strategy = strategy or getattr(model, "distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    if extended is not None and hasattr(extended, "should_checkpoint"):
        return bool(extended.should_checkpoint)
    if keras.backend.backend() == "jax" and "jax" in sys.modules:
        return int(sys.modules["jax"].process_index()) == 0
    return True


def _jsonable(value: Any) -> Any:
    """Plain JSON: numpy scalars to numbers, NaN and infinities to strings JSON can hold."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
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


def _from_json_number(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


def jsonable(value: Any) -> Any:
    """Public alias of the JSON conversion used for ``state.json`` and the manifest's state."""
    return _jsonable(value)


def logs_to_floats(logs: dict[str, Any] | None) -> dict[str, float]:
    """Epoch logs as plain floats (Keras may hand backend scalars)."""
    result = {}
    for key, value in (logs or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            result[str(key)] = float(keras.ops.convert_to_numpy(value))
    return result
