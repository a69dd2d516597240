"""`resume()` adopts the steps Keras' `OrbaxCheckpoint` wrote: the newest good step, at its epoch,
with its weights and optimizer state, as the model that wrote it would continue under plain
`model.fit`; the step folders left byte for byte as they were. Skipped where orbax-checkpoint is
not installed (`pip install orbax-checkpoint`); its absence is tested either way.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import same_state, small_model
from test_adopt import FIT, X, Y, adopted_lines, continued, files_of, resumed

import resumable
from resumable.core.errors import CheckpointNotFoundError

keras = pytest.importorskip("keras")

pytestmark = pytest.mark.slow


def orbax_trained(folder: Path, epochs: int, **orbax_args: Any) -> Any:
    """A model trained ``epochs`` epochs under ``keras.callbacks.OrbaxCheckpoint(folder, ...)``."""
    pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed")
    model = small_model()
    keras.utils.set_random_seed(11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        callback = keras.callbacks.OrbaxCheckpoint(str(folder), **orbax_args)
        model.fit(X, Y, epochs=epochs, callbacks=[callback], **FIT)
    return model


def fresh_copy(model: Any) -> Any:
    """A new model holding ``model``'s weights and optimizer state, as a new session loads them: on
    JAX a model continued in memory trains differently from any model loaded (its own compile)."""
    copy = small_model()
    copy.optimizer.build(copy.trainable_variables)
    pairs = ((copy.weights, model.weights), (copy.optimizer.variables, model.optimizer.variables))
    for mine, theirs in pairs:
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs, strict=True):
            a.assign(b.value)
    return copy


@pytest.mark.parametrize("build", [True, False], ids=["build_model", "the-step's-model"])
def test_the_newest_orbax_step_continues_as_the_model_that_wrote_it(
        tmp_path: Path, build: bool, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "orbax"
    model = orbax_trained(folder, 3, max_to_keep=2)
    before = files_of(folder)
    assert {p.split("/")[0] for p in before} == {"1", "2"}, sorted(before)  # steps are epoch indexes
    expected = continued(fresh_copy(model), 3, 5)  # build_model's model now gets other variable names

    run, said = resumed(folder, 5, capsys, **({"build_model": small_model} if build else {}))

    lines = adopted_lines(said)
    assert len(lines) == 1, said
    assert "adopted step 2 (a keras.callbacks.OrbaxCheckpoint step, epoch 3)" in lines[0], lines
    assert "continues at epoch 4" in lines[0] and "data order" in lines[0], lines
    assert run.initial_epoch == 5 and same_state(run.model, expected)
    assert files_of(folder) == before  # read in place, never changed
    again = resumable.resume(str(folder), build_model=small_model, monitor="loss")  # its checkpoint wins
    assert again.checkpoint is not None and again.checkpoint.name == "ckpt-000005"


def test_a_damaged_newest_step_is_skipped_with_one_line(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "orbax"
    orbax_trained(folder, 3, max_to_keep=2)
    for data in (folder / "2" / "pytree").rglob("d/*"):
        data.write_bytes(data.read_bytes()[: len(data.read_bytes()) // 2])  # cut short
    before = files_of(folder)
    expected = continued(fresh_copy(orbax_trained(tmp_path / "two", 2)), 2, 4)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run, said = resumed(folder, 4, capsys, build_model=small_model)

    skipped = [str(w.message) for w in caught if "skipped, the next older" in str(w.message)]
    assert len(skipped) == 1 and f"{folder}/2: cannot be loaded" in skipped[0], skipped
    assert "adopted step 1 (a keras.callbacks.OrbaxCheckpoint step, epoch 2)" in said, said
    assert same_state(run.model, expected)
    assert files_of(folder) == before


def test_without_orbax_checkpoint_one_line_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "orbax"
    orbax_trained(folder, 2)
    before = files_of(folder)
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)  # import orbax.checkpoint fails

    with pytest.raises(CheckpointNotFoundError, match=re.escape("run `pip install orbax-checkpoint` and call "
                                                                "resume() again")) as raised:
        resumable.resume(str(folder), build_model=small_model)

    assert "OrbaxCheckpoint wrote (newest: step 1)" in str(raised.value) and "\n" not in str(raised.value)
    assert files_of(folder) == before and not list(folder.glob("ckpt-*"))  # no fresh start


@pytest.mark.parametrize("args, said", [
    ({"save_freq": 3}, "step 12 counts batches"),
    ({"save_weights_only": True}, "was saved with OrbaxCheckpoint(save_weights_only=True)"),
], ids=["save_freq=3", "save_weights_only"])
def test_a_step_whose_epoch_is_not_known_is_said_not_guessed(tmp_path: Path, args: dict[str, Any],
                                                             said: str) -> None:
    folder = tmp_path / "orbax"
    orbax_trained(folder, 3, **args)  # 4 batches an epoch
    before = files_of(folder)
    with pytest.raises(CheckpointNotFoundError, match=re.escape(said)) as raised:
        resumable.resume(str(folder), build_model=small_model)
    assert "initial_epoch=" in str(raised.value), raised.value
    assert files_of(folder) == before and not list(folder.glob("ckpt-*"))


def test_orbax_arrays_are_the_steps_values(tmp_path: Path) -> None:
    """The adopted variables hold exactly what Orbax saved (Keras' set_state_tree would pass over a
    variable whose name differs: every one is checked here)."""
    folder = tmp_path / "orbax"
    model = orbax_trained(folder, 2)
    small_model()
    run = resumable.resume(str(folder), build_model=small_model)
    for mine, theirs in ((run.model.weights, model.weights),
                         (run.model.optimizer.variables, model.optimizer.variables)):
        assert len(mine) == len(theirs) > 2
        for a, b in zip(mine, theirs, strict=True):
            np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value))


def test_resumable_list_says_resume_adopts_the_steps(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from resumable.cli.listing import run_list

    folder = tmp_path / "orbax"
    orbax_trained(folder, 3, max_to_keep=2)
    capsys.readouterr()
    run_list(str(folder))
    said = capsys.readouterr().out
    assert "1: adoptable: a Keras OrbaxCheckpoint step, adopted by resume()" in said, said
    assert "2: adoptable: a Keras OrbaxCheckpoint step, adopted by resume()" in said
    assert "0 checkpoints and 2 Keras OrbaxCheckpoint steps" in said
    assert "latest good: none of resumable's; resume() adopts the newest good Keras OrbaxCheckpoint" in said
    assert "would start afresh" not in said and "partial" not in said
