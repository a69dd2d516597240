"""Arrays of any Keras dtype in ``.npz`` files, bit for bit.

``.npy`` cannot name bfloat16 or the other ml_dtypes types (it writes them as raw ``V2`` and
reads them back as bytes): they are stored as unsigned integers of the same width and viewed
back as the dtype of the variable they return to.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np


def storable(value: Any) -> np.ndarray:
    """The array as ``.npy`` can hold it: a type it cannot name as unsigned ints of its width."""
    value = np.asarray(value)
    if np.dtype(value.dtype.str) != value.dtype:
        return value.view(f"u{value.dtype.itemsize}")
    return value


def for_variable(stored: np.ndarray, variable: Any) -> np.ndarray:
    """A stored array viewed as ``variable``'s dtype again, when `storable` changed it."""
    dtype = np.dtype(keras.backend.standardize_dtype(variable.dtype))
    if stored.dtype != dtype and stored.dtype.kind == "u" and stored.dtype.itemsize == dtype.itemsize:
        return stored.view(dtype)
    return stored
