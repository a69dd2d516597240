"""The local tier's switch and its saves in one process (#55); the kills are in test_local_tier_crash.py."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
from keras_helpers import same_weights

import resumable
from resumable import RunStorage
from resumable.keras import topology
from resumable.keras.callback import local_tier
from resumable.keras.checkpoint import model_to_files
from resumable.manager import tiers


def build() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = X[:, :1]


@pytest.mark.parametrize("value", ["yes", 1, {"every_seconds": 5}])
def test_a_bad_local_tier_is_one_line_before_anything_is_written(tmp_path: Path, value: object) -> None:
    with pytest.raises(ValueError, match="local_tier") as raised:
        resumable.CheckpointCallback(str(tmp_path / "run"), local_tier=value)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="local_tier"):
        resumable.resume(str(tmp_path / "run"), build, local_tier=value)
    assert not (tmp_path / "run").exists()


def test_the_option_reads_back_and_off_writes_no_run_id(tmp_path: Path) -> None:
    on = resumable.CheckpointCallback(str(tmp_path / "a"), local_tier=True)
    assert on.local_tier == resumable.LocalTier()
    cb = resumable.CheckpointCallback(str(tmp_path / "b"), monitor="loss")
    assert cb.local_tier is None
    build().fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    assert not (tmp_path / "b" / "run.json").exists()  # users who do not turn it on: nothing changes


def test_a_fit_saves_the_local_tier_between_the_durable_saves(tmp_path: Path) -> None:
    tier = resumable.LocalTier(folder=tmp_path / "local", every_steps=3, every_seconds=None)
    cb = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", local_tier=tier)
    build().fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    local = RunStorage(str(tmp_path / "local" / run_id))
    assert tiers.read_run_id(local) == run_id
    saved = local.list()
    assert saved and all(c.ok for c in saved) and len(saved) <= 2  # keep=1: its newest (and one in flight)
    assert saved[-1].step == 15 and saved[-1].manifest is not None and saved[-1].manifest.batch == 7
    durable_steps = {c.step for c in RunStorage(str(tmp_path / "run")).list()}
    assert durable_steps == {8, 16}  # the durable tier's schedule, unchanged
    assert not (tmp_path / "local" / run_id / "lease.json").exists()  # given back at the end of fit


def test_a_durable_save_the_local_tier_is_due_at_is_written_to_both_from_one_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 batches an epoch and a local save every 8 steps: due at each epoch end, where the durable
    tier saves. The local tier writes the durable save's snapshot (no second copy in memory, no save
    a batch later), and holds the epoch end while its upload may still be in flight."""
    taken: list[object] = []
    take = model_to_files.snapshot

    def counted(*args: object, **kwargs: object) -> object:
        taken.append(take(*args, **kwargs))  # type: ignore[arg-type]
        return taken[-1]

    monkeypatch.setattr(model_to_files, "snapshot", counted)
    tier = resumable.LocalTier(folder=tmp_path / "local", every_steps=8, every_seconds=None, keep=2)
    cb = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", local_tier=tier)
    model = build()
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    durable = RunStorage(str(tmp_path / "run")).list()
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    local = RunStorage(str(tmp_path / "local" / run_id)).list()
    assert [c.step for c in durable] == [8, 16]
    assert len(taken) == 2, "one snapshot per step saved, whichever tiers write it"
    assert [(c.name, c.step, c.ok) for c in local] == [(c.name, c.step, True) for c in durable]
    for here, there in zip(local, durable, strict=True):
        a = keras.saving.load_model(str(tmp_path / "local" / run_id / here.name / "model.keras"))
        b = keras.saving.load_model(str(tmp_path / "run" / there.name / "model.keras"))
        assert same_weights(a, b)
    assert same_weights(a, model)
    # no builder holds a snapshot after its save: the local tier's own saves keep none to share
    assert cb.builder.take_shared() is None and cb.local_saves.builder.take_shared() is None


def test_a_local_tier_that_cannot_be_written_is_one_warning_and_training_goes_on(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    tier = resumable.LocalTier(folder=blocked, every_steps=2, every_seconds=None)
    cb = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", local_tier=tier)
    with pytest.warns(UserWarning, match="the local tier in .* is off for this session") as warned:
        build().fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    assert len([w for w in warned if "local tier" in str(w.message)]) == 1
    assert [c.epoch for c in RunStorage(str(tmp_path / "run")).list()] == [1, 2]


def test_a_job_of_several_processes_says_its_local_tier_is_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # This process reports itself one of two (a job split across hosts): only the count is patched.
    monkeypatch.setattr(topology, "topology", lambda model, strategy=None: (2, 1))
    tier = resumable.LocalTier(folder=tmp_path / "local", every_steps=2, every_seconds=None)
    cb = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", local_tier=tier)
    build().fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    assert local_tier.SPLIT_JOB_LINE in capsys.readouterr().out
    assert not (tmp_path / "local").exists()


class RaiseAtStep(keras.callbacks.Callback):
    """Raises RuntimeError at the end of one optimizer step, once; counts the batches trained."""

    def __init__(self, step: int | None) -> None:
        super().__init__()
        self.step, self.batches = step, 0

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.batches += 1
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            self.step = None
            raise RuntimeError("boom from another callback")


def test_run_fit_after_an_exception_continues_from_a_newer_local_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = build()
    plain.fit(X, Y, batch_size=8, epochs=3, verbose=0)  # 8 steps an epoch, shuffled

    tier = resumable.LocalTier(folder=tmp_path / "local", every_steps=3, every_seconds=None)
    run = resumable.resume(str(tmp_path / "run"), build, monitor="loss", local_tier=tier)
    with pytest.raises(RuntimeError, match="boom"):  # at step 14: the local tier saved step 12, the durable 8
        run.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[RaiseAtStep(14)])
    assert [c.step for c in RunStorage(str(tmp_path / "run")).list()] == [8]
    capsys.readouterr()

    counted = RaiseAtStep(None)
    run.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[counted])

    out = capsys.readouterr().out
    assert "resumable: resuming from the local tier: ckpt-000001-step-000000012 (epoch 2, batch 4)" in out
    assert "continuing from" in out and "step 12)" in out
    assert counted.batches == 24 - 12  # no batch trained twice, none skipped
    assert int(run.model.optimizer.iterations.numpy()) == 24
    assert same_weights(run.model, plain)
    assert run.history["loss"] == plain.history.history["loss"]
