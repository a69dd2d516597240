"""resume() across real process restarts: interrupted equals uninterrupted, and MirroredStrategy.

Each session is a process of its own running tests/jobs/train_job.py, as a Colab notebook
re-run after a disconnect: forked from a server that imported TensorFlow but never initialized
its devices, so MirroredStrategy's two logical CPUs can still be configured in it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from forked import run_job
from keras_helpers import assert_equal_weights, saved_weights
from paths import JOBS

from resumable import RunStorage

pytestmark = pytest.mark.slow

JOB = JOBS / "train_job.py"
STEPS_PER_EPOCH = 12  # 384 training samples, batch 32


def session(url: str | Path, epochs: int, *extra: str) -> str:
    """Run one training session in a process of its own; return its stdout."""
    done = run_job(JOB, [str(url), "--epochs", str(epochs), *extra])
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


def ready_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("READY"))


@pytest.mark.parametrize("order", [pytest.param([], id="fixed-order"),
                                   pytest.param(["--shuffle"], id="fit-shuffles", marks=pytest.mark.lanes)])
def test_interrupted_equals_uninterrupted(tmp_path: Path, order: list[str]) -> None:
    session(tmp_path / "straight", 6, *order, "--out", str(tmp_path / "straight.npz"))

    first = session(tmp_path / "resumed", 3, *order)
    second = session(tmp_path / "resumed", 6, *order, "--out", str(tmp_path / "resumed.npz"))

    assert ready_line(first) == "READY initial_epoch=0 step=0"
    assert ready_line(second) == f"READY initial_epoch=3 step={3 * STEPS_PER_EPOCH}"
    assert "saving ckpt-000004" in second and "saving ckpt-000003" not in second
    assert_equal_weights(saved_weights(tmp_path / "resumed.npz"), saved_weights(tmp_path / "straight.npz"))


def test_a_finished_run_does_not_train_again(tmp_path: Path) -> None:
    session(tmp_path / "run", 2, "--out", str(tmp_path / "a.npz"))
    again = session(tmp_path / "run", 2, "--out", str(tmp_path / "b.npz"))

    assert "complete: 2 of 2 epochs done" in again
    assert "saving" not in again
    assert_equal_weights(saved_weights(tmp_path / "a.npz"), saved_weights(tmp_path / "b.npz"))


def test_weights_only_checkpoints_resume_exactly(tmp_path: Path) -> None:
    session(tmp_path / "straight", 4, "--out", str(tmp_path / "straight.npz"))
    session(tmp_path / "run", 2, "--weights-only")
    session(tmp_path / "run", 4, "--weights-only", "--out", str(tmp_path / "resumed.npz"))

    files = RunStorage(str(tmp_path / "run")).latest().manifest.files  # type: ignore[union-attr]
    assert "model.weights.h5" in files and "model.keras" not in files
    assert_equal_weights(saved_weights(tmp_path / "resumed.npz"), saved_weights(tmp_path / "straight.npz"))


@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
                    reason="tf.distribute needs the TensorFlow backend")
def test_mirrored_strategy_save_resume_and_across(tmp_path: Path) -> None:
    url = tmp_path / "run"
    # saved under MirroredStrategy over two logical CPUs
    first = session(url, 2, "--strategy", "mirrored", "--out", str(tmp_path / "w2.npz"))
    assert "saving ckpt-000002" in first and "REPLICAS 2" in first
    # resumed under it: the restored weights are exactly the saved ones, the step continues
    second = session(url, 3, "--strategy", "mirrored", "--restored-out", str(tmp_path / "r2.npz"),
                     "--out", str(tmp_path / "w3.npz"))
    assert ready_line(second) == f"READY initial_epoch=2 step={2 * STEPS_PER_EPOCH}"
    assert_equal_weights(saved_weights(tmp_path / "r2.npz"), saved_weights(tmp_path / "w2.npz"))
    # across: strategy to plain
    third = session(url, 4, "--restored-out", str(tmp_path / "r3.npz"), "--out", str(tmp_path / "w4.npz"))
    assert ready_line(third) == f"READY initial_epoch=3 step={3 * STEPS_PER_EPOCH}"
    assert_equal_weights(saved_weights(tmp_path / "r3.npz"), saved_weights(tmp_path / "w3.npz"))
    # and back: plain to strategy
    fourth = session(url, 5, "--strategy", "mirrored", "--restored-out", str(tmp_path / "r4.npz"))
    assert ready_line(fourth) == f"READY initial_epoch=4 step={4 * STEPS_PER_EPOCH}"
    assert_equal_weights(saved_weights(tmp_path / "r4.npz"), saved_weights(tmp_path / "w4.npz"))
    latest = RunStorage(str(url)).latest()
    assert latest is not None and latest.epoch == 5 and latest.step == 5 * STEPS_PER_EPOCH
