"""restore_checkpoint: resume(), a Run rolled back after an exception and BackupAndRestore read a
checkpoint's state.json and arrays.npz once each (the check, the load and the callback's restore
share them), and still restore it whole."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import backends
import numpy as np
import pytest
from keras_helpers import same_weights, small_model

import resumable
from resumable.keras.checkpoint import checkpoint_reading, state_file

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(96, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
FIT = {"batch_size": 32, "shuffle": False, "verbose": 0}  # 3 steps an epoch


@pytest.fixture(autouse=True, scope="module")
def deterministic_ops() -> None:
    backends.deterministic_ops()


def make_model() -> Any:
    """Dropout: a seed generator, so every checkpoint holds an arrays.npz."""
    return small_model(dropout=0.3)


class RaiseAtStep4(keras.callbacks.Callback):
    """An exception in epoch 2, one step after its first checkpoint (epoch 1's end)."""

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if int(self.model.optimizer.iterations.numpy()) == 4:
            raise RuntimeError("boom")


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often a state.json is parsed (each parse is checked: `state_file.check_state`) and an
    arrays.npz read (`checkpoint_reading.read_npz`, named by its folder) from now on."""
    reads: Counter[str] = Counter()
    check_state, read_npz = state_file.check_state, checkpoint_reading.read_npz

    def counted_check(state: Any) -> None:
        reads["state.json"] += 1
        check_state(state)

    def counted_read(path: Path, *args: Any) -> Any:
        reads[f"{path.parent.name}/{path.name}"] += 1
        return read_npz(path, *args)

    monkeypatch.setattr(state_file, "check_state", counted_check)
    monkeypatch.setattr(checkpoint_reading, "read_npz", counted_read)
    return reads


def once(name: str) -> Counter[str]:
    return Counter({"state.json": 1, f"{name}/arrays.npz": 1})


def test_resume_reads_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "run")
    first = resumable.resume(url, build_model=make_model)
    first.fit(X, Y, epochs=2, **FIT)

    reads = counted_reads(monkeypatch)
    run = resumable.resume(url, build_model=make_model)

    assert reads == once("ckpt-000002")
    assert run.initial_epoch == 2 and run.history == first.history
    assert same_weights(run.model, first.model)


def test_a_warning_of_the_restore_names_the_line_calling_resume(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=make_model, monitor="val_loss").fit(X, Y, epochs=1, **FIT)
    with pytest.warns(UserWarning, match="tracked the best 'val_loss'") as caught:
        resumable.resume(url, build_model=make_model, monitor="loss")
    assert [w.filename for w in caught if "tracked the best" in str(w.message)] == [__file__]


def test_a_rolled_back_run_reads_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = resumable.resume(str(tmp_path / "run"), build_model=make_model)
    with pytest.raises(RuntimeError, match="boom"):
        run.fit(X, Y, epochs=2, callbacks=[RaiseAtStep4()], **FIT)

    reads = counted_reads(monkeypatch)
    run._roll_back_if_ahead()  # what the next run.fit does first

    assert reads == once("ckpt-000001")
    assert int(run.model.optimizer.iterations.numpy()) == 3 and run.callback.epochs_done == 1


def test_backup_and_restore_reads_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "backup")
    straight = make_model()
    straight.fit(X, Y, epochs=2, **FIT)
    with pytest.raises(RuntimeError, match="boom"):  # a finished fit deletes its backup: interrupt it
        make_model().fit(X, Y, epochs=2, callbacks=[resumable.BackupAndRestore(url), RaiseAtStep4()], **FIT)

    reads = counted_reads(monkeypatch)
    model = make_model()
    callback = resumable.BackupAndRestore(url)
    model.fit(X, Y, epochs=2, callbacks=[callback], **FIT)  # epoch 1's backup restored, epoch 2 trained

    assert reads == once("ckpt-000001")
    assert same_weights(model, straight)
