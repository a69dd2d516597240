"""A model and its training state to files in a local folder, and back.

The only module that saves or loads Keras models. Keras and h5py only ever see local paths:
the storage layer copies the folder to Drive or ``gs://`` afterwards. That keeps h5py's
"Unable to create file" on gs:// paths, TensorFlow's gfile (which ignores emulators and does not
exist on JAX runtimes) and TPU file-system errors out of reach. No SavedModel and no
``tf.train.Checkpoint`` is written: Keras 3 reads variable values through the host, so saving
under a TPU strategy needs no ``experimental_io_device``.

Files of a checkpoint folder:

- ``model.keras`` (or ``model.weights.h5`` with ``save_weights_only``): weights and optimizer state;
  weights over ``max_shard_size`` GiB in Keras' shards instead: ``model.weights.json`` and
  ``model_00000.weights.h5``, ... (with ``config.json``, ``metadata.json`` and ``assets/`` of a
  full model: an unzipped ``.keras``; `snapshot.py`);
  with ``save_trainable_only``, ``trainable.npz`` instead: what trains and its optimizer state
  (``trainable.py``), the frozen weights named by a fingerprint in ``state.json``.
- ``state.json``: history, callback states, RNG states (torch's too, where imported), the weight
  layout (to name mismatches); mid-epoch, also the RNG states at the epoch's start
  (``epoch_rng``: they decide its data order).
- ``arrays.npz``: states of the model's seed generators (Dropout's masks continue, Keras does not
  save them), arrays held by callbacks (EarlyStopping's best weights), in full checkpoints the
  unmerged variables of LoRA layers (``lora/<i>``: Keras saves them merged, ``lora.py``) and,
  mid-epoch, the metrics' running totals (``metrics/<i>``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from resumable.core import safe_json
from resumable.core.display import printable
from resumable.core.errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    ResumableError,
)
from resumable.keras import (
    checkpoint_reading,
    compat,
    legacy_h5,
    lora,
    shards,
    torch_backend,
    trainable,
    user_state,
    zip_member,
)

# The file names come from the module that writes them; callers know them from here.
from resumable.keras.snapshot import (
    ARRAYS_FILE,
    ASSETS_FOLDER,
    CONFIG_FILE,
    METADATA_FILE,
    MODEL_FILE,
    SHARD_NAME,
    SHARDS_FILE,
    STATE_FILE,
    WEIGHTS_FILE,
    ModelSnapshot,
)
from resumable.keras.snapshot import take as take_snapshot

logger = logging.getLogger("resumable")

STATE_VERSION = 1
STATE_LIMIT = safe_json.STATE_LIMIT  # bytes: a larger state.json is refused unread

# Attributes of Keras callbacks that change during fit and are reset by their on_train_begin.
CALLBACK_FIELDS: dict[str, tuple[str, ...]] = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "cooldown_counter", "best"),
    # keras.callbacks.ModelCheckpoint and resumable.ModelCheckpoint (same class name): the best so far
    "ModelCheckpoint": ("best",),
    "TensorBoard": compat.TENSORBOARD_COUNTERS,  # its summaries' steps continue
}


# ----------------------------------------------------------------------------- saving


def save(model: keras.Model, folder: Path, *, weights_only: bool, state: dict[str, Any],
         arrays: dict[str, np.ndarray] | None = None, trainable_only: bool = False,
         max_shard_size: float | None = None) -> str:
    """Write the model (with its optimizer state), ``state.json`` and callback arrays to ``folder``;
    returns the payload file's name (the manifest's ``payload``).

    ``trainable_only``: only what trains and its optimizer state (``trainable.npz``), with the
    frozen weights' fingerprint in ``state.json``. ``max_shard_size``: weights over this many
    GiB go to shards of at most that size.
    """
    if trainable_only:
        _save_trainable(model, folder, state, arrays)
        return trainable.TRAINABLE_FILE
    taken = snapshot(model, weights_only=weights_only, state=state, arrays=arrays,
                     max_shard_size=max_shard_size)
    if taken is not None:
        taken.write(folder)
        return taken.payload
    folder.mkdir(parents=True, exist_ok=True)  # a Keras without the internals snapshots need
    with _no_tensorflow_import(), _no_distribution():
        if weights_only:
            model.save_weights(str(folder / WEIGHTS_FILE))
        else:
            model.save(str(folder / MODEL_FILE))
    (folder / STATE_FILE).write_text(json.dumps(_checkpoint_state(model, state), indent=1))
    arrays = _all_arrays(model, arrays)
    if arrays:
        np.savez(folder / ARRAYS_FILE, **arrays)  # type: ignore[arg-type]
    return WEIGHTS_FILE if weights_only else MODEL_FILE


def _save_trainable(model: keras.Model, folder: Path, state: dict[str, Any],
                    arrays: dict[str, np.ndarray] | None) -> None:
    """A trainable-only checkpoint: megabytes, written at once (no snapshot to write later)."""
    _check_whole_arrays(model)
    folder.mkdir(parents=True, exist_ok=True)
    layout = trainable.save(model, folder)
    (folder / STATE_FILE).write_text(
        json.dumps(_checkpoint_state(model, {**state, "trainable": layout}), indent=1))
    arrays = {**(arrays or {}), **_seed_generator_arrays(model)}  # LoRA layers: assigned, never merged
    if arrays:
        np.savez(folder / ARRAYS_FILE, **arrays)  # type: ignore[arg-type]


def _all_arrays(model: keras.Model, arrays: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """``arrays.npz`` of a full checkpoint: the caller's arrays, the layers' seed generator states
    and the LoRA layers' variables unmerged (Keras saves those layers merged)."""
    return {**(arrays or {}), **_seed_generator_arrays(model), **lora.raw_arrays(model)}


def snapshot(model: keras.Model, *, weights_only: bool, state: dict[str, Any],
             arrays: dict[str, np.ndarray] | None = None, max_shard_size: float | None = None
             ) -> ModelSnapshot | None:
    """What `save` writes, copied into host memory now, to be written later (`ModelSnapshot.write`).

    Training waits only for this copy; None on a Keras without the internals it needs.
    """
    _check_whole_arrays(model)
    # Copies: a JAX step may donate the buffers these arrays view (seed generators, metrics).
    arrays = {key: np.array(value, copy=True) for key, value in _all_arrays(model, arrays).items()}
    with _no_tensorflow_import(), _no_distribution():
        return take_snapshot(model, weights_only=weights_only, state=_checkpoint_state(model, state),
                             arrays=arrays, max_shard_size=max_shard_size)


def checkpoint_state(model: keras.Model, state: dict[str, Any]) -> dict[str, Any]:
    """#36: ``state.json``'s content (for `multihost.py`, which writes it for a split model)."""
    return _checkpoint_state(model, state)


def seed_generator_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """#36: the layers' seed generator states, as ``arrays.npz`` holds them (for `multihost.py`)."""
    return _seed_generator_arrays(model)


def _checkpoint_state(model: keras.Model, state: dict[str, Any]) -> dict[str, Any]:
    """``state.json``'s content: the caller's state, its version and the model's weight layout."""
    result: dict[str, Any] = _jsonable({**state, "version": STATE_VERSION, "model": model_summary(model)})
    return result


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


# ----------------------------------------------------------------------------- loading


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
        raise ValueError(f"is not a JSON object (got {_shown(state)})")
    for key, kind in _STATE_TYPES.items():
        value = state.get(key)
        if key in state and type(value) is not kind and not (value is None and key in _MAY_BE_NULL):
            raise ValueError(f"field {key}: expected {_KIND_NAMES[kind]}, got {_shown(value)}")
    if not _is_number(state.get("best", None), or_none=True):
        raise ValueError(f"field best: expected a number, got {_shown(state['best'])}")
    for i, logs in enumerate(state.get("history") or []):
        if type(logs) is not dict or not all(_is_number(v) for v in logs.values()):
            raise ValueError(f"field history[{i}]: expected an object of numbers, got {_shown(logs)}")
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
                                 f"got {_shown(entry[field])}")


_STATE_TYPES: dict[str, type] = {
    "monitor": str, "mode": str, "stopped_early": bool, "history": list, "callbacks": dict, "rng": dict,
    "epoch_rng": dict, "model": dict, "optimizer": dict, "trainable": dict, "inputs": dict,
}
# null reads as "none" for these; the others are read with .get(key, {}), where null would break
_MAY_BE_NULL = ("monitor", "mode", "stopped_early", "epoch_rng", "optimizer")
_KIND_NAMES = {str: "a string", bool: "true or false", list: "a list", dict: "an object"}
_NUMBER_TEXTS = ("nan", "inf", "-inf")  # how `_jsonable` writes NaN and infinities


def _is_number(value: Any, or_none: bool = False) -> bool:
    """A number as `_jsonable` writes one (never a bool); None too with ``or_none``."""
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


def _shown(value: Any) -> str:
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


def check_checkpoint(folder: Path, where: str) -> dict[str, Any]:
    """Everything of a fetched checkpoint folder that can be checked before loading it, its
    ``state.json`` returned: that file (`read_state`), then the headers and directories of
    its arrays and weights (`checkpoint_reading.check_files`; shards are checked as they land).

    The ``check`` of `RunManager.arriving_newest`: CorruptCheckpointError makes the checkpoint
    damaged, and the one before it is used.
    """
    state = read_state(folder, where)
    layout = state.get("trainable")
    layouts = {trainable.TRAINABLE_FILE: trainable.npz_layout(layout)} if layout is not None else {}
    checkpoint_reading.check_files(folder, where, (ARRAYS_FILE, trainable.TRAINABLE_FILE, MODEL_FILE,
                                                   WEIGHTS_FILE), layouts)
    return state


def load_model(folder: Path, build_model: Callable[[], keras.Model] | None, *, strategy: Any = None,
               distribution: Any = None, where: str, landed: Landed | None = None,
               weights: Callable[[keras.Model], None] | None = None) -> keras.Model:
    """Rebuild the model of a fetched checkpoint folder, optimizer state included.

    With ``build_model``, its model receives the checkpoint's weights (the user's code keeps
    defining the architecture, custom objects and compile arguments); without it, the
    ``.keras`` file is loaded as saved. Under ``strategy`` or ``distribution`` the variables
    are created with its layout and receive the saved whole arrays, so a checkpoint restores
    on any number of devices. ``where`` names the checkpoint in errors. ``landed(name)``
    returns once file ``name`` is in ``folder`` (`Arrival.wait_for`): shards are read as
    they come; None: every file is there. ``weights(model)``: loads the weights and optimizer
    state instead of Keras' files (#36: a model split across processes, `multihost.py`).
    """
    landed = _checking_shards(landed or _here, folder, where)
    state = read_state(folder, where)
    layout = state.get("trainable")
    weights_file = _weights_file(folder, layout, where) if weights is None else folder
    with scope(strategy, distribution), _no_tensorflow_import():
        if build_model is None and weights is not None:
            raise CheckpointNotFoundError(
                f"{where} holds a model split across processes; pass build_model=<a function returning the "
                "compiled model> to resumable.resume()"
            )
        if build_model is None:
            if layout is not None:
                raise CheckpointNotFoundError(
                    f"{where} holds only what trains (save_trainable_only=True); pass build_model=<a "
                    "function building and compiling the same model, e.g. from_preset + enable_lora> "
                    "to resumable.resume()"
                )
            weights_only = weights_file.name == SHARDS_FILE and not (folder / CONFIG_FILE).is_file()
            if weights_file.name == WEIGHTS_FILE or weights_only:
                raise CheckpointNotFoundError(
                    f"{where} holds weights only (save_weights_only=True); pass build_model=<a function "
                    "returning the compiled model> to resumable.resume()"
                )
            with checkpoint_reading.refusals(where, f"{weights_file.name} (loaded without build_model)"):
                model = _load_saved_model(folder, weights_file, landed, where)
        else:
            model = build(build_model)
            _ensure_built(model, state.get("model", {}), where)
            _check_layout(model, state.get("model", {}).get("weights"), where)
            _check_optimizer_class(model, state.get("optimizer"), where)
            if weights is not None:
                weights(model)
            else:
                _load_weights(model, weights_file, layout, where, "the model from build_model()", landed)
    _check_optimizer(model, state.get("optimizer"), where)
    landed(ARRAYS_FILE)
    with scope(strategy, distribution):
        arrays = read_arrays(folder, where)
        lora.restore(model, arrays, where)
        restore_seed_generators(model, arrays, where)
    return model


Landed = Callable[[str], object]  # returns once the checkpoint's file of that name is in place


def is_shard(name: str) -> bool:
    """Whether ``name`` is a shard of a checkpoint's weights (``model_00000.weights.h5``, ...):
    the files `load_model` reads as they land, in name order."""
    return SHARD_NAME.fullmatch(name) is not None


def _here(name: str) -> None:
    """Every file of a fetched folder is in place."""


def _checking_shards(landed: Landed, folder: Path, where: str) -> Landed:
    """``landed``, and each shard that lands checked (`checkpoint_reading.check_h5`) before Keras
    opens it: `check_checkpoint` ran before the shards came."""
    def landed_and_checked(name: str) -> None:
        landed(name)
        path = folder / name
        if is_shard(name) and path.is_file():
            checkpoint_reading.check_h5(path, path.stat().st_size, where, name)

    return landed_and_checked


def _load_saved_model(folder: Path, weights_file: Path, landed: Landed, where: str) -> keras.Model:
    """The model as saved: a ``.keras`` file (its weights read in place, `zip_member`), or an
    unzipped one with sharded weights."""
    if weights_file.name != SHARDS_FILE:
        with open(weights_file, "rb") as file, zipfile.ZipFile(file) as archive:
            window = zip_member.stored_member(archive, file, WEIGHTS_FILE)
            model = compat.load_keras_archive(archive, window) if window is not None else None
        return model if model is not None else keras.saving.load_model(str(weights_file))
    assets = folder / ASSETS_FOLDER
    with _shards_read(weights_file, where):
        model = compat.load_unzipped_model((folder / CONFIG_FILE).read_text(), str(weights_file),
                                           str(assets) if assets.is_dir() else None, landed)
        if model is not None:
            return model
        with _merged_shards(weights_file, landed) as merged:  # a Keras that cannot read them itself
            return _load_rezipped(folder, merged)


@contextlib.contextmanager
def _merged_shards(weights_file: Path, landed: Landed) -> Iterator[Path]:
    """The checkpoint's sharded weights as one ``.weights.h5``, in a temporary folder (never in the
    checkpoint's own: a local run is read in place)."""
    with tempfile.TemporaryDirectory(prefix="resumable-load-") as temporary:
        merged = Path(temporary) / WEIGHTS_FILE
        shards.merge(weights_file, merged, landed, STATE_LIMIT)
        yield merged


def _load_rezipped(folder: Path, weights: Path) -> keras.Model:
    """``keras.saving.load_model`` of the ``.keras`` an unzipped one (``folder``) and its merged
    ``weights`` make, zipped next to the weights."""
    archive_path = weights.with_name(MODEL_FILE)
    with zipfile.ZipFile(archive_path, "w") as archive:
        archive.write(folder / METADATA_FILE, METADATA_FILE)
        archive.write(folder / CONFIG_FILE, CONFIG_FILE)
        archive.write(weights, WEIGHTS_FILE)
        assets = folder / ASSETS_FOLDER
        for path in sorted(assets.rglob("*")) if assets.is_dir() else []:
            if path.is_file():
                archive.write(path, f"{ASSETS_FOLDER}/{path.relative_to(assets).as_posix()}")
    weights.unlink()  # in the archive now: the disk holds it once
    return keras.saving.load_model(str(archive_path))


@contextlib.contextmanager
def _shards_read(weights_file: Path, where: str) -> Iterator[None]:
    """Around a load of sharded weights: their map checked first (it names only shards beside
    it), and a shard that cannot be opened as one a damaged checkpoint, said in one line."""
    problem = _shard_map_problem(weights_file)
    if problem is None:
        try:
            yield
            return
        except FileNotFoundError:
            problem = "names a shard the checkpoint does not hold"
        except OSError:  # h5py: not an HDF5 file
            problem = "names a shard that is not an HDF5 file"
    raise CorruptCheckpointError(f"{where}: {SHARDS_FILE}: {printable(problem)}; the checkpoint is damaged, "
                                 "an older one will be used")


def _shard_map_problem(weights_file: Path) -> str | None:
    """What is wrong with Keras' shard map, read as strict JSON; None if nothing. The files it
    names must be shard names (``model_00000.weights.h5``): never a path, nor another file."""
    with weights_file.open("rb") as f:
        data = f.read(min(os.fstat(f.fileno()).st_size, STATE_LIMIT) + 1)
    try:
        shards = safe_json.loads(data, STATE_LIMIT)
    except ValueError as e:
        return str(e)
    files = shards.get("weight_map") if isinstance(shards, dict) else None
    if not isinstance(files, dict):
        return "has no weight_map object"
    for names in files.values():
        for name in names if isinstance(names, list) else [names]:
            if not isinstance(name, str) or not is_shard(name):
                return f"names {_shown(name)}, which is no shard"
    return None


def _weights_file(folder: Path, layout: dict[str, Any] | None, where: str) -> Path:
    """The file holding the checkpoint's weights: model.weights.h5, model.keras, model.weights.json
    (sharded weights) or trainable.npz."""
    names = [trainable.TRAINABLE_FILE] if layout is not None else [WEIGHTS_FILE, MODEL_FILE, SHARDS_FILE]
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise CheckpointMismatchError(f"{where}: holds none of {', '.join(names)}")


def _load_weights(model: keras.Model, weights_file: Path, layout: dict[str, Any] | None, where: str,
                  target: str, landed: Landed = _here) -> None:
    """The checkpoint's weights and optimizer state into ``model`` (built, its optimizer checked),
    a variable at a time, each costing no more than its value beside the model
    (`compat.assigned_in_place`)."""
    if layout is not None:
        with compat.assigned_in_place(model):
            trainable.load(model, weights_file.parent, layout, where)
        return
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        # Keras 3 skips optimizer variables in load_weights unless the optimizer exists.
        optimizer.build(model.trainable_variables)
    with checkpoint_reading.refusals(where, weights_file.name), compat.assigned_in_place(model):
        try:
            _load_keras_weights(model, weights_file, landed, where)
        except ValueError as e:  # Keras: the file's variables are not the model's
            raise CheckpointMismatchError(f"{where} does not fit {target}: {e}") from e


def _load_keras_weights(model: keras.Model, weights_file: Path, landed: Landed, where: str) -> None:
    """``model.load_weights`` of a checkpoint's weights; from a ``.keras`` file, at load_model's speed.

    Keras' load_weights reads a ``.keras`` file's weights through the zip member, seeking in
    it for each variable: 3x slower than ``load_model``, which reads the member into memory
    first. The member is stored uncompressed, so it is read where it is (`zip_member`);
    otherwise it is copied out to a temporary ``.weights.h5`` (one sequential read) first.
    Sharded weights are read a shard at a time, each once it has ``landed``.
    """
    if weights_file.name == SHARDS_FILE:
        with _shards_read(weights_file, where):
            if not compat.load_sharded_weights(model, str(weights_file), landed):
                with _merged_shards(weights_file, landed) as merged:  # a Keras that cannot read them
                    model.load_weights(str(merged))
        return
    if weights_file.name != MODEL_FILE:
        model.load_weights(str(weights_file))
        return
    with open(weights_file, "rb") as file, zipfile.ZipFile(file) as archive:
        if WEIGHTS_FILE not in archive.namelist():  # another weights format: Keras reads it itself
            model.load_weights(str(weights_file))
            return
        window = zip_member.stored_member(archive, file, WEIGHTS_FILE)
        if window is not None and compat.load_weights_from(model, window):
            return
        with tempfile.TemporaryDirectory(prefix="resumable-load-") as folder:
            extracted = Path(folder) / WEIGHTS_FILE
            with archive.open(WEIGHTS_FILE) as source, extracted.open("wb") as target:
                shutil.copyfileobj(source, target, 16 * 2**20)
            model.load_weights(str(extracted))


def build(build_model: Callable[[], keras.Model]) -> keras.Model:
    model = build_model()
    if not isinstance(model, keras.Model):
        raise ValueError(
            "Invalid value for argument `build_model`. Received: a function returning "
            f"{type(model).__name__}. Expected a function that returns a compiled keras.Model."
        )
    return model


@contextlib.contextmanager
def scope(strategy: Any, distribution: Any = None) -> Iterator[None]:
    """``strategy.scope()`` (``tf.distribute``) and ``distribution.scope()`` (``keras.distribution``).

    Variables created inside get the layout of the strategy or distribution; values loaded
    into them are whole arrays, laid out (replicated or sharded) as the variable says.
    """
    with contextlib.ExitStack() as stack:
        if distribution is not None:
            stack.enter_context(distribution.scope())
        if strategy is not None:
            stack.enter_context(strategy.scope())
        yield


@contextlib.contextmanager
def _no_distribution() -> Iterator[None]:
    """Save outside any ``keras.distribution``: only the chief saves, and Keras' saving creates
    throwaway variables, which under a multi-process distribution would wait for every process."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        yield
        return
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(distribution)


def _check_whole_arrays(model: keras.Model) -> None:
    """The chief saves whole arrays; it cannot read a variable sharded over other processes' devices."""
    if process_count() == 1:
        return
    for variable in model.variables:
        value = getattr(variable, "value", None)
        if not (getattr(value, "is_fully_addressable", True) or getattr(value, "is_fully_replicated", True)):
            raise ResumableError(
                f"variable {variable.path!r} is sharded over devices of several processes (ModelParallel "
                "in a multi-process program); resumable saves whole arrays from process 0 alone and "
                "cannot read it there. Use DataParallel (replicated variables) with several processes"
            )


@contextlib.contextmanager
def _no_tensorflow_import() -> Iterator[None]:
    """Keep Keras from importing TensorFlow while it saves or loads on another backend.

    Keras' serializer asks ``tf.available``, which imports TensorFlow whenever it is installed:
    seconds of import and, on a TPU VM, TensorFlow reaching for the TPU that JAX holds. Before
    TensorFlow is imported nothing being saved can be a TensorFlow object, so for the save
    Keras is told TensorFlow is unavailable; afterwards its lazy check is back as it was.
    """
    if keras.backend.backend() != "tensorflow" and "tensorflow" not in sys.modules:
        with compat.tensorflow_unavailable():
            yield
    else:
        yield


def check_distribution(strategy: Any, distribution: Any) -> None:
    """One way to distribute: a ``tf.distribute`` strategy or a ``keras.distribution``."""
    # Duck-typed: Keras does not export its Distribution base class.
    if distribution is not None and not (hasattr(distribution, "get_variable_layout")
                                         and hasattr(distribution, "scope")):
        raise ValueError(
            f"Invalid value for argument `distribution`. Received: distribution={distribution!r}. "
            "Expected a keras.distribution.Distribution (DataParallel, ModelParallel) or None; "
            "a tf.distribute strategy goes to `strategy`."
        )
    if strategy is not None and distribution is not None:
        raise ValueError(
            f"Invalid value for argument `strategy`. Received: strategy={strategy!r} together with "
            f"distribution={distribution!r}. Expected one of them: `strategy` for tf.distribute on "
            "TensorFlow, `distribution` for keras.distribution on JAX."
        )
    if strategy is not None and keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"Invalid value for argument `strategy`. Received: strategy={strategy!r} on the "
            f"{keras.backend.backend()} backend. Expected None: tf.distribute strategies need "
            "KERAS_BACKEND=tensorflow; on JAX pass distribution=keras.distribution.DataParallel(...)."
        )


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
            elif not _is_number(value, or_none=True):
                _skip_state(key, name, f"{_shown(value)} is not a number")
            else:
                setattr(callback, name, _from_json_number(value))
        restored.append(key)
    return restored


def _best_weights(key: str, count: Any, arrays: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """The ``count`` arrays saved as ``key``'s best weights; None (with a warning) unless all are there."""
    if type(count) is int and 0 <= count <= len(arrays):  # never a range of a hostile 10**18
        names = [f"{key}/best_weights/{i}" for i in range(count)]
        if all(name in arrays for name in names):
            return [arrays[name] for name in names]
    _skip_state(key, "best_weights", f"{_shown(count)} arrays named, not all in {ARRAYS_FILE}")
    return None


def _skip_state(key: str, name: str | None, why: str) -> None:
    field = printable(f"{key}.{name}" if name is not None else key)
    logger.warning("resumable: not restoring %s from %s: %s", field, STATE_FILE, printable(why))


# ----------------------------------------------------------------------------- metrics


def metric_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """The running totals of the model's metrics (loss included) within the current epoch.

    Saved with mid-epoch checkpoints so the resumed epoch reports the same metrics as an
    uninterrupted one: Keras resets them when an epoch begins.
    """
    return {f"metrics/{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.metrics_variables)}


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


# ----------------------------------------------------------------------------- RNG


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


# ----------------------------------------------------------------------------- environment


def versions() -> dict[str, str]:
    from resumable._version import __version__

    backend = keras.backend.backend()
    found = {"resumable": __version__, "keras": keras.__version__}
    module = sys.modules.get(backend)
    if module is not None:
        found[backend] = str(getattr(module, "__version__", "?"))
    return found


def process_index() -> int:
    """This process's index among the processes of a multi-process JAX program; 0 otherwise.

    Never initializes JAX's backends (``jax.distributed.initialize`` must come first).
    """
    jax = _distributed_jax()
    return int(jax.process_index()) if jax is not None else 0


def process_count() -> int:
    """Processes of the JAX program (``jax.distributed``); 1 otherwise."""
    jax = _distributed_jax()
    return int(jax.process_count()) if jax is not None else 1


def _distributed_jax() -> Any:
    if keras.backend.backend() != "jax" or "jax" not in sys.modules:
        return None
    jax = sys.modules["jax"]
    try:
        return jax if jax.distributed.is_initialized() else None
    except AttributeError:  # a jax without is_initialized: ask the backend, which is up by now
        return jax


def broadcast_from_chief(values: Sequence[int]) -> list[int]:
    """Process 0's ``values`` on every process; a collective: every process must call it."""
    if process_count() == 1:
        return [int(v) for v in values]
    from jax.experimental import multihost_utils

    received = multihost_utils.broadcast_one_to_all(np.asarray(values, dtype=np.int32))
    return [int(v) for v in np.asarray(received)]


def topology(model: keras.Model | None, strategy: Any = None) -> tuple[int, int]:
    """``(processes, devices)`` training runs on, for the manifest.

    Devices are those the variables are laid out over: the ``keras.distribution`` mesh or the
    strategy's replicas; 1 for a model on one device.
    """
    if keras.backend.backend() == "jax":
        distribution = keras.distribution.distribution()
        mesh = getattr(distribution, "device_mesh", None)
        devices = int(np.size(mesh.devices)) if mesh is not None else 1
        return process_count(), devices
    strategy = strategy or getattr(model, "distribute_strategy", None)
    devices = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    processes = 1
    with contextlib.suppress(Exception):  # only multi-worker strategies have a cluster
        spec = strategy.cluster_resolver.cluster_spec()
        processes = max(1, sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs))
    return processes, devices


def is_chief(model: keras.Model | None, strategy: Any = None) -> bool:
    """False on the workers of a multi-worker run, which must not write to the run folder."""
    strategy = strategy or getattr(model, "distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    if extended is not None and hasattr(extended, "should_checkpoint"):
        return bool(extended.should_checkpoint)
    return process_index() == 0


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


# -------------------------------------------------------------------- single files, checkpoint into a model


def save_file(model: keras.Model, path: Path, *, weights_only: bool = False, **kwargs: Any) -> None:
    """One model file as Keras writes it, by suffix: ``.keras`` (model.save), ``.weights.h5``
    (save_weights: weights and the optimizer's state once built), ``.h5`` (Keras' legacy HDF5
    file: the model, or with ``weights_only`` Keras 2's weights file; `legacy_h5`). ``kwargs``
    go to Keras' save."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".weights.h5"):
        model.save_weights(str(path), overwrite=True, **kwargs)
    elif legacy_h5.is_legacy_name(path.name):
        legacy_h5.save(model, path, weights_only=weights_only, **kwargs)
    else:
        model.save(str(path), overwrite=True, **kwargs)


def load_into(model: keras.Model, folder: Path, where: str,
              weights: Callable[[keras.Model], None] | None = None) -> None:
    """Load a fetched checkpoint folder's weights and optimizer state into ``model``, in place.

    For callbacks that restore the model ``fit`` was called on (resumable.BackupAndRestore, a
    Run rolled back after an exception). The layout and optimizer are checked as in `load_model`;
    ``weights(model)`` loads them instead of Keras' files, as there.
    """
    state = read_state(folder, where)
    layout = state.get("trainable")
    weights_file = _weights_file(folder, layout, where) if weights is None else folder
    _check_layout(model, state.get("model", {}).get("weights"), where)
    _check_optimizer_class(model, state.get("optimizer"), where)
    if weights is not None:
        weights(model)
    else:
        _load_weights(model, weights_file, layout, where, "the model")
    _check_optimizer(model, state.get("optimizer"), where)
    arrays = read_arrays(folder, where)
    lora.restore(model, arrays, where)
    restore_seed_generators(model, arrays, where)


def load_file(path: Path, **kwargs: Any) -> keras.Model:
    """``keras.saving.load_model`` of one local model file (resumable.load_model); a legacy HDF5
    file with its optimizer state (`legacy_h5`)."""
    with _no_tensorflow_import():
        if legacy_h5.is_legacy_name(path.name):
            return legacy_h5.load_model(path, **kwargs)
        return keras.saving.load_model(str(path), **kwargs)


def load_weights_file(model: keras.Model, path: Path, **kwargs: Any) -> None:
    """``model.load_weights`` of one local file, the optimizer built first (resumable.load_weights)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built:
        optimizer.build(model.trainable_variables)  # Keras 3 skips optimizer variables otherwise
    if legacy_h5.is_legacy_name(path.name):
        legacy_h5.load_weights(model, path, **kwargs)
    else:
        model.load_weights(str(path), **kwargs)
