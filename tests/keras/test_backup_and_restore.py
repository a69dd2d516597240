"""resumable.BackupAndRestore: Keras' behaviours in a plain fit, plus commits, fallback, gs://, kills."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import dropin_job

import resumable
from resumable import RunStorage
from resumable.cli.app import main as cli

keras = pytest.importorskip("keras")

X = np.random.default_rng(0).random((10, 3)).astype("float32")
Y = np.random.default_rng(1).random((10, 1)).astype("float32")


class Canary(keras.layers.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.counter = self.add_weight(shape=(), initializer="zeros", dtype="float32", trainable=False)

    def call(self, x: Any) -> Any:
        self.counter.assign_add(1)
        return x


class Interrupt(keras.callbacks.Callback):
    def __init__(self, epoch: int | None = None, batch: int | None = None) -> None:
        super().__init__()
        self.epoch, self.batch, self.epochs, self.batches = epoch, batch, 0, 0

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.epochs += 1
        if self.epochs == self.epoch:
            raise RuntimeError("interrupted")

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches += 1
        if self.batches == self.batch:
            raise RuntimeError("interrupted")


def make_model() -> Any:
    model = keras.Sequential([keras.Input((3,)), Canary(), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    return model


@pytest.mark.lanes
def test_arguments_as_keras(tmp_path: Path) -> None:
    for bad in ("", None):
        with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
            resumable.BackupAndRestore(bad)  # type: ignore[arg-type]
    for freq in ("batch", 0.15):
        with pytest.raises(ValueError, match="Invalid value"):
            resumable.BackupAndRestore(str(tmp_path), save_freq=freq)  # type: ignore[arg-type]


@pytest.mark.lanes
@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_plain_fit_continues_after_an_interruption(where: str, tmp_path: Path, request: Any) -> None:
    url = str(tmp_path / "backup") if where == "local" else request.getfixturevalue("gcs_bucket") + "/backup"
    model = make_model()
    cb = resumable.BackupAndRestore(url, double_checkpoint=True)
    with pytest.raises(RuntimeError):
        model.fit(X, Y, batch_size=4, epochs=6, callbacks=[cb, Interrupt(epoch=2)], verbose=0)
    assert cb._current_epoch == 2 and int(model.layers[0].counter.value) == 6
    cb.wait_for_uploads()  # Keras calls no on_train_end after an exception: the uploads go on
    assert [c.epoch for c in RunStorage(url).list()] == [1, 2]  # double_checkpoint keeps two
    history = model.fit(X, Y, batch_size=4, epochs=5, callbacks=[cb], verbose=0)
    assert history.epoch == [2, 3, 4] and int(model.layers[0].counter.value) == 15
    assert not RunStorage(url).list()  # deleted at the end of training


@pytest.mark.lanes
@pytest.mark.slow
def test_a_damaged_backup_falls_back_and_mid_epoch_replays(tmp_path: Path) -> None:
    url = str(tmp_path / "backup")
    model = make_model()
    cb = resumable.BackupAndRestore(url, save_freq=1, double_checkpoint=True)
    with pytest.raises(RuntimeError):
        model.fit(X, Y, batch_size=4, epochs=2, callbacks=[cb, Interrupt(batch=2)], verbose=0)
    assert (cb._current_epoch, cb._last_batch_seen) == (0, 1)
    Path(cb._weights_path).write_bytes(b"0")  # the newest backup (batch 2) damaged: batch 1 restores
    model.fit(X, Y, batch_size=4, epochs=1, callbacks=[cb], verbose=0)
    assert int(model.layers[0].counter.value) == 1 + 3  # restored after batch 1, epoch 1 replayed


@pytest.mark.lanes
@pytest.mark.slow
def test_resume_continues_a_mid_epoch_backup_at_its_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    url = str(tmp_path / "backup")
    model = make_model()
    cb = resumable.BackupAndRestore(url, save_freq=1)
    with pytest.raises(RuntimeError):
        model.fit(X, Y, batch_size=4, epochs=2, shuffle=False, callbacks=[cb, Interrupt(batch=2)], verbose=0)
    cb.wait_for_uploads()
    assert cli(["list", url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["checkpoints"][-1]["batch"] == 2 and listed["best"] is None  # mid-epoch: never "best"
    run = resumable.resume(url, build_model=make_model)
    assert run.callback.resume_batch == 2
    run.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert int(run.model.layers[0].counter.value) == 6  # 2 batches + the third + one epoch of 3


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_killed_mid_backup_restores_the_previous_one(where: str, tmp_path: Path, request: Any) -> None:
    url = str(tmp_path / "backup") if where == "local" else request.getfixturevalue("gcs_bucket") + "/backup"
    dropin_job("backup_and_restore", url, "--epochs", "4", "--kill-at-save", "2", killed=True)
    statuses = {c.name: c.status.value for c in RunStorage(url).list()}
    assert statuses.get("ckpt-000001") == "ok" and statuses.get("ckpt-000002") != "ok"
    out = dropin_job("backup_and_restore", url, "--epochs", "4")
    assert "EPOCHS 3 FIRST 1" in out  # continued after epoch 1
    assert out.count("no manifest (an interrupted save)") == 1  # the partial backup said once
