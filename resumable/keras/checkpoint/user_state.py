"""Your own callback's (or ``keras.utils.PyDataset``'s) state across sessions: ``get_state()`` /
``set_state(state)``.

An object with both methods has ``get_state()`` saved with each checkpoint (in ``state.json``)
and ``set_state(...)`` called with it when the resumed run's first epoch begins, after Keras'
``on_train_begin`` has reset the object::

    class Counter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

        def get_state(self):
            return {"batches": self.batches}

        def set_state(self, state):
            self.batches = int(state["batches"])

The state must be JSON: dicts with string keys, lists, strings, numbers (NumPy scalars
included; NaN and infinities too), booleans and None. A state that is not is skipped, with a
warning naming the object and the value. What comes back is read from the run folder: a
``set_state`` that raises is reported in one warning, and training goes on without it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from resumable.core import user_warnings
from resumable.core.display import printable

logger = logging.getLogger("resumable")

STATE_KEY = "state"  # the one field of a saved entry: {"state": <what get_state returned>}
_FLOAT_TAG = "$float"  # a non-finite float in JSON: {"$float": "inf"}
MAX_DEPTH = 32


def has_protocol(obj: Any) -> bool:
    """True when ``obj`` has callable ``get_state`` and ``set_state``."""
    return callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))


class NotJSON(ValueError):
    """A state ``get_state`` returned that JSON cannot hold."""


def capture(obj: Any, name: str) -> dict[str, Any] | None:
    """``{"state": obj.get_state()}`` as JSON values; None (warned) when it cannot be saved."""
    try:
        return {STATE_KEY: encode(obj.get_state())}
    except NotJSON as e:
        _warn_once(f"resumable: not saving the state of {name}: get_state() returned {e}; return "
                   "dicts, lists, strings, numbers, booleans and None")
    except Exception as e:  # noqa: BLE001 - the user's method: one warning, training goes on
        _warn_once(f"resumable: not saving the state of {name}: get_state() raised {type(e).__name__}: {e}")
    return None


def restore(obj: Any, name: str, saved: Any) -> bool:
    """Call ``obj.set_state`` with what `capture` saved; False (warned) when it cannot."""
    if type(saved) is not dict or set(saved) != {STATE_KEY}:
        _skip(name, f"expected {{{STATE_KEY!r}: ...}}, got {_shown(saved)}")
        return False
    try:
        state = decode(saved[STATE_KEY])
    except NotJSON as e:
        _skip(name, str(e))
        return False
    try:
        obj.set_state(state)
    except Exception as e:  # noqa: BLE001 - the user's method: one warning, training goes on
        _skip(name, f"set_state() raised {type(e).__name__}: {e}")
        return False
    return True


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON values: NumPy scalars to numbers, non-finite floats tagged."""
    if depth > MAX_DEPTH:
        raise NotJSON(f"a value nested deeper than {MAX_DEPTH}")
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_FLOAT_TAG: repr(value)}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise NotJSON(f"a dict with a key that is not a string ({_shown(value)})")
        if set(value) == {_FLOAT_TAG}:
            raise NotJSON(f"a dict whose only key is {_FLOAT_TAG!r}, which resumable uses itself")
        return {k: encode(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v, depth + 1) for v in value]
    raise NotJSON(f"a {type(value).__name__} ({_shown(value)})")


def decode(value: Any, depth: int = 0) -> Any:
    """What `encode` wrote, back (as read from ``state.json``)."""
    if depth > MAX_DEPTH:
        raise NotJSON(f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        if set(value) == {_FLOAT_TAG}:
            text = value[_FLOAT_TAG]
            if text not in ("nan", "inf", "-inf"):
                raise NotJSON(f"{_shown(value)} is not a float resumable wrote")
            return float(text)
        return {k: decode(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v, depth + 1) for v in value]
    return value


def _skip(name: str, why: str) -> None:
    # as a stock callback's bad field is skipped (training_state.restore_callback_states)
    logger.warning("resumable: not restoring the state of %s: %s", printable(name), printable(why))


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """Once a session: states are captured at every save."""
    if message not in _warned:
        _warned.add(message)
        user_warnings.warn(printable(message))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["capture", "decode", "encode", "has_protocol", "restore"]
