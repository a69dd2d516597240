"""For tests that run on whichever backend KERAS_BACKEND names: the lanes run them on TensorFlow,
JAX (Colab's TPU runtime, without TensorFlow) and torch."""

from __future__ import annotations

import importlib.util

import pytest

HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
needs_tensorflow = pytest.mark.skipif(not HAS_TENSORFLOW, reason="TensorFlow is not installed here")


def deterministic_ops() -> None:
    """Bitwise-equal training runs on the CPU: TensorFlow needs op determinism turned on; JAX's
    and torch's CPU kernels are deterministic as they are."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
