"""Loading a variable at a time in place: a load of weights costs at most each value beside the
model, not also a second copy of it (`assigned_in_place`, around every fast load in `loading`).

Reaches each variable's ``assign`` (overridden on the variable itself, for one load), its
``_value``, ``_dtype`` and ``_layout``, and
``keras.src.backend.common.stateless_scope.in_stateless_scope``; on TensorFlow, also an eager
tensor's ``_numpy`` (a view of its buffer on the CPU) of a ``ReadVariableOp``.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from resumable.keras.compat import in_place_reads
from resumable.manager import give_heap_back

GIVE_BACK_BYTES = 16 * 2**20  # read between two gives of the heap's freed memory back to the system


@contextlib.contextmanager
def assigned_in_place(model: Any) -> Iterator[None]:
    """While a load of weights into ``model`` runs: each of its variables (its optimizer's
    included) assigned a value read from the weights file (a NumPy array; an h5py dataset in
    Keras 3.8 and 3.9; a `in_place_reads.UnreadValue`) costs at most that value beside the model, not
    also a second copy.

    - JAX arrays cannot be written in place: the variable's old array is let go before Keras'
      assign makes the new one, and before a big value (handed over unread) is read. On the
      CPU a big value's new array is the array read, not a copy: it is read into an aligned
      buffer (`in_place_reads.aligned_read`), which JAX takes as it is. Where Keras' assign copies (a
      smaller value, another device), the copy is waited for before the next value is read.
    - TensorFlow: the value is read (a big one, left unread by the store: `in_place_reads.UnreadValue`)
      or copied straight into the buffer the variable already has on the CPU, where Keras'
      assign would first make a tensor of it (a second copy), then copy that in. A big value
      then costs nothing beside the model. Only where two reads of the variable show the same
      buffer (so it is the variable's own, not a copy made for the read), the load runs
      eagerly, and no view of a variable's buffer is held by a snapshot not yet written
      (`shared_buffer`): a snapshot counts on copy on write, and writing into the buffer
      would change what it writes.

    After each ``GIVE_BACK_BYTES`` read, the heap's freed memory is given back
    (`give_heap_back`). Each variable's ``assign`` is overridden on the variable itself, for
    the load only: other models, other threads' variables and other values (a distributed
    variable, a variable on a GPU, a dtype or shape that differs, a scalar, a stateless scope)
    take Keras' own ``assign``. Other backends load as Keras does."""
    assign = {"jax": _assign_in_place, "tensorflow": _write_into_buffer}.get(keras.backend.backend())
    if assign is None or not _stateless_scope_known():
        yield
        return
    overridden = []
    for variable in _variables_of(model):
        if "assign" not in vars(variable):  # not already overridden by a load around this one
            variable.assign = functools.partial(assign, variable)
            overridden.append(variable)
    try:
        yield
    finally:
        for variable in overridden:
            vars(variable).pop("assign", None)


_read_since_given_back = [0]
_snapshot_views: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def shared_buffer(view: np.ndarray) -> np.ndarray:
    """Record ``view``, a NumPy view of a TensorFlow variable's buffer that counts on copy on
    write (a snapshot's, `snapshot._host_copy`): while one lives, a load into any model
    assigns as Keras does (a new buffer where the old one is shared), never into a buffer."""
    _snapshot_views[id(view)] = view
    return view


def _variables_of(model: Any) -> list[Any]:
    optimizer = getattr(model, "optimizer", None)  # any saveable: the probes load into their own
    found = list(getattr(model, "variables", None) or []) + list(getattr(optimizer, "variables", None) or [])
    return [variable for variable in found
            if isinstance(variable, keras.Variable) and hasattr(variable, "__dict__")]


def _assign_in_place(variable: Any, value: Any) -> Any:
    if not _plain_value(variable, value) or not isinstance(getattr(variable, "_value", None), _jax_array()):
        if isinstance(value, in_place_reads.UnreadValue):
            value = np.asarray(value)
        return type(variable).assign(variable, value)
    _count_read(value.nbytes)
    # Its array is replaced whole: freed now (unless held elsewhere), before the new one
    # exists, not after. Meanwhile it reads as not yet initialized, as Keras' own do.
    variable._value = None
    if not isinstance(value, np.ndarray):  # unread (an h5py dataset in Keras 3.8 and 3.9): read now
        big = value.nbytes >= in_place_reads.ALIGNED_FROM_BYTES
        value = in_place_reads.aligned_read(value) if big else np.asarray(value)
    assigned = type(variable).assign(variable, value)
    # The copy runs asynchronously, holding the value read: done before the next read.
    getattr(variable._value, "block_until_ready", lambda: None)()
    return assigned


def _write_into_buffer(variable: Any, value: Any) -> Any:
    writable = _plain_value(variable, value) and value.ndim and not _snapshot_views
    buffer = _own_buffer(variable._value) if writable else None
    if buffer is None:
        if isinstance(value, in_place_reads.UnreadValue):
            value = np.asarray(value)  # read whole, as Keras' own store reads
        return type(variable).assign(variable, value)
    _count_read(value.nbytes)
    if isinstance(value, np.ndarray):
        np.copyto(buffer, value)
    else:  # an h5py dataset or a value left unread by the store: read straight into the buffer
        value.read_direct(buffer)
    return value


def _own_buffer(tf_variable: Any) -> np.ndarray | None:
    """A writable view of the buffer a plain, eager, CPU TensorFlow variable holds, or None.

    A read of a resource variable hands out its buffer itself unless the variable copies on
    read (after a sparse update) or lives on another device: two reads at one address are the
    variable's own buffer."""
    import tensorflow as tf

    # A resource variable (those an optimizer makes in its tf.function are one too), not a
    # distributed one: writing into one replica's buffer would leave the others behind.
    resource = any(kind.__name__ == "BaseResourceVariable" for kind in type(tf_variable).__mro__)
    if not resource or isinstance(tf_variable, tf.distribute.DistributedValues) or not tf.executing_eagerly():
        return None
    if "CPU" not in tf_variable.device.upper():
        return None
    first = tf.raw_ops.ReadVariableOp(resource=tf_variable.handle, dtype=tf_variable.dtype)
    second = tf.raw_ops.ReadVariableOp(resource=tf_variable.handle, dtype=tf_variable.dtype)
    view = getattr(first, "_numpy", lambda: None)()
    if not isinstance(view, np.ndarray) or not view.flags.writeable or not view.flags.c_contiguous:
        return None
    if view.ctypes.data != np.asarray(second._numpy()).ctypes.data:
        return None
    return view


def _count_read(nbytes: int) -> None:
    _read_since_given_back[0] += nbytes
    if _read_since_given_back[0] >= GIVE_BACK_BYTES:
        _read_since_given_back[0] = 0
        give_heap_back()


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

    if not isinstance(value, np.ndarray | h5py.Dataset | in_place_reads.UnreadValue) or in_stateless_scope():
        return False
    if getattr(variable, "_layout", None) is not None or value.dtype.kind not in "fiub":
        return False
    shape = tuple(variable.shape)
    return tuple(value.shape) == shape and value.dtype == np.dtype(getattr(variable, "_dtype", None) or "V")


@functools.cache
def _jax_array() -> type:
    import jax

    return jax.Array
