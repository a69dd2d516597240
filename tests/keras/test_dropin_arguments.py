"""Every public argument of the callbacks across its values: ModelCheckpoint and BackupAndRestore
next to Keras' own classes on TensorFlow and JAX (tests/jobs/dropin_grid_job.py), bad values
refused in one line, and CheckpointCallback's ``verbose`` and ``when_behind``."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from forked import job_env, run_job
from gated_fs import GatedFS
from paths import JOBS

import resumable

keras = pytest.importorskip("keras")

GRID_JOB = JOBS / "dropin_grid_job.py"


def grid_module() -> Any:
    spec = importlib.util.spec_from_file_location("dropin_grid_job", GRID_JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dropin_grid_job"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_argument_as_keras_on_tensorflow(tmp_path: Path) -> None:
    grid = grid_module()
    result = grid.run_grid(tmp_path)
    assert result["backend"] == "tensorflow"
    assert result["cases"] == len(grid.MODEL_CHECKPOINT_CASES) + len(grid.BACKUP_CASES) >= 19
    assert result["mismatches"] == []


@pytest.mark.slow
def test_every_argument_as_keras_on_jax(tmp_path: Path) -> None:
    done = run_job(GRID_JOB, [str(tmp_path / "grid")], env=job_env("jax", JAX_PLATFORMS="cpu"), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["backend"] == "jax" and result["cases"] >= 19
    assert result["mismatches"] == []


@pytest.mark.lanes
def test_verbose_checkpoints_print_as_keras(tmp_path: Path) -> None:
    """verbose=1 and "auto", with and without save_best_only: the lines Keras prints, on every lane
    (before Keras 3.10 resumable makes the save decision and prints its lines itself)."""
    grid = grid_module()
    assert {str(case.kwargs.get("verbose")) for case in grid.PRINTING_CASES} == {"1", "auto"}
    assert grid.run_printing_cases(tmp_path) == []


def test_every_value_is_checked_at_construction(tmp_path: Path) -> None:
    """Bad values: one ValueError naming the argument, before any training; good ones accepted."""
    file, folder = str(tmp_path / "m.keras"), str(tmp_path / "run")
    for verbose in (0, 1, "auto", True):
        resumable.ModelCheckpoint(file, verbose=verbose)
        resumable.BackupAndRestore(folder, verbose=verbose)
        resumable.CheckpointCallback(folder, verbose=verbose)
    assert resumable.ModelCheckpoint(file, verbose="auto").verbose == 1  # Keras' "verbose > 0" prints
    for when_behind in ("skip", "wait"):
        assert resumable.CheckpointCallback(folder, when_behind=when_behind).when_behind == when_behind
        backup = resumable.BackupAndRestore(folder, when_behind=when_behind)
        assert backup.manager.writer.uploader.when_behind == when_behind
    bad: list[tuple[Any, dict[str, Any], str]] = [
        (resumable.ModelCheckpoint, {"verbose": "loud"}, "`verbose`. Received: verbose='loud'"),
        (resumable.ModelCheckpoint, {"verbose": -1}, "`verbose`"),
        (resumable.ModelCheckpoint, {"keep_last": 0}, "`keep_last`"),
        (resumable.ModelCheckpoint, {"async_upload": "yes"}, "`async_upload`"),
        (resumable.ModelCheckpoint, {"save_freq": 2.5}, "Unrecognized save_freq"),  # Keras' own words
        (resumable.CheckpointCallback, {"verbose": "loud"}, "`verbose`"),
        (resumable.CheckpointCallback, {"when_behind": "later"},
         "`when_behind`. Received: when_behind='later'"),
        (resumable.BackupAndRestore, {"when_behind": None}, "`when_behind`"),
        (resumable.BackupAndRestore, {"verbose": 3.5}, "`verbose`"),
    ]
    for cls, kwargs, message in bad:
        target = file if cls is resumable.ModelCheckpoint else folder
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")) as caught:
            cls(target, **kwargs)
        assert "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()  # nothing written by any of them


def test_a_drive_path_without_drive_is_refused_at_construction() -> None:
    if os.path.ismount("/content/drive"):
        pytest.skip("Google Drive is mounted here")
    with pytest.raises(resumable.DriveNotMountedError, match="drive.mount"):
        resumable.ModelCheckpoint("/content/drive/MyDrive/model/weights-{epoch:02d}-{val_acc:.3f}.hdf5",
                                  monitor="val_acc", verbose=1, mode="max")
    assert not os.path.exists("/content/drive/MyDrive")


def _model() -> Any:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


class OpenGate(keras.callbacks.Callback):
    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def on_train_end(self, logs: Any = None) -> None:
        self.gate.set()


@pytest.mark.slow
@pytest.mark.parametrize("when_behind", ["skip", "wait"])
def test_a_skipped_checkpoint_is_said_once_and_wait_keeps_every_one(
        when_behind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Uploads held back (a slow Drive): with "skip", epochs 2 and 3 wait in turn and are replaced;
    one line each, the first saying why and what to pass. With "wait", training waits and every
    checkpoint lands."""
    x, y = np.zeros((4, 3), "float32"), np.zeros((4, 1), "float32")
    gate = threading.Event()
    cb = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", keep_last=None,
                                      staging_dir=tmp_path / "stage", when_behind=when_behind)
    cb.storage.fs = GatedFS(cb.storage.fs, gate)
    if when_behind == "wait":
        threading.Timer(2.0, gate.set).start()  # the third save waits for the first upload
    _model().fit(x, y, epochs=4, verbose=0, callbacks=[OpenGate(gate), cb])
    said = [line for line in capsys.readouterr().out.splitlines() if "not uploaded" in line]
    names = [c.name for c in cb.storage.list() if c.ok]
    if when_behind == "wait":
        assert said == [] and names == ["ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004"]
        return
    assert names == ["ckpt-000001", "ckpt-000004"]
    assert said == [
        "resumable: epoch 2 (ckpt-000002) not uploaded: the upload of ckpt-000001 was still running when "
        "epoch 3 was saved, so the newer ckpt-000003 took its place; pass when_behind='wait' to keep every "
        "checkpoint (training then waits for the uploads)",
        "resumable: epoch 3 (ckpt-000003) not uploaded either: replaced by the newer ckpt-000004",
    ]
