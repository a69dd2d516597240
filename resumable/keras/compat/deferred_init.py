"""Building a model from a checkpoint's config without computing the initial values its load
replaces (`initial_values_deferred`).

On JAX a random initializer's temporaries cost several times its variable (threefry's bits, then
the floats: building a model whose one kernel is a third of its checkpoint peaked at 1.43x the
checkpoint, above anything its load costs), and the time to draw them. Reaches the variable
class ``keras.Variable``: its ``_initialize_with_initializer`` (replaced while the model is
built, for the building thread only), ``_initialize``, ``_value``, ``_shape`` and ``_dtype``;
``keras.src.backend.common.global_state``'s ``distribution``; ``keras.config.is_nnx_enabled``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import keras


class Deferred:
    """The variables built holding zeros in place of their initializers' values."""

    def __init__(self) -> None:
        self._zeroed: list[tuple[weakref.ref[Any], Any, weakref.ref[Any]]] = []

    def zeroed(self, variable: Any, initializer: Any, zeros: Any) -> None:
        self._zeroed.append((weakref.ref(variable), initializer, weakref.ref(zeros)))

    def finish(self) -> None:
        """After the load: each variable that still holds its zeros (the load gave it no value)
        gets its initializer's value, as Keras would have given it."""
        for variable_ref, initializer, zeros_ref in self._zeroed:
            variable, zeros = variable_ref(), zeros_ref()
            if variable is not None and zeros is not None and variable._value is zeros:
                keras.Variable._initialize_with_initializer(variable, initializer)
        self._zeroed.clear()


@contextlib.contextmanager
def initial_values_deferred() -> Iterator[Deferred]:
    """While a model is built on this thread for a load of every value it has (JAX, no
    ``keras.distribution``): each variable created with an initializer holds zeros instead,
    drawn at no more than its own size. Call ``finish()`` once the load is done. Elsewhere
    (another backend, a distribution, Flax NNX, a Keras without these internals), the model
    is built as Keras builds it and ``finish()`` does nothing."""
    deferred = Deferred()
    if not _applies():
        yield deferred
        return
    own = keras.Variable.__dict__.get("_initialize_with_initializer")  # or inherited, as in Keras 3.8
    keras_initialize = keras.Variable._initialize_with_initializer
    building = threading.get_ident()

    def zeroed(variable: Any, initializer: Any) -> None:
        if threading.get_ident() != building or _distribution() is not None:
            keras_initialize(variable, initializer)
            return
        import jax.numpy as jnp

        zeros = jnp.zeros(variable._shape, variable._dtype)
        variable._initialize(zeros)
        deferred.zeroed(variable, initializer, zeros)

    keras.Variable._initialize_with_initializer = zeroed
    try:
        yield deferred
    finally:
        if own is None:
            del keras.Variable._initialize_with_initializer
        else:
            keras.Variable._initialize_with_initializer = own


def _applies() -> bool:
    if keras.backend.backend() != "jax" or _distribution() is not None:
        return False
    if getattr(keras.config, "is_nnx_enabled", lambda: False)():
        return False
    return all(hasattr(keras.Variable, name) for name in ("_initialize_with_initializer", "_initialize"))


def _distribution() -> Any:
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("distribution")
