"""Position NumPy arrays at a batch of their epoch, for an exact mid-epoch resume.

`Run.fit` resumes a checkpoint taken k batches into an epoch by fitting the rest of that epoch
first: the same batches, in the same order, as an uninterrupted run would have seen. Arrays
are positioned here, through Keras' own array adapter; datasets, PyDatasets and generators by
`inputs.Feed`.
"""

from __future__ import annotations

import inspect
from typing import Any

import keras

from resumable.keras import compat
from resumable.keras.checkpoint import torch_backend, training_state


def rest_of_epoch(model: keras.Model, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int,
                   epoch_rng: dict[str, Any], positioned: bool = False) -> dict[str, Any] | str:
    """``model.fit`` arguments for the batches of the current epoch after ``batch``, or why not.

    The data order of the epoch is Keras' own: NumPy arrays go through Keras' array adapter
    (with TensorFlow, ``fit``'s shuffle depends on the global seed only; on JAX on NumPy's
    state at the epoch start, on torch on torch's, saved as ``epoch_rng``). ``positioned``:
    ``x`` already starts at the batch (`inputs.Feed` placed a dataset, PyDataset or generator
    there); other inputs cannot be positioned here.
    """
    try:
        bound = inspect.signature(model.fit).bind_partial(*args, **kwargs)
    except TypeError as e:
        return f"its arguments could not be read ({e})"
    fit_args = dict(bound.arguments)
    fit_args.update(fit_args.pop("kwargs", {}))
    x = fit_args.pop("x", None)
    y = fit_args.pop("y", None)
    sample_weight = fit_args.pop("sample_weight", None)
    shuffle = fit_args.pop("shuffle", True)
    batch_size = fit_args.pop("batch_size", None)
    steps = fit_args.pop("steps_per_epoch", None)
    class_weight = fit_args.pop("class_weight", None)
    split = fit_args.pop("validation_split", 0.0)
    rest = fit_args
    remaining = None if steps is None else steps - batch
    if remaining is not None and remaining <= 0:
        return f"steps_per_epoch={steps} is not more than that"
    if positioned:
        return {**rest, "x": x, "shuffle": False, "class_weight": class_weight,
                **({"steps_per_epoch": remaining} if remaining else {})}
    adapters = compat.array_adapters()
    if adapters is None:  # replaying the epoch is the safe answer
        return compat.unsupported("the data adapters of model.fit")
    array_data_adapter, array_slicing = adapters
    backend = keras.backend.backend()

    if x is not None and _batches_arrays_in_order(model) and all(map(_sliceable, (x, y, sample_weight))):
        if split and rest.get("validation_data") is None:
            (x, y, sample_weight), rest["validation_data"] = array_slicing.train_validation_split(
                (x, y, sample_weight), validation_split=split)
        start = batch * (batch_size or 32)  # keras-hub's default batch size, as Keras'
        if start >= _length(x):
            return f"the arrays hold only {-(-_length(x) // (batch_size or 32))} batches"
        rest.update(x=_from(x, start), y=_from(y, start), sample_weight=_from(sample_weight, start))
        return {**rest, "batch_size": batch_size, "class_weight": class_weight,
                **({"steps_per_epoch": remaining} if remaining else {})}

    if array_data_adapter.can_convert_arrays((x, y, sample_weight)):
        if split and rest.get("validation_data") is None:
            # As model.fit does, before anything else: the validation split is the last part.
            (x, y, sample_weight), rest["validation_data"] = array_slicing.train_validation_split(
                (x, y, sample_weight), validation_split=split)
        adapter = array_data_adapter.ArrayDataAdapter(
            x, y, sample_weight=sample_weight, class_weight=class_weight, shuffle=shuffle,
            batch_size=batch_size, steps=steps)
        total = steps or adapter.num_batches
        if total is not None and batch >= total:
            return f"the epoch has only {total} batches"
        if batch_size is not None and rest.get("validation_batch_size") is None:
            rest["validation_batch_size"] = batch_size  # fit validates in batches of batch_size
        if backend == "tensorflow":
            import tensorflow as tf

            if shuffle and _tf_global_seed(tf) is None:
                return ("model.fit shuffles the arrays with an unseeded TensorFlow RNG; call "
                        "keras.utils.set_random_seed(...) before fit for an exact resume")
            dataset = adapter.get_tf_dataset().skip(batch)
            return {**rest, "x": dataset, "shuffle": False, "steps_per_epoch": (total or 0) - batch}
        if backend in ("jax", "numpy"):
            if shuffle:
                training_state.set_rng_state({"numpy": epoch_rng["numpy"]} if "numpy" in epoch_rng else {})
            batches = iter(adapter.get_numpy_iterator())
            for _ in range(batch):  # draws the epoch's permutation, then passes the batches done
                next(batches)
            return {**rest, "x": batches, "shuffle": False, "steps_per_epoch": (total or 0) - batch}
        if backend == "torch" and total is not None:
            loader = torch_backend.rest_of_epoch_batches(adapter, batch, epoch_rng, total)
            return {**rest, "x": loader, "shuffle": False, "steps_per_epoch": total - batch}
        return f"resumable cannot position arrays on the {backend} backend"
    return f"a {type(x).__name__} input cannot be positioned at a batch"


def takes_arrays(model: keras.Model, x: Any, y: Any = None, sample_weight: Any = None) -> bool:
    """True when ``fit`` takes ``x`` as arrays (NumPy, tensors, dicts or lists of them; for a
    keras-hub task, a list of strings too): inputs Keras orders from the RNG states a
    checkpoint holds. False also when this Keras' array adapter is unknown."""
    if _batches_arrays_in_order(model) and all(map(_sliceable, (x, y, sample_weight))):
        return True
    adapters = compat.array_adapters()
    return adapters is not None and bool(
        adapters.array_data_adapter.can_convert_arrays((x, y, sample_weight)))


def _batches_arrays_in_order(model: keras.Model) -> bool:
    """True for keras-hub's tasks (``CausalLM`` and the others): their ``fit`` turns arrays (or a
    list of strings) into a dataset of batches in their order, and ``shuffle`` never reaches
    Keras' array adapter. So the rest of an epoch is the samples from the first not trained on."""
    module = getattr(type(model).fit, "__module__", None) or ""
    return module.split(".")[0] in ("keras_hub", "keras_nlp")


def _texts(data: Any) -> bool:
    """A list of strings (a prompt per sample): keras-hub takes it as one array."""
    return isinstance(data, (list, tuple)) and bool(data) and all(isinstance(t, (str, bytes)) for t in data)


def _sliceable(data: Any) -> bool:
    """None, a list of strings, or arrays (a dict or list of them) with a sample dimension."""
    if data is None or _texts(data):
        return True
    leaves = keras.tree.flatten(data)
    return bool(leaves) and all(len(getattr(a, "shape", ())) > 0 for a in leaves)


def _length(x: Any) -> int:
    return len(x) if _texts(x) else int(keras.tree.flatten(x)[0].shape[0])


def _from(data: Any, start: int) -> Any:
    """Samples from ``start`` on, of arrays (or a dict or list of them) or of a list of strings."""
    if data is None or _texts(data):
        return None if data is None else data[start:]
    return keras.tree.map_structure(lambda a: a[start:], data)


def _tf_global_seed(tf: Any) -> int | None:
    try:
        seed: int | None = tf.compat.v1.random.get_seed(None)[0]
    except RuntimeError:  # op determinism without a seed: fit's shuffle will fail the same way
        return None
    return seed


__all__ = ["rest_of_epoch", "takes_arrays"]
