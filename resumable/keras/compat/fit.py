"""What ``model.fit`` keeps to itself: its array data adapter, the callbacks and ``x`` of the
running fit (from its frame), its first-batch build and the epoch it starts at.

Reaches ``keras.src.trainers.data_adapters`` (``array_data_adapter.ArrayDataAdapter``,
``can_convert_arrays``, ``array_slicing.train_validation_split``), the
``keras.callbacks.CallbackList`` and ``x`` in ``fit``'s frame, ``Trainer._symbolic_build`` (and
when it reads a batch), ``Trainer._initial_epoch``, and follows how Keras' epoch iterator and
PyDataset adapter read an input (`dataset_iterators_per_pass`, `pydataset_epoch_order`).
"""

from __future__ import annotations

import functools
import inspect
import random
from types import ModuleType
from typing import Any, NamedTuple

import keras

from resumable.keras.compat.messages import logger, unsupported


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


def fit_reads_to_build(model: keras.Model) -> bool:
    """Whether ``model.fit`` on JAX or torch would read a batch of its input to build ``model``
    first (``Trainer._symbolic_build``: a layer, the compiled metrics or the compiled loss not yet
    built; the same test in Keras 3.8 to 3.15). That read starts a pass of the input: it draws a
    PyDataset's order (`pydataset_epoch_order`) and, on torch, a DataLoader's seed. False when
    this Keras' model lacks what the test reads."""
    try:
        layers = list(model._flatten_layers())
        metrics = model._compile_metrics
        loss = model._compile_loss
    except AttributeError:
        logger.debug("%s", unsupported("Trainer._symbolic_build's test"))
        return False
    return (not all(layer.built for layer in layers) or (metrics is not None and not metrics.built)
            or (loss is not None and not loss.built))


def pydataset_epoch_order(count: int, rng: random.Random | None = None) -> list[int]:
    """The batch indices of a PyDataset pass under ``fit(shuffle=True)``: Keras' PyDatasetAdapter
    (``_finite_generator``) and its ``OrderedEnqueuer`` (``_run``, in its worker thread) both take
    ``list(range(num_batches))`` and ``random.shuffle`` it, with Python's global RNG (``rng``
    None), once per pass as the pass begins (Keras 3.8 to 3.15). The same draws from a
    ``random.Random`` in the same state give the same order."""
    order = list(range(count))
    if rng is None:
        random.shuffle(order)
    else:
        rng.shuffle(order)
    return order


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


def set_fit_pass_length(callback: keras.callbacks.Callback, batches: int) -> bool:
    """Make the running ``model.fit`` (found from ``callback`` as `running_fit_input` finds its
    ``x``) count ``batches`` to a pass of its input from now on; False when not found.

    Keras' epoch iterator takes a finite input's length once, as ``fit`` starts, and with
    ``steps_per_epoch`` ends a pass (and so an epoch, early) when that many batches are read. A
    fit resumed inside a pass starts with the pass's rest; its later passes are whole. Sets
    ``EpochIterator._num_batches`` (the ``epoch_iterator`` in ``fit``'s frame, Keras 3.8 to 3.15),
    which ``_enumerate_iterator`` reads at each step.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            values = frame.f_locals
            iterator = values.get("epoch_iterator")
            if iterator is not None and "_num_batches" in vars(iterator) and any(
                    isinstance(v, keras.callbacks.CallbackList) and callback in v.callbacks
                    for v in values.values()):
                iterator._num_batches = batches
                return True
            frame = frame.f_back
    finally:
        del frame
    logger.debug("%s", unsupported("EpochIterator._num_batches in fit's frame"))
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


def dataset_iterators_per_pass(known_length: bool, tensorflow: bool) -> int:
    """Iterators of a ``tf.data.Dataset`` that ``model.fit`` creates for one pass of it (an epoch,
    or a validation), read a pass per epoch: each one a new seeded shuffle's order.

    Follows ``keras.src.trainers.epoch_iterator.EpochIterator._enumerate_iterator``: one iterator
    to read the pass and, when the length is known, one more at the pass's end, never read. On
    TensorFlow that one is the dataset's iterator; on JAX and torch, a generator never started
    (no iterator). Of an unknown length, every pass ends by running out of data, and Keras then
    creates none at its end.
    """
    return 2 if known_length and tensorflow else 1
