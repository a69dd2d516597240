"""What the Keras tests share: comparing weights, a small model, rewriting a committed file, and
running the drop-in job in a process of its own."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
from forked import run_job
from paths import JOBS

from resumable.core.checksum import crc32c_of_file
from resumable.core.manifest import MANIFEST_NAME
from resumable.storage import run_index


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


def small_model(dropout: float = 0.0) -> Any:
    """A compiled regression model on 8 features (Dense 4, Dense 1; Adam, mse), the same at each
    call; ``dropout`` puts a Dropout (a seed generator) between them."""
    import keras

    keras.utils.set_random_seed(3)
    middle = [keras.layers.Dropout(dropout)] if dropout else []
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), *middle,
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def replace_payload_file(run: Path, rel: str, data: bytes, name: str = "ckpt-000002") -> None:
    """Rewrite a committed file and its manifest entry, as a writer that controls both could."""
    (run / name / rel).write_bytes(data)
    manifest = json.loads((run / name / MANIFEST_NAME).read_text())
    manifest["files"][rel] = {"size": len(data), "crc32c": crc32c_of_file(run / name / rel)}
    (run / name / MANIFEST_NAME).write_text(json.dumps(manifest))
    (run / run_index.INDEX_NAME).unlink(missing_ok=True)  # the index recorded the old sizes
