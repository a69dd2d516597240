"""The Keras internals resumable relies on, reached from here only.

Keras exports no API for these. Each is probed once per process; when a Keras version lacks it
or it does not behave as resumable needs, resumable falls back to Keras' public API or to what
plain Keras does, and says so once in one line naming the Keras version: an unknown Keras
costs exactness or speed, never a save or a resume. What is reached, by section:

- TensorFlow import: ``keras.src.utils.module_utils.tensorflow._available``.
- Global seed generator: ``keras.src.backend.common.global_state.get_global_attribute``,
  ``keras.src.random.seed_generator.global_seed_generator`` (and ``GLOBAL_SEED_GENERATOR``).
- Array data adapter (mid-epoch positioning): ``keras.src.trainers.data_adapters``'
  ``array_data_adapter.ArrayDataAdapter`` (its ``get_tf_dataset``, ``get_numpy_iterator``,
  ``get_torch_dataloader``), ``can_convert_arrays``, ``array_slicing.train_validation_split``.
- fit's callbacks: the ``keras.callbacks.CallbackList`` in ``fit``'s frame; ``Model._initial_epoch``.
- Drop-in ModelCheckpoint: ``keras.callbacks.ModelCheckpoint._save_model``,
  ``_get_file_path``, ``_should_save_model`` (Keras 3.10+; before, its decision is made here as
  those versions make it), ``monitor_op``, ``best`` (their parameters are checked).
- Trainable-only and LoRA: ``Layer._layers``, ``_flatten_layers``, ``_trainable_variables``,
  ``_non_trainable_variables``.
- Saving in the background and fast loads (``keras.src.saving``): ``saving_lib._save_state``,
  ``_load_state``, ``_raise_loading_failure``, ``_serialize_model_as_json``,
  ``_model_from_config``, ``H5IOStore`` (``make``, ``__setitem__``, an entry object from
  ``make`` in Keras 3.8 and 3.9), ``ShardedH5IOStore`` (``_get_h5_file``), ``DiskIOStore``,
  ``keras_saveable.KerasSaveable`` (the probes' saveable). Probed by round trips of a tiny
  saveable (`snapshots_work`, `sharding_works`, `_loading_works`), not by names alone.
- Loading a variable at a time in place (`assigned_in_place`): each of the model's variables'
  ``assign`` overridden on the variable itself while a load runs, a variable's ``_value``,
  ``_dtype`` and ``_layout``, ``keras.src.backend.common.stateless_scope.in_stateless_scope``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, NamedTuple

import keras
import numpy as np

from resumable.storage import heap

logger = logging.getLogger("resumable")


def unsupported(what: str) -> str:
    """One line naming the Keras version and the internal resumable cannot find in it."""
    return f"resumable does not know {what} in Keras {keras.__version__}"


# ----------------------------------------------------------------------------- TensorFlow import


@functools.cache
def _lazy_tensorflow() -> Any:
    """``keras.src.utils.module_utils.tensorflow`` if it keeps its availability in ``_available``."""
    try:
        from keras.src.utils import module_utils

        lazy = module_utils.tensorflow
        # vars(), not hasattr: a LazyModule forwards unknown attributes to TensorFlow, importing it.
        if "_available" in vars(lazy):
            return lazy
    except Exception:  # noqa: BLE001 - any change in Keras means: not probed, Keras as is
        pass
    logger.debug("%s", unsupported("keras.src.utils.module_utils.tensorflow._available"))
    return None


@contextlib.contextmanager
def tensorflow_unavailable() -> Iterator[None]:
    """Inside, Keras' serializer believes TensorFlow is not installed (it would import it to ask).

    Uses ``keras.src.utils.module_utils.tensorflow._available``, the cached answer of Keras'
    lazy TensorFlow module, set to False and restored after. Without it this does nothing:
    Keras imports TensorFlow as it always does, which is slower but correct.
    """
    lazy = _lazy_tensorflow()
    if lazy is None:
        yield
        return
    saved = lazy._available
    lazy._available = False
    try:
        yield
    finally:
        lazy._available = saved


# ----------------------------------------------------------------------------- global seed generator


class _SeedGeneratorAPI(NamedTuple):
    get_global_attribute: Any
    global_seed_generator: Any
    key: str


@functools.cache
def _seed_generator_api() -> _SeedGeneratorAPI | None:
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator

        return _SeedGeneratorAPI(global_state.get_global_attribute, seed_generator.global_seed_generator,
                                 getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator"))
    except Exception:  # noqa: BLE001 - moved or renamed in this Keras version
        logger.warning("%s; unseeded keras.random ops will not continue the same after a resume",
                       unsupported("the global SeedGenerator (keras.src.backend.common.global_state)"))
        return None


def global_seed_generator(create: bool = False) -> keras.random.SeedGenerator | None:
    """Keras' global SeedGenerator, which unseeded ``keras.random`` ops draw from; None if none yet.

    Uses ``keras.src.backend.common.global_state.get_global_attribute`` and
    ``keras.src.random.seed_generator.global_seed_generator`` (the latter with ``create``, to
    have one to restore a state into). Without them, or when Keras refuses (inside a JAX
    trace), returns None: its state is then neither saved nor restored.
    """
    api = _seed_generator_api()
    if api is None:
        return None
    try:
        generator: keras.random.SeedGenerator | None = api.get_global_attribute(api.key)
        if generator is None and create:
            generator = api.global_seed_generator()
    except Exception:  # noqa: BLE001 - same answer as a Keras without it
        return None
    return generator


# ----------------------------------------------------------------------------- array data adapter


class ArrayAdapters(NamedTuple):
    """Keras' private modules that turn ``fit``'s array arguments into batches."""

    array_data_adapter: ModuleType
    array_slicing: ModuleType


@functools.cache
def array_adapters() -> ArrayAdapters | None:
    """Keras' array data adapter, to replay ``fit``'s batch order of NumPy arrays; None if unknown.

    Uses ``keras.src.trainers.data_adapters.array_data_adapter`` (``ArrayDataAdapter``, with the
    ``num_batches``, ``get_tf_dataset`` and ``get_numpy_iterator`` every Keras DataAdapter has,
    and ``can_convert_arrays``) and ``array_slicing.train_validation_split``.
    Without any of them, returns None: a mid-epoch checkpoint of arrays then restarts its
    epoch from the first batch.
    """
    try:
        from keras.src.trainers.data_adapters import array_data_adapter, array_slicing

        # Reading what positioning uses raises AttributeError now rather than mid-resume.
        _ = (array_data_adapter.ArrayDataAdapter, array_data_adapter.can_convert_arrays,
             array_slicing.train_validation_split)
        return ArrayAdapters(array_data_adapter, array_slicing)
    except Exception:  # noqa: BLE001 - moved or renamed in this Keras version
        pass
    logger.debug("%s", unsupported("keras.src.trainers.data_adapters"))
    return None


# ----------------------------------------------------------------------------- fit's callbacks


def running_fit_callbacks(callback: keras.callbacks.Callback) -> list[keras.callbacks.Callback]:
    """The callbacks of the ``model.fit`` running ``callback``, in order; ``[callback]`` if not found.

    Keras does not tell a callback about its siblings: ``fit`` keeps them in a local
    ``keras.callbacks.CallbackList``, found here by walking the caller's stack frames. A Keras
    whose ``fit`` stops doing so (or a loop calling callbacks itself) gives ``[callback]``: the
    states of the other callbacks (EarlyStopping's patience) are then not carried over.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            for value in frame.f_locals.values():
                if isinstance(value, keras.callbacks.CallbackList) and callback in value.callbacks:
                    return list(value.callbacks)
            frame = frame.f_back
    finally:
        del frame  # a frame reference would keep every local of the stack alive
    return [callback]


# keras.callbacks.TensorBoard's step counters: the step of each batch-level summary (and of the
# validation's). on_train_begin sets the first to 0, so a resumed run would write its batches'
# summaries over the first session's; saved and restored like EarlyStopping's fields.
TENSORBOARD_COUNTERS = ("_global_train_batch", "_global_test_batch")


def flush_tensorboard(callbacks: list[keras.callbacks.Callback]) -> None:
    """Write out what each ``keras.callbacks.TensorBoard`` holds in its writers' queues (its
    ``_writers``): an interrupted fit never calls its ``on_train_end``, and the summaries of the
    batches before the interrupt would be lost. Nothing without ``_writers``."""
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.TensorBoard):
            for writer in list(getattr(callback, "_writers", {}).values()):
                with contextlib.suppress(Exception):  # a writer already closed
                    writer.flush()


def build_for_fit(model: keras.Model, batch: Any) -> bool:
    """Build what ``model.fit`` would build from its first batch (the model, its compiled metrics
    and loss, the optimizer), from ``batch`` (arrays, or tensor specs: only shapes and dtypes
    are read). False when this Keras has no ``Trainer._symbolic_build(data_batch=...)``.

    On JAX and torch, ``fit`` reads a batch of the epoch to build them when they are not
    built; with a PyDataset's workers that read leaves Keras' queue a batch behind for the whole
    fit (each epoch gets the previous epoch's last batch first), and from a stream it takes a
    batch the run never trains on. Building first, as ``fit`` would, avoids that read.
    """
    build = getattr(model, "_symbolic_build", None)
    try:
        if build is None or "data_batch" not in inspect.signature(build).parameters:
            raise AttributeError("_symbolic_build")
    except (AttributeError, TypeError, ValueError):
        logger.debug("%s", unsupported("Trainer._symbolic_build(data_batch=...)"))
        return False
    build(data_batch=batch)
    return True


def running_fit_input(callback: keras.callbacks.Callback) -> Any:
    """The ``x`` of the ``model.fit`` running ``callback`` (found as `running_fit_callbacks` finds
    its callbacks: the ``fit`` frame holding them); None if not found."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            values = frame.f_locals
            if "x" in values and any(isinstance(v, keras.callbacks.CallbackList) and callback in v.callbacks
                                     for v in values.values()):
                return values["x"]
            frame = frame.f_back
    finally:
        del frame
    return None


# ----------------------------------------------------------------------------- drop-in callbacks

# What resumable.ModelCheckpoint overrides or calls of keras.callbacks.ModelCheckpoint, with the
# parameters each must take. `_should_save_model` is Keras 3.10's: before, `_save_model` decided inline.
_MODEL_CHECKPOINT_METHODS = {
    "_save_model": ("epoch", "batch", "logs"),
    "_should_save_model": ("epoch", "batch", "logs", "filepath"),
    "_get_file_path": ("epoch", "batch", "logs"),
}
_OPTIONAL_METHODS = ("_should_save_model",)


@functools.cache
def model_checkpoint_internals() -> str | None:
    """None when ``keras.callbacks.ModelCheckpoint`` has the private methods resumable.ModelCheckpoint
    overrides (``_save_model``) and calls (``_get_file_path``; ``_should_save_model`` where it
    exists, see `should_save_model`), with their parameters; else one line naming the Keras
    version and what is missing."""
    base = keras.callbacks.ModelCheckpoint
    for name, params in _MODEL_CHECKPOINT_METHODS.items():
        method = getattr(base, name, None)
        if method is None and name in _OPTIONAL_METHODS:
            continue
        try:
            found = tuple(inspect.signature(method).parameters)[1:] if method is not None else None
        except (TypeError, ValueError):
            found = None
        if found != params:
            return unsupported(f"keras.callbacks.ModelCheckpoint.{name}{params}") + (
                "; use keras.callbacks.ModelCheckpoint, or a Keras version resumable supports")
    return None


def should_save_model(callback: keras.callbacks.ModelCheckpoint, epoch: int, batch: int | None,
                      logs: dict[str, Any] | None, filepath: str) -> bool:
    """Whether Keras' ModelCheckpoint would save now (printing and warning as it does; the new
    best kept in ``callback.best``): its ``_should_save_model`` (Keras 3.10+); on Keras 3.8 and
    3.9, which decide inside ``_save_model``, the decision those versions make there."""
    if getattr(keras.callbacks.ModelCheckpoint, "_should_save_model", None) is not None:
        return bool(callback._should_save_model(epoch, batch, logs, filepath))
    return _decided_as_keras_3_8(callback, epoch, logs or {}, filepath)


def _decided_as_keras_3_8(callback: keras.callbacks.ModelCheckpoint, epoch: int, logs: dict[str, Any],
                          filepath: str) -> bool:
    """Keras 3.8's and 3.9's save decision: without a monitored value, skip (3.10 saves); a
    value that is no scalar, save as if not save_best_only; else save on an improvement."""
    import warnings

    say = keras.utils.io_utils.print_msg if callback.verbose > 0 else (lambda message: None)
    if not callback.save_best_only:
        say(f"\nEpoch {epoch + 1}: saving model to {filepath}")
        return True
    current = logs.get(callback.monitor)
    if current is None:
        warnings.warn(f"Can save best model only with {callback.monitor} available, skipping.", stacklevel=4)
        return False
    if (isinstance(current, np.ndarray) or keras.ops.is_tensor(current)) and len(current.shape) > 0:
        warnings.warn("Can save best model only when `monitor` is a scalar value. Received: "
                      f"{current}. Falling back to `save_best_only=False`.", stacklevel=4)
        return True
    if callback.monitor_op(current, callback.best):
        say(f"\nEpoch {epoch + 1}: {callback.monitor} improved from {callback.best:.5f} to {current:.5f}, "
            f"saving model to {filepath}")
        callback.best = current
        return True
    say(f"\nEpoch {epoch + 1}: {callback.monitor} did not improve from {callback.best:.5f}")
    return False


def set_fit_initial_epoch(model: keras.Model, epoch: int | None) -> None:
    """Make the next ``model.fit`` start at ``epoch`` (None: at its ``initial_epoch`` argument).

    Uses ``Trainer._initial_epoch``, which ``fit`` reads after ``on_train_begin`` (as Keras'
    BackupAndRestore sets it). Raises ResumableError with one line when this Keras lacks it.
    """
    if "_initial_epoch" not in vars(model):
        from resumable.core.errors import ResumableError

        raise ResumableError(unsupported("keras.Model._initial_epoch (how BackupAndRestore sets fit's epoch)")
                             + "; use resumable.resume() and run.fit instead")
    model._initial_epoch = epoch


# ----------------------------------------------------------------------------- trained, not trainable


# Where Keras keeps the variables a layer created non-trainable (a name, so tests can rename it).
_OWN_NON_TRAINABLE = "_non_trainable_variables"


def trained_non_trainable_variables(model: keras.Model) -> list[Any] | None:
    """Variables that layers being trained create non-trainable: BatchNormalization's moving
    statistics, float8 scaling histories. They change during training though no optimizer
    touches them, so a checkpoint of what trains must hold them.

    A layer counts when it and every layer around it is trainable (a frozen BatchNormalization
    runs in inference mode). Variables frozen afterwards (``layer.trainable = False``, LoRA's
    frozen kernels) are not among them: Keras keeps those in ``Layer._trainable_variables``.
    Uses ``Layer._layers`` and ``Layer._non_trainable_variables``; None when this Keras lacks them.
    """
    found: list[Any] = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(model, True)]
    try:
        while stack:
            layer, outer = stack.pop()
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            trains = outer and bool(layer.trainable)
            if trains:
                found.extend(getattr(layer, _OWN_NON_TRAINABLE))
            stack.extend((sub, trains) for sub in reversed(list(layer._layers)))
    except AttributeError:
        _warn_once(unsupported("Layer._layers and Layer._non_trainable_variables") + "; trainable-only "
                   "checkpoints hold every float non-trainable weight")
        return None
    unique: dict[int, Any] = {}
    for variable in found:  # a shared variable once, at its first place
        unique.setdefault(id(variable), variable)
    return list(unique.values())


@functools.cache
def _warn_once(message: str) -> None:
    """Say it once a session: these are asked at every save."""
    logger.warning("%s", message)


def lora_layer_variables(model: keras.Model) -> list[Any] | None:
    """The own variables of the model's LoRA-enabled layers (``layer.lora_enabled``: Dense,
    EinsumDense, Embedding, convolutions), in the order each layer stores them.

    Keras saves such a layer with its LoRA factors merged into the kernel and loads it with the
    factors zeroed: a resumed fine-tune would not continue as it was. Uses
    ``Layer._flatten_layers``, ``Layer._trainable_variables`` and ``Layer._non_trainable_variables``
    (what ``Layer.save_own_variables`` stores); None when this Keras lacks them.
    """
    try:
        return [v for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False) is True
                for v in (*layer._trainable_variables, *layer._non_trainable_variables)]
    except AttributeError:
        _warn_once(unsupported("Layer._flatten_layers and Layer._trainable_variables")
                   + "; LoRA layers resume with their factors merged into the kernel")
        return None


# ----------------------------------------------------------------------------- saving in the background


class SavedValue(NamedTuple):
    """One value Keras' saving writes to ``model.weights.h5``: its group, group attributes, key, value."""

    path: str
    metadata: dict[str, Any] | None
    key: str
    value: Any  # a host copy (numpy), never the live variable


@functools.cache
def _saving_lib() -> ModuleType | None:
    try:
        from keras.src.saving import saving_lib

        # Read now what the snapshot and its writer use: AttributeError here, not mid-training.
        _ = (saving_lib._save_state, saving_lib._load_state, saving_lib.H5IOStore, saving_lib.DiskIOStore,
             saving_lib._serialize_model_as_json)
        return saving_lib
    except Exception:  # noqa: BLE001 - moved or renamed in this Keras version
        _warn_once(unsupported("keras.src.saving.saving_lib (_save_state, _load_state, H5IOStore)")
                   + "; checkpoints are saved with model.save while training waits")
        return None


def saved_values(model: keras.Model, copy: Any, assets_dir: str | None) -> list[SavedValue] | None:
    """What ``model.save`` / ``model.save_weights`` would write to the weights file, as host copies.

    Runs Keras' own traversal (``saving_lib._save_state``) with a store that keeps
    ``copy(value)`` of each value instead of writing it, so `write_weights` later writes the
    same file in another thread while training goes on. Assets (vocabularies and the like)
    go to ``assets_dir`` now, when given (``model.save``; ``save_weights`` writes none).
    None when this Keras lacks those internals, or they do not behave as `snapshots_work`
    expects, or they fail on this model: the caller saves the usual way (``model.save``).
    """
    saving_lib = _saving_lib()
    if saving_lib is None or not snapshots_work():
        return None
    recorder = _recorder(saving_lib)
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


def _recorder(saving_lib: ModuleType) -> Any:
    """A store for ``_save_state`` that records host copies instead of writing (an H5IOStore by
    type: Keras 3.14+ checks it). ``make`` returns the store itself, as Keras 3.10+ does; Keras
    3.8 and 3.9 return an entry object, which the traversal uses the same way."""

    class Recorder(saving_lib.H5IOStore):  # type: ignore[name-defined]
        def __init__(self) -> None:  # no file: nothing of H5IOStore's own state is used
            self.values: list[SavedValue] = []
            self._entry: tuple[str, dict[str, Any] | None] = ("", None)
            self.copy: Callable[[Any], Any] = np.array

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: dict[str, Any] | None = None) -> Recorder:
            self._entry = (path, metadata)
            return self

        def __setitem__(self, key: str, value: Any) -> None:
            self.values.append(SavedValue(*self._entry, key, self.copy(value)))

    return Recorder()


_snapshot_failure: list[str] = []  # set once a snapshot failed on a real model: never tried again


def _snapshots_failed(why: str) -> None:
    if not _snapshot_failure:
        _snapshot_failure.append(why)
        _warn_once(f"resumable: a snapshot of the model failed in Keras {keras.__version__} ({why}); "
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


class _HostView:
    """A snapshot's value as handed to Keras' store: ``np.array`` of it is the value itself.

    Keras' stores pass every value through ``convert_to_numpy`` (``np.array``: a copy; the
    sharded store converts twice), which would hold a copy of the biggest variable (two,
    sharded) beside the snapshot while it is written. A snapshot's values are host arrays
    nobody changes (`snapshot._host_copy`), so they are written from where they are.
    """

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return self.array if dtype is None else self.array.astype(dtype, copy=False)


def write_weights(values: list[SavedValue], target: str | io.RawIOBase | BinaryIO) -> None:
    """Write `saved_values` as the ``.weights.h5`` file Keras would have written, with its store:
    to a path, or into a seekable binary file object (h5py writes it there directly, through
    ``H5IOStore._get_h5_file``; a Keras without it writes a temporary file, copied in)."""
    saving_lib = _saving_lib()
    assert saving_lib is not None  # saved_values returned values
    if isinstance(target, str):
        _fill(saving_lib.H5IOStore(target, mode="w"), values)
        return
    into_file = _store_into_file()
    if into_file is not None:
        _fill(into_file(target), values)
        return
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="resumable-weights-") as folder:
        path = str(Path(folder) / "model.weights.h5")
        _fill(saving_lib.H5IOStore(path, mode="w"), values)
        with open(path, "rb") as written:
            shutil.copyfileobj(written, target, 2**22)


@functools.cache
def _store_into_file() -> type | None:
    """Keras' ``H5IOStore`` writing into a file object of ours (any offsets, as HDF5 does); None on
    a Keras whose store opens its file elsewhere than ``_get_h5_file`` (before 3.10)."""
    saving_lib = _saving_lib()
    if saving_lib is None or "_get_h5_file" not in vars(saving_lib.H5IOStore):
        return None

    class IntoFile(saving_lib.H5IOStore):  # type: ignore[name-defined]
        def __init__(self, file: io.RawIOBase | BinaryIO) -> None:
            self._target = file
            super().__init__(str(file), mode="w")  # a name only: the file is ours

        def _get_h5_file(self, path_or_io: Any, mode: str | None = None) -> Any:
            import h5py

            return h5py.File(self._target, mode="w")

    return IntoFile


def write_sharded_weights(values: list[SavedValue], path: str, max_shard_size: float,
                          create: Callable[[str], io.RawIOBase] | None = None) -> None:
    """Write `saved_values` as Keras' sharded weights: ``path`` (a ``.weights.json`` map) and its
    ``*_00000.weights.h5`` shards of at most ``max_shard_size`` GiB each, as
    ``model.save_weights(path, max_shard_size=...)`` writes them; ``model.load_weights(path)`` reads them.

    ``create(name)``: a new binary file object for each shard, h5py writes into (closed here).
    """
    sharded = _uncopied_sharded_store()
    assert sharded is not None  # the caller asked can_shard()
    if create is None:
        _fill(sharded(path, max_shard_size, mode="w"), values)
        return
    opened: list[io.RawIOBase] = []
    make = create

    class IntoFiles(sharded):  # type: ignore[misc, valid-type]
        def _get_h5_file(self, path_or_io: Any, mode: str | None = None) -> Any:
            if (mode or self.mode) != "w":
                return super()._get_h5_file(path_or_io, mode)
            import h5py

            opened.append(make(Path(path_or_io).name))
            return h5py.File(opened[-1], mode="w")  # named after the file object: the shard's path

    try:
        _fill(IntoFiles(path, max_shard_size, mode="w"), values)
    finally:
        for file in opened:
            file.close()


@functools.cache
def _sharded_store() -> Any:
    """Keras' ``ShardedH5IOStore`` (Keras 3.10+); None when this Keras lacks it."""
    saving_lib = _saving_lib()
    return getattr(saving_lib, "ShardedH5IOStore", None) if saving_lib is not None else None


@functools.cache
def _uncopied_sharded_store() -> type | None:
    """Keras' ``ShardedH5IOStore`` taking values as `_HostView`: its own ``__setitem__`` converts
    (to size the value), then calls H5IOStore's, which converts again; the class between
    them wraps the converted value again, so neither conversion copies."""
    sharded = _sharded_store()
    saving_lib = _saving_lib()
    if sharded is None or saving_lib is None:
        return None

    class Uncopied(saving_lib.H5IOStore):  # type: ignore[name-defined]
        def __setitem__(self, key: str, value: Any) -> None:
            super().__setitem__(key, value if isinstance(value, _HostView) else _HostView(value))

    class ShardedUncopied(sharded, Uncopied):  # type: ignore[misc, valid-type]
        pass

    return ShardedUncopied


def _fill(store: Any, values: list[SavedValue]) -> None:
    try:
        entry: Any = None
        group: tuple[str, dict[str, Any] | None] | None = None
        for value in values:
            if group != (value.path, value.metadata):
                group = (value.path, value.metadata)
                entry = store.make(value.path, metadata=value.metadata)  # Keras 3.8, 3.9: an entry
            entry[value.key] = _HostView(value.value)
    finally:
        store.close()


def can_shard() -> bool:
    """Whether checkpoints may be written as Keras' sharded weights here: this Keras has
    ``ShardedH5IOStore`` and what it writes reads back (`sharding_works`). Asked when a
    checkpoint is over ``max_shard_size``; a Keras without it (3.8, 3.9) is said once."""
    if _sharded_store() is None:
        _warn_once(unsupported("keras.src.saving.saving_lib.ShardedH5IOStore")
                   + "; big checkpoints are written as one file")
        return False
    return snapshots_work() and sharding_works()


# ----------------------------------------------------------------------------- behaviour, probed once


def _differs(what: str, detail: str) -> str:
    """One line: this Keras' ``what`` does not behave as resumable needs, and how."""
    return f"resumable: {what} in Keras {keras.__version__} does not behave as resumable needs ({detail})"


def _probe_class() -> Any:
    """A KerasSaveable holding plain arrays (float32 and bfloat16) in its own group and in a
    named child's: what ``_save_state`` and ``_load_state`` walk in a model, with no variables,
    no layer names taken and no random draws, so probing changes nothing of the user's session."""
    import ml_dtypes
    from keras.src.saving.keras_saveable import KerasSaveable

    class Probe(KerasSaveable):
        def __init__(self, name: str, held: list[np.ndarray], inner: Any = None) -> None:
            self.name = name
            self.held = held
            self.inner = inner

        def _obj_type(self) -> str:
            return "Loss"  # one Keras knows; a Loss has none of the probe's attributes but `name`

        def save_own_variables(self, store: Any) -> None:
            for i, value in enumerate(self.held):
                store[str(i)] = value

        def load_own_variables(self, store: Any) -> None:
            if len(store.keys()) != len(self.held):
                raise ValueError(f"{len(store.keys())} values read, {len(self.held)} written")
            self.held = [np.array(store[str(i)]) for i in range(len(self.held))]

        @classmethod
        def pair(cls, fill: float | None = None) -> Any:
            """Two groups: 3 values of 64 bytes in the root (shards of 100 bytes split it), 1 in ``inner``."""
            def value(i: int, dtype: Any = np.float32) -> np.ndarray:
                return np.full(16 if dtype == np.float32 else 32, i + 0.5 if fill is None else fill, dtype)
            root = [value(0), value(1), value(2, ml_dtypes.bfloat16)]
            return cls("resumable_probe", root, cls("resumable_probe_inner", [value(3)]))

        def same(self, other: Any) -> bool:
            mine, theirs = [*self.held, *self.inner.held], [*other.held, *other.inner.held]
            return len(mine) == len(theirs) and all(
                a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(mine, theirs, strict=True))

    return Probe


def _read_back(saving_lib: ModuleType, store: Any) -> Any:
    """A probe pair loaded from ``store`` by Keras' ``_load_state`` (raising as Keras does)."""
    loaded = _probe_class().pair(fill=0.0)
    _load_into(saving_lib, loaded, store, None)
    return loaded


def _probe(what: str, then: str, check: Callable[[ModuleType, Path], str | None]) -> bool:
    """Run ``check`` once in a temporary folder: True when it finds nothing wrong; otherwise
    say once, naming the Keras version, what falls back to what."""
    saving_lib = _saving_lib()
    if saving_lib is None:
        return False
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="resumable-probe-") as folder:
            problem = check(saving_lib, Path(folder))
    except Exception as e:  # noqa: BLE001 - anything unexpected is what the probe looks for
        problem = f"{type(e).__name__}: {e}"
    if problem is None:
        return True
    problem = " ".join(problem.split())  # Keras' messages span lines: one line, and short
    _warn_once(f"{_differs(what, problem if len(problem) <= 200 else problem[:197] + '...')}; {then}")
    return False


@functools.cache
def snapshots_work() -> bool:
    """Whether snapshots (`saved_values`, then `write_weights`) give files Keras reads: a probe's
    values recorded by ``_save_state``, written, then read by Keras' own ``H5IOStore`` and
    ``_load_state`` (what ``load_weights`` does) come back equal. Once per process; when not,
    checkpoints are saved with ``model.save`` while training waits (said once)."""

    def check(saving_lib: ModuleType, folder: Path) -> str | None:
        written = _probe_class().pair()
        recorder = _recorder(saving_lib)
        saving_lib._save_state(written, weights_store=recorder, assets_store=None, inner_path="",
                               visited_saveables=set())
        with open(folder / "probe.weights.h5", "w+b") as file:  # as snapshots write: into a file object
            write_weights(recorder.values, file)
        loaded = _read_back(saving_lib, saving_lib.H5IOStore(str(folder / "probe.weights.h5"), mode="r"))
        return None if written.same(loaded) else "values written by a snapshot read back different"

    return _probe("saving_lib's _save_state and H5IOStore", "checkpoints are saved with model.save while "
                  "training waits", check)


@functools.cache
def sharding_works() -> bool:
    """Whether sharded weights written with Keras' ``ShardedH5IOStore`` read back: a probe whose
    groups span three shards, written by `write_sharded_weights`, then read both by Keras'
    own ``ShardedH5IOStore`` and by `load_sharded_weights`' store, comes back equal. Keras 3.10's
    does not (a group's later shards are missing from its map): big checkpoints are then
    written as one file (said once), and sharded ones written elsewhere are still read."""
    if _sharded_store() is None:
        return False

    def check(saving_lib: ModuleType, folder: Path) -> str | None:
        written = _probe_class().pair()
        recorder = _recorder(saving_lib)
        saving_lib._save_state(written, weights_store=recorder, assets_store=None, inner_path="",
                               visited_saveables=set())
        path = str(folder / "probe.weights.json")
        write_sharded_weights(recorder.values, path, 100 / 2**30)  # 64-byte values: one per shard
        if len(list(folder.glob("probe_*.weights.h5"))) < 3:
            return "values over max_shard_size were not split into shards"
        for store in (_sharded_store()(path, mode="r"), _waiting_store(lambda name: None)(path, mode="r")):
            if not written.same(_read_back(saving_lib, store)):
                return "sharded weights read back different"
        return None

    return _probe("saving_lib.ShardedH5IOStore", "big checkpoints are written as one file", check)


@functools.cache
def _loading_works() -> bool:
    """Whether Keras' ``H5IOStore`` reads a file object and ``_load_state`` loads from it, as the
    fast loads (`load_weights_from`, `load_keras_archive`) need: a probe written by Keras' own
    store, read from a BytesIO, comes back equal. When not, ``load_weights``/``load_model`` load."""

    def check(saving_lib: ModuleType, folder: Path) -> str | None:
        import io

        written = _probe_class().pair()
        path = str(folder / "probe.weights.h5")
        store = saving_lib.H5IOStore(path, mode="w")
        try:
            saving_lib._save_state(written, weights_store=store, assets_store=None, inner_path="",
                                   visited_saveables=set())
        finally:
            store.close()
        data = io.BytesIO(Path(path).read_bytes())
        if not written.same(_read_back(saving_lib, saving_lib.H5IOStore(data, mode="r"))):
            return "weights read from a file object come back different"
        parameters = tuple(inspect.signature(saving_lib._model_from_config).parameters)
        if parameters[:4] != ("config_json", "custom_objects", "compile", "safe_mode"):
            return f"_model_from_config takes {parameters}"
        return None

    return _probe("saving_lib's H5IOStore on a file object and _load_state",
                  "checkpoints are loaded with load_weights and load_model", check)


# ----------------------------------------------------------------------------- loading, fast


def load_weights_from(model: keras.Model, file: Any) -> bool:
    """``model.load_weights`` of a ``.weights.h5`` given as a file object (a BytesIO, as Keras'
    store requires: `zip_member.MemberWindow`), as ``load_weights`` reads a path: Keras'
    ``H5IOStore`` and ``_load_state``. False, having loaded nothing, when this Keras lacks
    them or they misbehave: the caller reads a path instead. Raises ValueError as ``load_weights`` does."""
    saving_lib = _saving_lib()
    if saving_lib is None or not _loading_works():
        return False
    _load_into(saving_lib, model, saving_lib.H5IOStore(file, mode="r"), None)
    return True


def load_sharded_weights(model: keras.Model, weights: str, landed: Callable[[str], object]) -> bool:
    """``model.load_weights`` of sharded weights (``weights``: the ``.weights.json`` map), a shard
    at a time, each opened once ``landed(file name)`` returns: the next may still be coming.
    False, having loaded nothing, on a Keras whose sharded store is missing or misbehaves
    (`sharding_works`): the caller merges the shards into one file for ``load_weights``."""
    saving_lib = _saving_lib()
    if saving_lib is None or not sharding_works() or not _loading_works():
        return False
    _load_into(saving_lib, model, _waiting_store(landed)(weights, mode="r"), None)
    return True


def load_unzipped_model(config: str, weights: str, assets: str | None,
                        landed: Callable[[str], object]) -> keras.Model | None:
    """The model of an unzipped ``.keras`` whose weights are sharded: what ``keras.saving.load_model``
    does for a folder, reading the weights a shard at a time as `load_sharded_weights` does
    (Keras' own folder loader knows only one ``model.weights.h5``). ``config``: config.json's
    text; ``weights``: the ``.weights.json`` map; ``assets``: the assets folder, if any.
    None, having loaded nothing, where `load_sharded_weights` returns False. Raises ValueError as
    Keras does."""
    saving_lib = _saving_lib()
    if saving_lib is None or not sharding_works() or not _loading_works():
        return None
    model = saving_lib._model_from_config(config, None, True, True)
    assets_store = saving_lib.DiskIOStore(assets, mode="r") if assets is not None else None
    _load_into(saving_lib, model, _waiting_store(landed)(weights, mode="r"), assets_store)
    return model


def load_keras_archive(archive: Any, weights: Any) -> keras.Model | None:
    """``keras.saving.load_model`` of an open ``.keras`` zip whose weights are read from the file
    object ``weights`` (`zip_member.MemberWindow`: in place, where Keras reads the whole member
    into memory first): the model from ``config.json``, compiled, its weights, optimizer state
    and assets loaded as Keras does. None, having loaded nothing, when this Keras lacks the
    internals or they misbehave: the caller uses ``load_model``. Raises ValueError as Keras does."""
    saving_lib = _saving_lib()
    if saving_lib is None or not _loading_works():
        return None
    model = saving_lib._model_from_config(archive.read("config.json").decode(), None, True, True)
    has_assets = len(archive.namelist()) > 3  # as Keras: anything beyond metadata, config and weights
    assets = saving_lib.DiskIOStore("assets", archive=archive, mode="r") if has_assets else None
    _load_into(saving_lib, model, saving_lib.H5IOStore(weights, mode="r"), assets)
    return model


def _waiting_store(landed: Callable[[str], object]) -> type:
    """Keras' ``ShardedH5IOStore``, opening each shard (``_get_h5_file``) once it has landed. A
    shard that cannot be opened (missing, not HDF5) is kept as ``arrival_error``: Keras' loader
    may fold it into "could not be loaded" (3.13) or let it through (3.15); `_load_into`
    raises it either way."""
    sharded = _sharded_store()

    class Waiting(sharded):  # type: ignore[misc, valid-type]
        arrival_error: BaseException | None = None

        def _get_h5_file(self, path_or_io: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                landed(Path(str(path_or_io)).name)
                return super()._get_h5_file(path_or_io, *args, **kwargs)  # mode= from Keras 3.11
            except BaseException as e:
                self.arrival_error = e
                raise

    return Waiting


def _load_into(saving_lib: ModuleType, model: Any, weights_store: Any, assets_store: Any) -> None:
    """Keras' ``_load_state`` of the stores into ``model`` (closed after), failures raised as Keras
    does; each variable assigned in place (`assigned_in_place`)."""
    failed: set[int] = set()
    errors: dict[int, Any] = {}
    try:
        with assigned_in_place(model):
            saving_lib._load_state(model, weights_store=weights_store, assets_store=assets_store,
                                   inner_path="", visited_saveables=set(), failed_saveables=failed,
                                   error_msgs=errors)
    finally:
        weights_store.close()
        if assets_store is not None:
            assets_store.close()
    arrival_error = getattr(weights_store, "arrival_error", None)
    if arrival_error is not None:  # a shard that did not arrive (damaged): that, not Keras' summary
        raise arrival_error
    if failed:
        saving_lib._raise_loading_failure(errors)


# ----------------------------------------------------------------------------- loading, in place

SLICE_BYTES = 16 * 2**20  # a TensorFlow variable bigger than this is written in slices of it


@contextlib.contextmanager
def assigned_in_place(model: Any) -> Iterator[None]:
    """While a load of weights into ``model`` runs: each of its variables (its optimizer's
    included) assigned a value read from the weights file (a NumPy array; an h5py dataset in
    Keras 3.8 and 3.9) costs that value beside the model, not also a second copy. On
    TensorFlow a value bigger than ``SLICE_BYTES`` goes into the variable's own buffer in
    slices of that size (Keras' assign converts it to a whole tensor first); on JAX, whose
    arrays cannot be written in place, the variable's old array is let go before Keras' assign
    makes the new one. After each ``SLICE_BYTES`` read, the heap's freed memory is given back
    (`heap.give_back`). Each variable's ``assign`` is overridden on the variable itself, for the
    load only: other models, other threads' variables and other values (a distributed variable,
    a dtype or shape that differs, a stateless scope) take Keras' own ``assign``, as do the
    other backends."""
    if keras.backend.backend() not in ("tensorflow", "jax") or not _stateless_scope_known():
        yield
        return
    overridden = []
    for variable in _variables_of(model):
        if "assign" not in vars(variable):  # not already overridden by a load around this one
            variable.assign = functools.partial(_assign_in_place, variable)
            overridden.append(variable)
    try:
        yield
    finally:
        for variable in overridden:
            vars(variable).pop("assign", None)


_read_since_given_back = [0]


def _variables_of(model: Any) -> list[Any]:
    optimizer = getattr(model, "optimizer", None)  # any saveable: the probes load into their own
    found = list(getattr(model, "variables", None) or []) + list(getattr(optimizer, "variables", None) or [])
    return [variable for variable in found
            if isinstance(variable, keras.Variable) and hasattr(variable, "__dict__")]


def _assign_in_place(variable: Any, value: Any) -> Any:
    if _plain_value(variable, value):
        _read_since_given_back[0] += value.nbytes
        if _read_since_given_back[0] >= SLICE_BYTES:
            _read_since_given_back[0] = 0
            heap.give_back()
        backend = keras.backend.backend()
        if backend == "tensorflow" and value.nbytes > SLICE_BYTES and _assign_tensorflow(variable, value):
            return variable.value
        if backend == "jax" and isinstance(getattr(variable, "_value", None), _jax_array()):
            # Its array is replaced whole: freed now (unless held elsewhere), before the new one
            # exists, not after. Meanwhile it reads as not yet initialized, as Keras' own do.
            variable._value = None
            assigned = type(variable).assign(variable, value)
            # The copy runs asynchronously, holding the value read: done before the next read.
            getattr(variable._value, "block_until_ready", lambda: None)()
            return assigned
    return type(variable).assign(variable, value)


@functools.cache
def _stateless_scope_known() -> bool:
    try:
        from keras.src.backend.common.stateless_scope import in_stateless_scope  # noqa: F401

        return True
    except Exception:  # noqa: BLE001 - moved in this Keras: Keras assigns as before
        return False


def _plain_value(variable: Any, value: Any) -> bool:
    """Whether ``value`` is an array read from the weights file that ``variable`` takes as it is."""
    import h5py
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    if not isinstance(value, np.ndarray | h5py.Dataset) or in_stateless_scope():
        return False
    if getattr(variable, "_layout", None) is not None or value.dtype.kind not in "fiub":
        return False
    shape = tuple(variable.shape)
    return tuple(value.shape) == shape and value.dtype == np.dtype(getattr(variable, "_dtype", None) or "V")


@functools.cache
def _jax_array() -> type:
    import jax

    return jax.Array


def _assign_tensorflow(variable: Any, value: Any) -> bool:
    """``value`` into a TensorFlow variable's buffer, rows of at most ``SLICE_BYTES`` at a time
    (read from the file as they go when it is a dataset). False for a variable that is not a
    plain resource variable (a distributed one), or a scalar."""
    target: Any = getattr(variable, "_value", None)
    if type(target).__name__ != "ResourceVariable" or not value.shape:
        return False
    row = max(1, value.nbytes // max(1, value.shape[0]))
    rows = max(1, SLICE_BYTES // row)
    for start in range(0, value.shape[0], rows):
        target[start:start + rows].assign(np.asarray(value[start:start + rows]))
    return True


def model_json(model: keras.Model) -> tuple[str, str]:
    """The ``config.json`` and ``metadata.json`` texts of a ``.keras`` file, as ``model.save`` writes them."""
    saving_lib = _saving_lib()
    assert saving_lib is not None
    config, metadata = saving_lib._serialize_model_as_json(model)
    return config, metadata


# ----------------------------------------------------------------------------- legacy HDF5 files (Keras 2's)


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


__all__ = ["array_adapters", "ArrayAdapters", "build_for_fit", "can_shard", "can_write_legacy_weights",
           "compile_config_kept", "flush_tensorboard", "global_seed_generator", "load_keras_archive",
           "load_sharded_weights", "load_unzipped_model", "load_weights_from", "lora_layer_variables",
           "model_checkpoint_internals", "model_json", "running_fit_callbacks", "running_fit_input",
           "saved_values", "SavedValue", "set_fit_initial_epoch", "sharding_works", "should_save_model",
           "snapshots_work", "TENSORBOARD_COUNTERS", "tensorflow_unavailable",
           "trained_non_trainable_variables", "unsupported", "write_legacy_weights", "write_sharded_weights",
           "write_weights"]
