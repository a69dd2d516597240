"""What the Keras tests share: comparing weights, and running the drop-in job in a process of its own."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np
from forked import run_job
from paths import JOBS


def same_weights(a: Any, b: Any) -> bool:
    """Whether two models hold bitwise-equal weights."""
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


def same_state(a: Any, b: Any) -> bool:
    """Whether two models hold bitwise-equal weights and optimizer variables."""
    sa, sb = _state(a), _state(b)
    return len(sa) == len(sb) and all(np.array_equal(x, y) for x, y in zip(sa, sb, strict=True))


def _state(model: Any) -> list[np.ndarray]:
    return [np.asarray(v) for v in (*model.weights, *model.optimizer.variables)]


def saved_weights(path: Path) -> list[np.ndarray]:
    """The weights a job wrote with ``np.savez(path, *model.get_weights())``, in order."""
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def assert_equal_weights(a: list[np.ndarray], b: list[np.ndarray], what: str = "") -> None:
    """Bitwise equal, weight by weight; ``what`` starts the message of a difference."""
    prefix = f"{what}: " if what else ""
    assert len(a) == len(b), f"{prefix}{len(a)} weights, {len(b)} weights"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert np.array_equal(x, y), f"{prefix}weight {i} differs by up to {np.abs(x - y).max()}"


def dropin_job(kind: str, url: str, *extra: str, killed: bool = False) -> str:
    """Run tests/jobs/dropin_job.py; its stdout, then its stderr (warnings, Keras' logs)."""
    done = run_job(JOBS / "dropin_job.py", [kind, url, *extra])
    if killed:
        assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr[-3000:]
    else:
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout + done.stderr
