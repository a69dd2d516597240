"""A fetched checkpoint folder back into a model: checked first, then loaded.

`check_checkpoint` checks what can be checked before anything is loaded; `load_model`
rebuilds the model (or fills the one ``build_model`` returns), `load_into` fills the model
``fit`` was called on. Each names the first mismatch between the checkpoint and the model
(weight shapes, optimizer class, optimizer steps) in one line, where Keras would be vaguer
or silently go on with a fresh optimizer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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
)
from resumable.keras import compat
from resumable.keras.checkpoint import checkpoint_reading, lora, shards, state_file, trainable, zip_member
from resumable.keras.checkpoint.model_to_files import no_tensorflow_import
from resumable.keras.checkpoint.snapshot import (
    ARRAYS_FILE,
    ASSETS_FOLDER,
    CONFIG_FILE,
    METADATA_FILE,
    MODEL_FILE,
    SHARD_NAME,
    SHARDS_FILE,
    WEIGHTS_FILE,
)
from resumable.keras.checkpoint.state_file import STATE_LIMIT, shown
from resumable.keras.checkpoint.training_state import iterations, restore_seed_generators
from resumable.keras.topology import scope


def check_checkpoint(folder: Path, where: str) -> dict[str, Any]:
    """Everything of a fetched checkpoint folder that can be checked before loading it, its
    ``state.json`` returned: that file (`read_state`), then the headers and directories of
    its arrays and weights (`checkpoint_reading.check_files`; shards are checked as they land).

    The ``check`` of `RunManager.arriving_newest`: CorruptCheckpointError makes the checkpoint
    damaged, and the one before it is used.
    """
    state = state_file.read_state(folder, where)
    layout = state.get("trainable")
    layouts = {trainable.TRAINABLE_FILE: trainable.npz_layout(layout)} if layout is not None else {}
    checkpoint_reading.check_files(folder, where, (ARRAYS_FILE, trainable.TRAINABLE_FILE, MODEL_FILE,
                                                   WEIGHTS_FILE), layouts)
    return state


class ReadOnce:
    """``state.json`` and ``arrays.npz`` of fetched checkpoint folders, each read once however many
    steps of a restore need it: the check before loading (`check`, the manager's ``check``), the
    load (`load_model`, `load_into`) and the training state's (`restore.restore_checkpoint`)."""

    def __init__(self) -> None:
        self._states: dict[Path, dict[str, Any]] = {}
        self._arrays: dict[Path, dict[str, np.ndarray]] = {}

    def check(self, folder: Path, where: str) -> dict[str, Any]:
        """`check_checkpoint`, its ``state.json`` kept for the load. Always read anew: the manager
        checks a checkpoint it refused again later, and its files may have been replaced."""
        self._states[folder] = check_checkpoint(folder, where)
        return self._states[folder]

    def state(self, folder: Path, where: str) -> dict[str, Any]:
        """``state.json`` of ``folder`` (`state_file.read_state`), read at its first use."""
        if folder not in self._states:
            self._states[folder] = state_file.read_state(folder, where)
        return self._states[folder]

    def arrays(self, folder: Path, where: str) -> dict[str, np.ndarray]:
        """``arrays.npz`` of ``folder`` (`state_file.read_arrays`), read at its first use."""
        if folder not in self._arrays:
            self._arrays[folder] = state_file.read_arrays(folder, where)
        return self._arrays[folder]

    def forget(self, folder: Path) -> None:
        """Drop what was read of ``folder`` (a checkpoint found damaged while loading)."""
        self._states.pop(folder, None)
        self._arrays.pop(folder, None)

    def clear(self) -> None:
        """Drop everything read: the restore is done (the manager may keep `check` for later)."""
        self._states.clear()
        self._arrays.clear()


def load_model(folder: Path, build_model: Callable[[], keras.Model] | None, *, strategy: Any = None,
               distribution: Any = None, where: str, landed: Landed | None = None,
               weights: Callable[[keras.Model], None] | None = None, reads: ReadOnce | None = None
               ) -> keras.Model:
    """Rebuild the model of a fetched checkpoint folder, optimizer state included.

    With ``build_model``, its model receives the checkpoint's weights (the user's code keeps
    defining the architecture, custom objects and compile arguments); without it, the
    ``.keras`` file is loaded as saved. Under ``strategy`` or ``distribution`` the variables
    are created with its layout and receive the saved whole arrays, so a checkpoint restores
    on any number of devices. ``where`` names the checkpoint in errors. ``landed(name)``
    returns once file ``name`` is in ``folder`` (`Arrival.wait_for`): shards are read as
    they come; None: every file is there. ``weights(model)``: loads the weights and optimizer
    state instead of Keras' files (#36: a model split across processes, `multihost.py`).
    ``reads``: where ``state.json`` and ``arrays.npz`` are read once for the whole restore.
    """
    reads = reads or ReadOnce()
    landed = _checking_shards(landed or _here, folder, where)
    state = reads.state(folder, where)
    layout = state.get("trainable")
    weights_file = _weights_file(folder, layout, where) if weights is None else folder
    with scope(strategy, distribution), no_tensorflow_import():
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
        arrays = reads.arrays(folder, where)
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
                return f"names {shown(name)}, which is no shard"
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
        if weights_file.name != WEIGHTS_FILE or not compat.load_weights_from(model, str(weights_file)):
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
    compiled = getattr(model, "compiled", None)
    if not (compiled if compiled is not None else getattr(model, "optimizer", None) is not None):
        # said here, not by Keras' "You must call compile()" at the first fit
        raise ValueError("build_model() returned a model that is not compiled: call model.compile(...) "
                         "inside build_model")
    return model


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


def load_into(model: keras.Model, folder: Path, where: str,
              weights: Callable[[keras.Model], None] | None = None, reads: ReadOnce | None = None) -> None:
    """Load a fetched checkpoint folder's weights and optimizer state into ``model``, in place.

    For callbacks that restore the model ``fit`` was called on (resumable.BackupAndRestore, a
    Run rolled back after an exception). The layout and optimizer are checked as in `load_model`;
    ``weights(model)`` loads them instead of Keras' files, and ``reads`` reads each file once, as there.
    """
    reads = reads or ReadOnce()
    state = reads.state(folder, where)
    layout = state.get("trainable")
    weights_file = _weights_file(folder, layout, where) if weights is None else folder
    _check_layout(model, state.get("model", {}).get("weights"), where)
    _check_optimizer_class(model, state.get("optimizer"), where)
    if weights is not None:
        weights(model)
    else:
        _load_weights(model, weights_file, layout, where, "the model")
    _check_optimizer(model, state.get("optimizer"), where)
    arrays = reads.arrays(folder, where)
    lora.restore(model, arrays, where)
    restore_seed_generators(model, arrays, where)
