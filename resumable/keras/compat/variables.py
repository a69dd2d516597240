"""Layers' own variable lists, for trainable-only checkpoints and LoRA layers.

Reaches ``Layer._layers``, ``_flatten_layers``, ``_trainable_variables`` and
``_non_trainable_variables``.
"""

from __future__ import annotations

from typing import Any

import keras

from resumable.keras.compat.messages import unsupported, warn_once

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
        warn_once(unsupported("Layer._layers and Layer._non_trainable_variables") + "; trainable-only "
                  "checkpoints hold every float non-trainable weight")
        return None
    unique: dict[int, Any] = {}
    for variable in found:  # a shared variable once, at its first place
        unique.setdefault(id(variable), variable)
    return list(unique.values())


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
        warn_once(unsupported("Layer._flatten_layers and Layer._trainable_variables")
                  + "; LoRA layers resume with their factors merged into the kernel")
        return None
