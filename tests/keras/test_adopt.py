"""`resume()` adopts the files a folder holds before its first checkpoint: Keras ModelCheckpoint
files (epoch from the name), `resumable.ModelCheckpoint` files (epoch from their checked
records) and a Keras BackupAndRestore backup; `load_newest_model` does the same for a template.

Each continues as plain Keras continues from the same file (bitwise), says one line, and leaves
the adopted files byte for byte as they were.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import same_state, small_model

import resumable
from resumable.cli.app import main
from resumable.core.errors import CheckpointNotFoundError

keras = pytest.importorskip("keras")

pytestmark = pytest.mark.slow  # `lanes` on the cases that reach what each Keras writes and loads

X = np.random.default_rng(0).random((32, 8), dtype=np.float32)
Y = np.random.default_rng(1).random((32, 1), dtype=np.float32)
FIT = {"batch_size": 8, "verbose": 0}


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but the run's own checkpoints, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.relative_to(folder).parts[0].startswith(("ckpt-", "index.json"))}


def train(epochs: int, callbacks: list[Any], **kwargs: Any) -> Any:
    model = small_model()
    keras.utils.set_random_seed(11)
    model.fit(X, Y, epochs=epochs, callbacks=callbacks, **FIT, **kwargs)
    return model


def continued(model: Any, initial_epoch: int, epochs: int) -> Any:
    """Plain Keras from a loaded model: ``fit(initial_epoch=...)``, the data order seeded as run.fit's."""
    keras.utils.set_random_seed(12)
    model.fit(X, Y, epochs=epochs, initial_epoch=initial_epoch, **FIT)
    return model


def resumed(folder: Path, epochs: int, capsys: pytest.CaptureFixture[str], **kwargs: Any) -> tuple[Any, str]:
    """resume() + run.fit to ``epochs``; the model and what resume() said on stderr."""
    run = resumable.resume(str(folder), monitor="loss", **kwargs)
    said = capsys.readouterr().err
    keras.utils.set_random_seed(12)
    run.fit(X, Y, epochs=epochs, **FIT)
    return run, said


def cli_lines(command: str, folder: Path, code: int = 0) -> str:
    """What `resumable COMMAND folder` prints, checking its exit code."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main([command, str(folder)]) == code
    return out.getvalue()


def adopted_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "resumable: adopted" in line]


@pytest.mark.lanes
@pytest.mark.parametrize("build", [True, False], ids=["build_model", "the-file's-model"])
def test_keras_modelcheckpoint_files_continue_as_plain_keras(tmp_path: Path, build: bool,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck"
    train(3, [keras.callbacks.ModelCheckpoint(str(folder / "w-{epoch:02d}-{loss:.3f}.keras"))])
    before = files_of(folder)
    newest = next(n for n in before if n.startswith("w-03-"))
    expected = continued(keras.saving.load_model(folder / newest), 3, 5)
    listed = cli_lines("list", folder)  # what `resumable list` names is what resume() adopts
    assert f"{newest} (a Keras ModelCheckpoint file, epoch 3)" in listed, listed

    run, said = resumed(folder, 5, capsys, **({"build_model": small_model} if build else {}))

    lines = adopted_lines(said)
    assert len(lines) == 1 and f"adopted {newest}" in lines[0] and "epoch 3" in lines[0], said
    assert "continues at epoch 4" in lines[0] and "data order" in lines[0], lines
    assert run.initial_epoch == 5
    assert same_state(run.model, expected)
    assert files_of(folder) == before  # never modified, never deleted
    again = resumable.resume(str(folder), build_model=small_model, monitor="loss")  # its checkpoint wins
    assert again.checkpoint is not None and again.checkpoint.name == "ckpt-000005"
    assert again.initial_epoch == 5 and len(again.history["loss"]) == 5


@pytest.mark.lanes
def test_weights_files_need_build_model_and_retention_leaves_them(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck"
    train(2, [keras.callbacks.ModelCheckpoint(str(folder / "epoch{epoch}.weights.h5"),
                                              save_weights_only=True)])
    before = files_of(folder)
    expected = small_model()
    expected.optimizer.build(expected.trainable_variables)
    expected.load_weights(folder / "epoch2.weights.h5")
    continued(expected, 2, 4)

    with pytest.raises(CheckpointNotFoundError, match="hold weights only: pass build_model="):
        resumable.resume(str(folder))  # weights alone: no model to put them in
    capsys.readouterr()
    run, said = resumed(folder, 4, capsys, build_model=small_model, keep_last=1, keep_best=0)

    assert "adopted epoch2.weights.h5" in said, said
    assert same_state(run.model, expected)
    assert files_of(folder) == before
    assert sorted(p.name for p in folder.glob("ckpt-*")) == ["ckpt-000004"]


@pytest.mark.lanes
def test_a_damaged_newest_resumable_file_is_skipped_with_one_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck"
    train(3, [resumable.ModelCheckpoint(str(folder / "w-{epoch:02d}.keras"), monitor="loss")])
    newest = folder / "w-03.keras"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum tells
    newest.write_bytes(bytes(data))
    before = files_of(folder)
    expected = continued(resumable.load_model(folder / "w-02.keras"), 2, 4)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run, said = resumed(folder, 4, capsys, build_model=small_model)

    skipped = [str(w.message) for w in caught if "skipped, the next older" in str(w.message)]
    assert len(skipped) == 1 and "w-03.keras" in skipped[0], skipped
    assert "adopted w-02.keras (a resumable.ModelCheckpoint file, epoch 2)" in said, said
    assert same_state(run.model, expected)
    assert files_of(folder) == before


def test_load_newest_model_of_a_template(tmp_path: Path) -> None:
    template = str(tmp_path / "ck" / "weights-{epoch:02d}-{loss:.3f}.keras")
    train(3, [resumable.ModelCheckpoint(template, monitor="loss")])
    (tmp_path / "ck" / "other-09.keras").write_bytes(b"not this template's")
    newest = next((tmp_path / "ck").glob("weights-03-*.keras"))
    newest.write_bytes(newest.read_bytes()[:-10])  # cut short

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, initial_epoch = resumable.load_newest_model(template)

    assert initial_epoch == 2
    skipped = [str(w.message) for w in caught if "skipped, the next older" in str(w.message)]
    assert len(skipped) == 1 and newest.name in skipped[0], skipped
    assert same_state(model, resumable.load_model(next((tmp_path / "ck").glob("weights-02-*.keras"))))


class _Stop(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if epoch == 3:
            raise RuntimeError("the runtime went away")


@pytest.mark.lanes
def test_a_keras_backup_continues_at_its_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backup = tmp_path / "backup"
    with pytest.raises(RuntimeError):
        train(5, [keras.callbacks.BackupAndRestore(str(backup), double_checkpoint=True), _Stop()])
    before = files_of(backup)
    assert {"latest.weights.h5", "training_metadata.json"} <= set(before)
    # what Keras' own BackupAndRestore does in the next session
    expected = small_model()
    expected.optimizer.build(expected.trainable_variables)
    expected.load_weights(backup / "latest.weights.h5")
    continued(expected, 3, 5)
    listed = cli_lines("list", backup)  # what `resumable list` names is what resume() adopts
    assert "latest.weights.h5 (a Keras BackupAndRestore backup, epoch 3)" in listed, listed
    assert "nothing to verify" in cli_lines("verify", backup, code=0)

    run, said = resumed(backup, 5, capsys, build_model=small_model)

    line = adopted_lines(said)
    assert len(line) == 1, said
    assert "adopted latest.weights.h5 (a keras.callbacks.BackupAndRestore backup, epoch 3)" in line[0]
    assert same_state(run.model, expected)
    assert files_of(backup) == before


def test_a_name_without_an_epoch_is_said_not_guessed(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    train(2, [keras.callbacks.ModelCheckpoint(str(folder / "best.keras"), monitor="loss",
                                              save_best_only=True)])
    with pytest.raises(CheckpointNotFoundError, match=re.escape("best.keras carries no epoch in its name")):
        resumable.resume(str(folder), build_model=small_model)
    assert not list(folder.glob("ckpt-*"))


@pytest.mark.lanes
def test_a_folder_of_files_none_of_which_loads_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "w-01.keras").write_bytes(b"not a zip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointNotFoundError, match="none of its 1 model files can be continued from"):
            resumable.resume(str(folder), build_model=small_model)
    assert len([w for w in caught if "skipped, the next older" in str(w.message)]) == 1


class _RaiseOnce(keras.callbacks.Callback):
    raised = False

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch == 1 and not _RaiseOnce.raised:
            _RaiseOnce.raised = True
            raise RuntimeError("a bug in a callback")


def test_an_exception_before_the_first_checkpoint_goes_back_to_the_adopted_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck"
    train(3, [keras.callbacks.ModelCheckpoint(str(folder / "w-{epoch:02d}.keras"))])
    expected = keras.saving.load_model(folder / "w-03.keras")
    expected.fit(X, Y, epochs=5, initial_epoch=3, shuffle=False, **FIT)  # build_model reseeds: no shuffle
    run = resumable.resume(str(folder), build_model=small_model, monitor="loss")
    with pytest.raises(RuntimeError):
        run.fit(X, Y, epochs=5, callbacks=[_RaiseOnce()], shuffle=False, **FIT)
    capsys.readouterr()
    run.fit(X, Y, epochs=5, shuffle=False, **FIT)
    assert "continuing from w-03.keras again (epoch 3)" in capsys.readouterr().out
    assert run.initial_epoch == 5 and same_state(run.model, expected)


@pytest.mark.lanes
def test_legacy_h5_files_keras_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    model = small_model()
    name = "weights.{:02d}-{:.2f}.h5"  # a Keras 2 notebook's names, in Keras' legacy HDF5 format
    saves = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: model.save(folder / name.format(epoch + 1, logs["loss"])))
    keras.utils.set_random_seed(11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, Y, epochs=2, callbacks=[saves], **FIT)
    before = files_of(folder)
    newest = next(folder.glob("weights.02-*.h5"))
    expected = small_model()
    resumable.load_weights(expected, newest)  # with its optimizer state

    with warnings.catch_warnings():  # Keras 3 cannot compile a Keras-written .h5 of loss="mse"
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointNotFoundError, match="none of its 2 model files"):
            resumable.resume(str(folder), monitor="loss")
    capsys.readouterr()
    run = resumable.resume(str(folder), build_model=small_model, monitor="loss")

    said = capsys.readouterr().err
    assert f"adopted {newest.name} (a keras.callbacks.ModelCheckpoint file, epoch 2)" in said, said
    assert run.initial_epoch == 2 and same_state(run.model, expected)
    assert files_of(folder) == before


def test_save_model_files_take_the_epoch_from_their_name(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "models"
    model = train(2, [])
    resumable.save_model(model, folder / "model-epoch2.keras")  # its record is checked; it has no epoch
    resumable.save_model(model, folder / "final.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = resumable.resume(str(folder), build_model=small_model)
    assert "adopted model-epoch2.keras (a resumable.save_model file, epoch 2)" in capsys.readouterr().err
    undated = [str(w.message) for w in caught if "carries no epoch" in str(w.message)]
    assert len(undated) == 1 and "final.keras" in undated[0], undated
    assert run.initial_epoch == 2 and same_state(run.model, model)
