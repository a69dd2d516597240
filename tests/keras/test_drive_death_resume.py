"""Runtime deaths on a Drive-like folder (tests/drive_death.py), resumed with `resumable.resume()`.

tests/storage/test_drive_death.py runs 240 trials through the Keras-free manager that
`resume()` chooses and downloads with; these trials go through `resume()` itself and check
the model it returns: the epoch it continues from and its weights, those saved at that epoch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from drive_death import MANIFEST, Tree, die, files_of, intact, snapshot, write_tree

import resumable

EPOCHS = 6
TRIALS = 16


def make_model() -> keras.Model:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


class Snapshots(keras.callbacks.Callback):
    """After each epoch's commit: the run folder, and the weights that epoch saved."""

    def __init__(self, root: Path, checkpoints: resumable.CheckpointCallback) -> None:
        super().__init__()
        self.root, self.checkpoints = root, checkpoints
        self.trees: list[Tree] = [{}]
        self.weights: dict[int, list[np.ndarray]] = {}

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.weights[epoch + 1] = [np.array(w) for w in self.model.get_weights()]

    # The checkpoint callback runs after the others at an epoch's end (it saves their state):
    # its commit is seen at the next epoch's start.
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if epoch:
            self.trees.append(snapshot(self.root))

    def on_train_end(self, logs: Any = None) -> None:
        self.trees.append(snapshot(self.root))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Snapshots, dict[str, Tree]]:
    base = tmp_path_factory.mktemp("drive-keras")
    root = base / "run"
    checkpoints = resumable.CheckpointCallback(str(root), monitor="loss", keep_last=3, keep_best=0,
                                               async_upload=False, staging_dir=base / "staging")
    snapshots = Snapshots(root, checkpoints)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    make_model().fit(x, x[:, :1], epochs=EPOCHS, batch_size=8, verbose=0, callbacks=[checkpoints, snapshots])
    committed: dict[str, Tree] = {}
    for epoch, tree in enumerate(snapshots.trees[1:], start=1):
        name = f"ckpt-{epoch:06d}"
        committed[name] = files_of(tree, name)
        assert MANIFEST in committed[name]
    return snapshots, committed


@pytest.mark.parametrize("trial", range(TRIALS))
def test_resume_continues_from_the_newest_intact_checkpoint(
        history: tuple[Snapshots, dict[str, Tree]], tmp_path: Path, trial: int) -> None:
    snapshots, committed = history
    rng = random.Random(500 + trial)
    died_in = rng.randint(1, EPOCHS)
    flushed = rng.randint(max(0, died_in - 2), died_in - 1)
    tree, fates = die(snapshots.trees[flushed], snapshots.trees[died_in], rng)
    write_tree(tmp_path / "run", tree)
    expected = intact(tree, committed)
    run = resumable.resume(str(tmp_path / "run"), build_model=make_model, monitor="loss",
                           staging_dir=tmp_path / "cache")
    if not expected:
        assert run.initial_epoch == 0, fates
        return
    epoch = int(expected[-1].removeprefix("ckpt-"))
    assert run.initial_epoch == epoch, fates
    for restored, saved in zip(run.model.get_weights(), snapshots.weights[epoch], strict=True):
        np.testing.assert_array_equal(restored, saved)
