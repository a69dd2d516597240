"""A drop-in fit continuing from `load_newest_model` (``fit(initial_epoch=N)`` with
`resumable.ModelCheckpoint`) says once, on stderr, what restarts: only the user's own callbacks
that lose state, and the data order; the ModelCheckpoint's best value comes back from its record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from keras_helpers import small_model
from test_adopt import FIT, X, Y

import resumable

keras = pytest.importorskip("keras")

pytestmark = pytest.mark.slow  # `lanes` on the case that reads each Keras' callbacks


def said_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("resumable: fit continues")]


@pytest.mark.lanes
def test_a_continuing_fit_names_what_restarts_and_takes_its_best_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = str(tmp_path / "ck" / "w-{epoch:02d}.keras")
    first = resumable.ModelCheckpoint(template, monitor="loss", save_best_only=True)
    model = small_model()
    model.fit(X, Y, epochs=3, callbacks=[first], **FIT)
    assert said_lines(capsys.readouterr().err) == []  # a fit from epoch 0 says nothing
    newest = max((tmp_path / "ck").glob(".w-*.keras.resumable.json"))
    recorded = json.loads(newest.read_text())

    model, initial_epoch = resumable.load_newest_model(template)
    checkpoint = resumable.ModelCheckpoint(template, monitor="loss", save_best_only=True)
    bests: list[Any] = []
    watch = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: bests.append(checkpoint.best))
    callbacks = [checkpoint, watch, keras.callbacks.EarlyStopping(monitor="loss", patience=5),
                 keras.callbacks.ReduceLROnPlateau(monitor="loss"),
                 keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))]
    model.fit(X, Y, epochs=5, initial_epoch=initial_epoch, callbacks=callbacks, **FIT)

    lines = said_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    best = recorded.get("best", recorded.get("details", {}).get("best"))
    assert isinstance(best, float), recorded
    assert bests[0] == best  # Keras would start at inf and save epoch 4 whatever its loss
    assert f"fit continues at epoch {initial_epoch + 1}" in lines[0]
    assert f"its best loss ({best:.4g}) is taken from {newest.name[1:-len('.resumable.json')]}'s record" \
        in lines[0], lines
    for restarting in ("EarlyStopping's wait, best loss", "ReduceLROnPlateau's wait, cooldown and best loss",
                       "CSVLogger's file", "the data order"):
        assert restarting in lines[0], (restarting, lines)
    assert "this ModelCheckpoint's best" not in lines[0]


def test_only_what_the_fit_has_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = str(tmp_path / "ck" / "w-{epoch:02d}.keras")
    model = small_model()
    model.fit(X, Y, epochs=2, callbacks=[keras.callbacks.ModelCheckpoint(template)], **FIT)  # Keras' files
    model, initial_epoch = resumable.load_newest_model(template)
    capsys.readouterr()

    checkpoint = resumable.ModelCheckpoint(template, monitor="loss", save_best_only=True)
    model.fit(X, Y, epochs=3, initial_epoch=initial_epoch, callbacks=[checkpoint], **FIT)

    lines = said_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "fit continues at epoch 3" in lines[0], lines
    assert "this ModelCheckpoint's best loss and the data order" in lines[0], lines  # Keras' files: no record
    assert not any(name in lines[0] for name in ("EarlyStopping", "ReduceLROnPlateau", "CSVLogger")), lines


def test_under_run_fit_nothing_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run.fit restores the callbacks' state from its checkpoint: no line that says they restart."""
    template = str(tmp_path / "files" / "w-{epoch:02d}.keras")
    run = resumable.resume(str(tmp_path / "run"), build_model=small_model, monitor="loss")
    run.fit(X, Y, epochs=2, callbacks=[resumable.ModelCheckpoint(template, monitor="loss")], **FIT)
    run = resumable.resume(str(tmp_path / "run"), build_model=small_model, monitor="loss")
    capsys.readouterr()

    run.fit(X, Y, epochs=3, callbacks=[resumable.ModelCheckpoint(template, monitor="loss"),
                                       keras.callbacks.EarlyStopping(monitor="loss")], **FIT)

    assert run.initial_epoch == 3 and (tmp_path / "files" / "w-03.keras").exists()
    assert said_lines(capsys.readouterr().err) == []
