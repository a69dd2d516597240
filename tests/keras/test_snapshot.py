"""Checkpoints taken as snapshots in memory and written later (resumable/keras/snapshot.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from forked import job_env, run_job
from paths import JOBS

import resumable
from resumable.keras import keras_io, snapshot

JOB = JOBS / "snapshot_job.py"


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
@pytest.mark.parametrize("weights_only", [False, True])
def test_the_files_hold_the_step_the_snapshot_was_taken_at(tmp_path: Path, backend: str,
                                                          weights_only: bool) -> None:
    """On JAX the next training step donates the variables' buffers: the snapshot copied them."""
    argv = [str(tmp_path / "ckpt"), *(["--weights-only"] if weights_only else [])]
    done = run_job(JOB, argv, env=job_env(backend), cwd=JOBS)
    assert done.returncode == 0 and "EQUAL" in done.stdout, done.stdout + done.stderr[-2000:]


def make_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.lanes
def test_a_snapshot_writes_what_model_save_writes(tmp_path: Path) -> None:
    model = make_model()
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    model.fit(x, x[:, :1], epochs=1, verbose=0)
    model.save(tmp_path / "plain.keras")
    taken = keras_io.snapshot(model, weights_only=False, state={})
    assert taken is not None and taken.nbytes > 0
    taken.write(tmp_path / "snap")
    ours = keras.saving.load_model(tmp_path / "snap" / "model.keras")
    theirs = keras.saving.load_model(tmp_path / "plain.keras")
    assert ours.get_config() == theirs.get_config()
    for a, b in zip(ours.weights + ours.optimizer.variables, theirs.weights + theirs.optimizer.variables,
                    strict=True):
        assert a.path == b.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_training_waits_only_for_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are written in the uploader's thread, never in the training thread."""
    writers: list[str] = []
    original = snapshot.ModelSnapshot.write

    def write(self: snapshot.ModelSnapshot, folder: Path) -> None:
        writers.append(threading.current_thread().name)
        original(self, folder)

    monkeypatch.setattr(snapshot.ModelSnapshot, "write", write)
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    callback = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", keep_last=None,
                                            staging_dir=tmp_path / "staging")
    make_model().fit(x, x[:, :1], epochs=3, verbose=0, callbacks=[callback])
    assert writers and set(writers) == {"resumable-uploader"}
    good = [c.name for c in resumable.RunStorage(str(tmp_path / "run")).list() if c.ok]
    assert good[-1] == "ckpt-000003" and len(good) == len(writers)  # a replaced snapshot is never written


def test_a_failed_background_write_is_reported_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           recwarn: Any) -> None:
    failures = [OSError(28, "No space left on device")]  # the staging disk is full once
    original = snapshot.ModelSnapshot.write

    def write(self: snapshot.ModelSnapshot, folder: Path) -> None:
        if failures:
            raise failures.pop()
        original(self, folder)

    monkeypatch.setattr(snapshot.ModelSnapshot, "write", write)
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    callback = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", keep_last=None,
                                            staging_dir=tmp_path / "staging")
    make_model().fit(x, x[:, :1], epochs=3, verbose=0, callbacks=[callback])
    messages = [str(w.message) for w in recwarn if "resumable:" in str(w.message)]
    assert any("save of ckpt-000001 failed" in m and "no space left in the staging folder" in m
               for m in messages), messages
    good = [c.name for c in resumable.RunStorage(str(tmp_path / "run")).list() if c.ok]
    assert good[-1] == "ckpt-000003"  # the next saves went on; the failed one was retried or superseded
