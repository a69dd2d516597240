"""Loading a variable at a time in place: a load of weights costs each value beside the model,
not also a second copy of it (`assigned_in_place`, around every fast load in `loading`).

Reaches each variable's ``assign`` (overridden on the variable itself, for one load), its
``_value``, ``_dtype`` and ``_layout``, and
``keras.src.backend.common.stateless_scope.in_stateless_scope``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from resumable.manager.storage_names import give_heap_back

GIVE_BACK_BYTES = 16 * 2**20  # read between two gives of the heap's freed memory back to the system


@contextlib.contextmanager
def assigned_in_place(model: Any) -> Iterator[None]:
    """While a load of weights into ``model`` runs on JAX: each of its variables (its optimizer's
    included) assigned a value read from the weights file (a NumPy array; an h5py dataset in
    Keras 3.8 and 3.9) costs that value beside the model, not also a second copy: JAX arrays
    cannot be written in place, so the variable's old array is let go before Keras' assign
    makes the new one, and the copy is waited for before the next value is read. After each
    ``GIVE_BACK_BYTES`` read, the heap's freed memory is given back (`give_heap_back`). Each
    variable's ``assign`` is overridden on the variable itself, for the load only: other
    models, other threads' variables and other values (a distributed variable, a dtype or
    shape that differs, a stateless scope) take Keras' own ``assign``.

    Other backends load as Keras does. On TensorFlow a model of ordinary variables already
    peaks at about 1.1x the checkpoint; writing a big variable's value into its buffer in
    slices saved 58 MB of a 287 MB checkpoint's resume and made it twice as slow."""
    if keras.backend.backend() != "jax" or not _stateless_scope_known():
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
    if not _plain_value(variable, value) or not isinstance(getattr(variable, "_value", None), _jax_array()):
        return type(variable).assign(variable, value)
    _read_since_given_back[0] += value.nbytes
    if _read_since_given_back[0] >= GIVE_BACK_BYTES:
        _read_since_given_back[0] = 0
        give_heap_back()
    # Its array is replaced whole: freed now (unless held elsewhere), before the new one
    # exists, not after. Meanwhile it reads as not yet initialized, as Keras' own do.
    variable._value = None
    assigned = type(variable).assign(variable, value)
    # The copy runs asynchronously, holding the value read: done before the next read.
    getattr(variable._value, "block_until_ready", lambda: None)()
    return assigned


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
