"""Keras 2 notebooks keep running with only the import changed: ``.h5``/``.hdf5`` files written
every epoch, the newest loaded back with ``resumable.load_model`` and trained on with
``fit(initial_epoch=N)``, optimizer state included (Keras 3's own loader drops it)."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from forked import run_job
from keras_helpers import same_state
from paths import JOBS

import resumable
from resumable.cli.app import main as cli

keras = pytest.importorskip("keras")

LEGACY_WARNING = "You are saving your model as an HDF5 file"


def session(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = run_job(JOBS / "article_job.py", [str(folder), *args])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_the_articles_notebook_resumes_across_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    folder = tmp_path / "model"
    first = session(folder, "--epochs", "3", "--reference", str(tmp_path / "ref.npz"),
                    "--reference-epochs", "5")
    for epoch in (1, 2, 3):  # verbose=1 prints Keras' two lines per save (it crashed after the first)
        assert f"Epoch {epoch}: saving model to {folder}/weights-0{epoch}-" in first.stdout
        assert f"Epoch {epoch}: finished saving model to {folder}/weights-0{epoch}-" in first.stdout
    assert first.stderr.count(LEGACY_WARNING) == 1  # three saves, Keras' warning once

    second = session(folder, "--epochs", "5", "--resume", "--dump", str(tmp_path / "out.npz"))
    assert second.stderr.count(LEGACY_WARNING) == 1
    assert "Unknown variable" not in second.stderr
    with np.load(tmp_path / "ref.npz") as ref, np.load(tmp_path / "out.npz") as out:
        assert all(np.array_equal(ref[k], out[k]) for k in ref.files)  # as if never stopped, bitwise
    assert "AFTER Adam 15" in second.stdout  # a .keras save after the .hdf5 ones keeps the optimizer

    names = sorted(p.name for p in folder.iterdir() if p.name.startswith("weights-"))
    assert [n[:10] for n in names] == [f"weights-0{e}" for e in range(1, 6)]
    capsys.readouterr()
    assert cli(["verify", str(folder)]) == 0
    assert "verified 5 files" in capsys.readouterr().out
    newest = resumable.load_model(folder / names[-1])
    assert int(np.asarray(newest.optimizer.iterations)) == 15  # 5 epochs of 3 batches


def _model(loss: str = "binary_crossentropy") -> Any:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss=loss, metrics=["accuracy"])
    return model


X = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
Y = (X[:, :1] > 0).astype("float32")


@pytest.mark.slow
def test_files_keras_wrote_load_with_their_optimizer_or_say_what_to_do(tmp_path: Path) -> None:
    trained = _model()
    trained.fit(X, Y, epochs=2, batch_size=4, verbose=0)
    plain = tmp_path / "keras.h5"
    keras.saving.save_model(trained, plain)
    assert "optimizer" not in trained.get_compile_config()  # Keras' own legacy save took it out
    with pytest.warns(UserWarning, match="no checksum record"):
        loaded = resumable.load_model(plain)
    assert same_state(loaded, trained)  # Keras' own loader builds the optimizer for no variable
    loaded.fit(X, Y, epochs=1, batch_size=4, verbose=0)  # Keras': "Unknown variable ..."

    mse = _model("mse")
    mse.fit(X, Y, epochs=1, batch_size=4, verbose=0)
    keras.saving.save_model(mse, tmp_path / "mse.h5")  # Keras 3 cannot compile it back ("keras.metrics.mse")
    with pytest.warns(UserWarning, match=r"cannot compile the model .* model.compile\(\.\.\.\) before fit"):
        uncompiled = resumable.load_model(tmp_path / "mse.h5")
    assert all(np.array_equal(a, b) for a, b in zip(uncompiled.get_weights(), mse.get_weights(), strict=True))

    resumable.save_model(mse, tmp_path / "ours.hdf5")  # written by resumable: compiled back, as it was
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = resumable.load_model(tmp_path / "ours.hdf5")
    assert same_state(back, mse) and back.get_compile_config()["loss"] == "mse"
    back.fit(X, Y, epochs=1, batch_size=4, verbose=0)
    assert mse.get_compile_config()["optimizer"]["class_name"] == "Adam"  # put back by resumable's save
    mse.save(tmp_path / "later.keras")
    assert type(keras.saving.load_model(tmp_path / "later.keras").optimizer).__name__ == "Adam"


class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x: Any) -> Any:
        return self.dense(x)

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError


@pytest.mark.slow
def test_a_subclassed_model_is_told_what_to_change_before_training(tmp_path: Path) -> None:
    model = Subclassed()
    model.compile(optimizer="adam", loss="mse")
    model(X)
    cb = resumable.ModelCheckpoint(str(tmp_path / "w-{epoch}.hdf5"), monitor="loss")
    with pytest.raises(ValueError, match="cannot hold Subclassed .* name the file .keras, or pass "
                                         "save_weights_only=True") as caught:
        model.fit(X, Y, epochs=1, verbose=0, callbacks=[cb])
    assert "\n" not in str(caught.value) and not list(tmp_path.iterdir())
    cb = resumable.ModelCheckpoint(str(tmp_path / "w-{epoch}.hdf5"), monitor="loss", save_weights_only=True)
    model.fit(X, Y, epochs=2, batch_size=4, verbose=0, callbacks=[cb])
    fresh = Subclassed()
    fresh.compile(optimizer="adam", loss="mse")
    fresh(X)
    resumable.load_weights(fresh, tmp_path / "w-2.hdf5")  # Keras 2's weights file, with Adam's state
    assert same_state(fresh, model)
