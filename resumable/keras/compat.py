"""The Keras internals resumable relies on, reached from here only.

Keras exports no API for these: its lazy TensorFlow import check, its global SeedGenerator,
its array data adapter and the fit loop's `keras.callbacks.CallbackList`. Each is probed once;
when a Keras version lacks it, the function falls back to what plain Keras does (and says so
once, naming the Keras version), so an upgrade costs exactness or speed, never a crash.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import keras

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
# parameters each must take.
_MODEL_CHECKPOINT_METHODS = {
    "_save_model": ("epoch", "batch", "logs"),
    "_should_save_model": ("epoch", "batch", "logs", "filepath"),
    "_get_file_path": ("epoch", "batch", "logs"),
}


@functools.cache
def model_checkpoint_internals() -> str | None:
    """None when ``keras.callbacks.ModelCheckpoint`` has the private methods resumable.ModelCheckpoint
    overrides (``_save_model``) and calls (``_should_save_model``, ``_get_file_path``), with their
    parameters; else one line naming the Keras version and what is missing."""
    base = keras.callbacks.ModelCheckpoint
    for name, params in _MODEL_CHECKPOINT_METHODS.items():
        method = getattr(base, name, None)
        try:
            found = tuple(inspect.signature(method).parameters)[1:] if method is not None else None
        except (TypeError, ValueError):
            found = None
        if found != params:
            return unsupported(f"keras.callbacks.ModelCheckpoint.{name}{params}") + (
                "; use keras.callbacks.ModelCheckpoint, or a Keras version resumable supports")
    return None


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
        _ = (saving_lib._save_state, saving_lib.H5IOStore, saving_lib.DiskIOStore,
             saving_lib._serialize_model_as_json)
        return saving_lib
    except Exception:  # noqa: BLE001 - moved or renamed in this Keras version
        logger.warning("%s; checkpoints are serialized while training waits",
                       unsupported("keras.src.saving.saving_lib (_save_state, H5IOStore)"))
        return None


def saved_values(model: keras.Model, copy: Any, assets_dir: str | None) -> list[SavedValue] | None:
    """What ``model.save`` / ``model.save_weights`` would write to the weights file, as host copies.

    Runs Keras' own traversal (``saving_lib._save_state``) with a store that keeps
    ``copy(value)`` of each value instead of writing it, so `write_weights` later writes the
    same file in another thread while training goes on. Assets (vocabularies and the like)
    go to ``assets_dir`` now, when given (``model.save``; ``save_weights`` writes none).
    None when this Keras lacks those internals: the caller saves the usual way.
    """
    saving_lib = _saving_lib()
    if saving_lib is None:
        return None

    class Recorder(saving_lib.H5IOStore):  # type: ignore[name-defined]  # _save_state checks the type
        def __init__(self) -> None:  # no file: nothing of H5IOStore's own state is used
            self.values: list[SavedValue] = []
            self._entry: tuple[str, dict[str, Any] | None] = ("", None)

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: dict[str, Any] | None = None) -> Recorder:
            self._entry = (path, metadata)
            return self

        def __setitem__(self, key: str, value: Any) -> None:
            self.values.append(SavedValue(*self._entry, key, copy(value)))

    recorder = Recorder()
    assets = saving_lib.DiskIOStore("assets", mode="w") if assets_dir is not None else None
    try:
        with _optimizers_hand_over_variables(model):
            saving_lib._save_state(model, weights_store=recorder, assets_store=assets, inner_path="",
                                   visited_saveables=set())
        if assets is not None and assets_dir is not None:
            import shutil

            shutil.copytree(assets.working_dir, assets_dir, dirs_exist_ok=True)
    finally:
        if assets is not None:
            assets.close()
    return recorder.values


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


@functools.cache
def _sharded_store() -> Any:
    """Keras' ``ShardedH5IOStore`` (Keras 3.11+); None, said once, when this Keras lacks it."""
    saving_lib = _saving_lib()
    store = getattr(saving_lib, "ShardedH5IOStore", None) if saving_lib is not None else None
    if store is None:
        logger.warning("%s; big checkpoints are written as one file",
                       unsupported("keras.src.saving.saving_lib.ShardedH5IOStore"))
    return store


def can_shard() -> bool:
    """Whether this Keras writes and reads sharded weights (``model.weights.json`` and its shards)."""
    return _sharded_store() is not None


def write_sharded_weights(values: list[SavedValue], path: str, max_shard_size: float) -> None:
    """Write `saved_values` as Keras' sharded weights: ``path`` (a ``.weights.json`` map) and its
    ``*_00000.weights.h5`` shards of at most ``max_shard_size`` GiB each, as
    ``model.save_weights(path, max_shard_size=...)`` writes them; ``model.load_weights(path)`` reads them."""
    sharded = _stores()[1]
    assert sharded is not None  # the caller asked can_shard()
    _fill(sharded(path, max_shard_size, mode="w"), values)


def write_weights(values: list[SavedValue], path: str) -> None:
    """Write `saved_values` as the ``.weights.h5`` file Keras would have written, with its store."""
    _fill(_stores()[0](path, mode="w"), values)


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


@functools.cache
def _stores() -> tuple[type, type | None]:
    """Keras' ``H5IOStore`` and ``ShardedH5IOStore`` (None if this Keras has none), taking values
    as `_HostView`. The sharded store's own ``__setitem__`` converts, then calls its base's:
    the class between them wraps the converted value again."""
    saving_lib = _saving_lib()
    assert saving_lib is not None  # saved_values returned values

    class Uncopied(saving_lib.H5IOStore):  # type: ignore[name-defined]
        def __setitem__(self, key: str, value: Any) -> None:
            super().__setitem__(key, value if isinstance(value, _HostView) else _HostView(value))

    sharded = _sharded_store()
    if sharded is None:
        return Uncopied, None

    class ShardedUncopied(sharded, Uncopied):  # type: ignore[misc, valid-type]
        pass

    return Uncopied, ShardedUncopied


def _fill(store: Any, values: list[SavedValue]) -> None:
    try:
        entry: tuple[str, dict[str, Any] | None] | None = None
        for value in values:
            if entry != (value.path, value.metadata):
                entry = (value.path, value.metadata)
                store.make(value.path, metadata=value.metadata)
            store[value.key] = _HostView(value.value)
    finally:
        store.close()


def load_weights_from(model: keras.Model, file: Any) -> bool:
    """``model.load_weights`` of a ``.weights.h5`` given as a file object (a BytesIO, as Keras'
    store requires: `zip_member.MemberWindow`), as ``load_weights`` reads a path: Keras'
    ``H5IOStore`` and ``_load_state``. False, having loaded nothing, when this Keras lacks
    them: the caller reads a path instead. Raises ValueError as ``load_weights`` does."""
    saving_lib = _saving_lib()
    if saving_lib is None or not _can_load_state(saving_lib):
        return False
    _load_into(saving_lib, model, saving_lib.H5IOStore(file, mode="r"), None)
    return True


def load_sharded_weights(model: keras.Model, weights: str, landed: Callable[[str], object]) -> None:
    """``model.load_weights`` of sharded weights (``weights``: the ``.weights.json`` map), a shard
    at a time, each opened once ``landed(file name)`` returns: the next may still be coming."""
    saving_lib = _saving_lib()
    if saving_lib is None or _sharded_store() is None or not _can_load_state(saving_lib):
        raise ValueError(unsupported("keras.src.saving.saving_lib's ShardedH5IOStore and _load_state")
                         + " to read sharded weights")
    _load_into(saving_lib, model, _waiting_store(landed)(weights, mode="r"), None)


def load_unzipped_model(config: str, weights: str, assets: str | None,
                        landed: Callable[[str], object]) -> keras.Model:
    """The model of an unzipped ``.keras`` whose weights are sharded: what ``keras.saving.load_model``
    does for a folder, reading the weights a shard at a time as `load_sharded_weights` does
    (Keras' own folder loader knows only one ``model.weights.h5``). ``config``: config.json's
    text; ``weights``: the ``.weights.json`` map; ``assets``: the assets folder, if any.
    Raises ValueError as Keras does."""
    saving_lib = _saving_lib()
    if saving_lib is None or _sharded_store() is None or not _can_load_state(saving_lib) or not hasattr(
            saving_lib, "_model_from_config"):
        raise ValueError(unsupported("keras.src.saving.saving_lib's folder loading (_model_from_config)")
                         + " to read sharded weights")
    model = saving_lib._model_from_config(config, None, True, True)
    assets_store = saving_lib.DiskIOStore(assets, mode="r") if assets is not None else None
    _load_into(saving_lib, model, _waiting_store(landed)(weights, mode="r"), assets_store)
    return model


def load_keras_archive(archive: Any, weights: Any) -> keras.Model | None:
    """``keras.saving.load_model`` of an open ``.keras`` zip whose weights are read from the file
    object ``weights`` (`zip_member.MemberWindow`: in place, where Keras reads the whole member
    into memory first): the model from ``config.json``, compiled, its weights, optimizer state
    and assets loaded as Keras does. None, having loaded nothing, when this Keras lacks the
    internals: the caller uses ``load_model``. Raises ValueError as Keras does."""
    saving_lib = _saving_lib()
    if saving_lib is None or not _can_load_state(saving_lib) or not hasattr(saving_lib, "_model_from_config"):
        return None
    model = saving_lib._model_from_config(archive.read("config.json").decode(), None, True, True)
    has_assets = len(archive.namelist()) > 3  # as Keras: anything beyond metadata, config and weights
    assets = saving_lib.DiskIOStore("assets", archive=archive, mode="r") if has_assets else None
    _load_into(saving_lib, model, saving_lib.H5IOStore(weights, mode="r"), assets)
    return model


def _can_load_state(saving_lib: ModuleType) -> bool:
    return all(hasattr(saving_lib, name) for name in ("_load_state", "_raise_loading_failure"))


def _waiting_store(landed: Callable[[str], object]) -> type:
    """Keras' ``ShardedH5IOStore``, opening each shard (``_get_h5_file``) once it has landed."""
    sharded = _sharded_store()

    class Waiting(sharded):  # type: ignore[misc, valid-type]
        arrival_error: BaseException | None = None  # Keras' loader turns it into "could not be loaded"

        def _get_h5_file(self, path_or_io: Any, mode: str | None = None) -> Any:
            try:
                landed(Path(str(path_or_io)).name)
            except BaseException as e:
                self.arrival_error = e
                raise
            return super()._get_h5_file(path_or_io, mode=mode)

    return Waiting


def _load_into(saving_lib: ModuleType, model: keras.Model, weights_store: Any, assets_store: Any) -> None:
    """Keras' ``_load_state`` of the stores into ``model`` (closed after), failures raised as Keras does."""
    failed: set[int] = set()
    errors: dict[int, Any] = {}
    try:
        saving_lib._load_state(model, weights_store=weights_store, assets_store=assets_store, inner_path="",
                               visited_saveables=set(), failed_saveables=failed, error_msgs=errors)
    finally:
        weights_store.close()
        if assets_store is not None:
            assets_store.close()
    arrival_error = getattr(weights_store, "arrival_error", None)
    if arrival_error is not None:  # a shard that did not arrive (damaged): that, not Keras' summary
        raise arrival_error
    if failed:
        saving_lib._raise_loading_failure(errors)


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



__all__ = ["TENSORBOARD_COUNTERS", "ArrayAdapters", "array_adapters", "build_for_fit",
           "can_write_legacy_weights", "compile_config_kept", "flush_tensorboard", "global_seed_generator",
           "lora_layer_variables", "model_checkpoint_internals", "running_fit_callbacks",
           "running_fit_input", "set_fit_initial_epoch", "tensorflow_unavailable",
           "trained_non_trainable_variables", "unsupported", "write_legacy_weights"]
