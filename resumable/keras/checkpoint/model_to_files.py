"""A model and its training state to files in a local folder (`loading` reads them back).

With `loading`, the only module that saves or loads Keras models. Keras and h5py only ever see
local paths: the storage layer copies the folder to Drive or ``gs://`` afterwards. That keeps h5py's
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
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np

from resumable.core.errors import (
    ResumableError,
)
from resumable.keras import compat
from resumable.keras.checkpoint import lora, trainable
from resumable.keras.checkpoint.snapshot import (
    ARRAYS_FILE,
    MODEL_FILE,
    STATE_FILE,
    WEIGHTS_FILE,
    ModelSnapshot,
)
from resumable.keras.checkpoint.snapshot import take as take_snapshot
from resumable.keras.checkpoint.state_file import STATE_VERSION, jsonable
from resumable.keras.checkpoint.training_state import seed_generator_arrays
from resumable.keras.topology import process_count


def save(model: keras.Model, folder: Path, *, weights_only: bool, state: dict[str, Any],
         arrays: dict[str, np.ndarray] | None = None, trainable_only: bool = False,
         max_shard_size: float | None = None, lora_layers: bool = True) -> str:
    """Write the model (with its optimizer state), ``state.json`` and callback arrays to ``folder``;
    returns the payload file's name (the manifest's ``payload``).

    ``trainable_only``: only what trains and its optimizer state (``trainable.npz``), with the
    frozen weights' fingerprint in ``state.json``. ``max_shard_size``: weights over this many
    GiB go to shards of at most that size. ``lora_layers``: False when the caller knows the model
    has no LoRA layers (`lora.in_model`), so none are looked for.
    """
    if trainable_only:
        _save_trainable(model, folder, state, arrays)
        return trainable.TRAINABLE_FILE
    taken = snapshot(model, weights_only=weights_only, state=state, arrays=arrays,
                     max_shard_size=max_shard_size, lora_layers=lora_layers)
    if taken is not None:
        taken.write(folder)
        return taken.payload
    folder.mkdir(parents=True, exist_ok=True)  # a Keras without the internals snapshots need
    with no_tensorflow_import(), _no_distribution():
        if weights_only:
            model.save_weights(str(folder / WEIGHTS_FILE))
        else:
            model.save(str(folder / MODEL_FILE))
    (folder / STATE_FILE).write_text(json.dumps(checkpoint_state(model, state), indent=1))
    arrays = _all_arrays(model, arrays, lora_layers)
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
        json.dumps(checkpoint_state(model, {**state, "trainable": layout}), indent=1))
    arrays = {**(arrays or {}), **seed_generator_arrays(model)}  # LoRA layers: assigned, never merged
    if arrays:
        np.savez(folder / ARRAYS_FILE, **arrays)  # type: ignore[arg-type]


def _all_arrays(model: keras.Model, arrays: dict[str, np.ndarray] | None,
                lora_layers: bool) -> dict[str, np.ndarray]:
    """``arrays.npz`` of a full checkpoint: the caller's arrays, the layers' seed generator states
    and the LoRA layers' variables unmerged (Keras saves those layers merged)."""
    unmerged = lora.raw_arrays(model) if lora_layers else {}
    return {**(arrays or {}), **seed_generator_arrays(model), **unmerged}


def snapshot(model: keras.Model, *, weights_only: bool, state: dict[str, Any],
             arrays: dict[str, np.ndarray] | None = None, max_shard_size: float | None = None,
             budget: int | None = None, copy_part: bool = True,
             lora_layers: bool = True) -> ModelSnapshot | None:
    """What `save` writes, copied into host memory now, to be written later (`ModelSnapshot.write`).

    Training waits only for this copy; None on a Keras without the internals it needs. Over
    ``budget`` bytes (#54) what fits is copied (with ``copy_part``; else nothing), the rest
    streamed: written at once (`snapshot.take`). ``lora_layers``: as `save`'s.
    """
    _check_whole_arrays(model)
    # Copies: a JAX step may donate the buffers these arrays view (seed generators, metrics).
    arrays = {key: np.array(value, copy=True)
              for key, value in _all_arrays(model, arrays, lora_layers).items()}
    with no_tensorflow_import(), _no_distribution():
        return take_snapshot(model, weights_only=weights_only, state=checkpoint_state(model, state),
                             arrays=arrays, max_shard_size=max_shard_size, budget=budget,
                             copy_part=copy_part)


def checkpoint_state(model: keras.Model, state: dict[str, Any]) -> dict[str, Any]:
    """``state.json``'s content: the caller's state, its version and the model's weight layout
    (#36: `multihost.py` writes it for a split model too)."""
    result: dict[str, Any] = jsonable({**state, "version": STATE_VERSION, "model": model_summary(model)})
    return result


def model_summary(model: keras.Model) -> dict[str, Any]:
    """The weight layout and build config, so a later load can name a mismatch or build the model."""
    summary: dict[str, Any] = {
        "class": type(model).__name__,
        "weights": [[w.path, list(w.shape)] for w in model.weights],
    }
    with contextlib.suppress(Exception):  # not every model can describe how it was built
        summary["build_config"] = model.get_build_config()
    return summary


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
def no_tensorflow_import() -> Iterator[None]:
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
