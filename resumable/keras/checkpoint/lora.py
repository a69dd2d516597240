"""LoRA layers in full checkpoints: their variables as they are, beside Keras' merged save.

Keras writes a LoRA-enabled layer (Dense, EinsumDense, Embedding, convolutions after
``enable_lora``) with its factors merged into the kernel, and loads it with the factors set to
zero: the model computes about the same, but a fine-tune resumed from it starts from other
weights (and Adam's moments no longer fit them). So a full checkpoint also holds those layers'
own variables, unmerged, in ``arrays.npz`` (``lora/<i>``), put back after Keras' load. That costs
the size of the LoRA'd kernels once more; ``model.keras`` stays what Keras writes (the merged
model, for any other tool). Trainable-only checkpoints need none of this: they assign variables.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np

from resumable.keras import compat
from resumable.keras.checkpoint import npy

logger = logging.getLogger("resumable")

PREFIX = "lora/"


def in_model(model: keras.Model) -> bool:
    """Whether ``model`` has LoRA-enabled layers. Asked once per fit, at its first save (a
    ``lora_rank`` layer enables LoRA when it is built, at the latest by the first step): a fit
    enables none, so its later saves need not look again (`CheckpointBuilder`)."""
    return bool(compat.lora_layer_variables(model))


def raw_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """The variables of the model's LoRA-enabled layers, unmerged, for ``arrays.npz``."""
    variables = compat.lora_layer_variables(model) or []
    return {f"{PREFIX}{i}": npy.storable(keras.ops.convert_to_numpy(v)) for i, v in enumerate(variables)}


def restore(model: keras.Model, arrays: dict[str, Any], where: str) -> None:
    """After Keras' load: the LoRA layers' variables as they were saved, not merged."""
    saved = {k: v for k, v in arrays.items() if k.startswith(PREFIX)}
    if not saved:
        return
    variables = compat.lora_layer_variables(model) or []
    values = [saved[f"{PREFIX}{i}"] for i in range(len(variables)) if f"{PREFIX}{i}" in saved]
    if len(saved) != len(variables) or len(values) != len(variables) or any(
        tuple(value.shape) != tuple(v.shape) for value, v in zip(values, variables, strict=True)
    ):
        logger.warning("resumable: %s: the LoRA layers keep Keras' merged weights (their layout differs "
                       "from the checkpoint's): training continues from them, not exactly", where)
        return
    for variable, value in zip(variables, values, strict=True):
        variable.assign(npy.for_variable(value, variable))
