"""Probes of Keras' saving internals: round trips of a tiny saveable (``keras.src.saving.
keras_saveable.KerasSaveable``) that change nothing of the user's session, each run once; what
fails is said once in one line, with what falls back to what."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import keras
import numpy as np

from resumable.keras.compat.messages import warn_once
from resumable.keras.compat.saving_lib import keras_saving_lib


def _differs(what: str, detail: str) -> str:
    """One line: this Keras' ``what`` does not behave as resumable needs, and how."""
    return f"resumable: {what} in Keras {keras.__version__} does not behave as resumable needs ({detail})"


def probe_class() -> Any:
    """A KerasSaveable holding plain arrays (float32 and bfloat16) in its own group and in a
    named child's: what ``_save_state`` and ``_load_state`` walk in a model, with no variables,
    no layer names taken and no random draws, so probing changes nothing of the user's session."""
    import ml_dtypes
    from keras.src.saving.keras_saveable import KerasSaveable

    class Probe(KerasSaveable):
        def __init__(self, name: str, held: list[np.ndarray], inner: Any = None) -> None:
            self.name = name
            self.held = held
            self.inner = inner

        def _obj_type(self) -> str:
            return "Loss"  # one Keras knows; a Loss has none of the probe's attributes but `name`

        def save_own_variables(self, store: Any) -> None:
            for i, value in enumerate(self.held):
                store[str(i)] = value

        def load_own_variables(self, store: Any) -> None:
            if len(store.keys()) != len(self.held):
                raise ValueError(f"{len(store.keys())} values read, {len(self.held)} written")
            self.held = [np.array(store[str(i)]) for i in range(len(self.held))]

        @classmethod
        def pair(cls, fill: float | None = None) -> Any:
            """Two groups: 3 values of 64 bytes in the root (shards of 100 bytes split it), 1 in ``inner``."""
            def value(i: int, dtype: Any = np.float32) -> np.ndarray:
                return np.full(16 if dtype == np.float32 else 32, i + 0.5 if fill is None else fill, dtype)
            root = [value(0), value(1), value(2, ml_dtypes.bfloat16)]
            return cls("resumable_probe", root, cls("resumable_probe_inner", [value(3)]))

        def same(self, other: Any) -> bool:
            mine, theirs = [*self.held, *self.inner.held], [*other.held, *other.inner.held]
            return len(mine) == len(theirs) and all(
                a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(mine, theirs, strict=True))

    return Probe


def probe(what: str, then: str, check: Callable[[ModuleType, Path], str | None]) -> bool:
    """Run ``check`` once in a temporary folder: True when it finds nothing wrong; otherwise
    say once, naming the Keras version, what falls back to what."""
    saving_lib = keras_saving_lib()
    if saving_lib is None:
        return False
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="resumable-probe-") as folder:
            problem = check(saving_lib, Path(folder))
    except Exception as e:  # noqa: BLE001 - anything unexpected is what the probe looks for
        problem = f"{type(e).__name__}: {e}"
    if problem is None:
        return True
    problem = " ".join(problem.split())  # Keras' messages span lines: one line, and short
    warn_once(f"{_differs(what, problem if len(problem) <= 200 else problem[:197] + '...')}; {then}")
    return False
