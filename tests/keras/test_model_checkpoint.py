"""resumable.ModelCheckpoint: Keras' behaviours with Keras' names, plus whole files, records, gs://, kills."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import dropin_job, same_weights

import resumable
from resumable import CorruptCheckpointError

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(30, 3)).astype("float32")
Y = keras.utils.to_categorical(rng.integers(0, 3, size=30), 3)
FIT: dict[str, Any] = {"batch_size": 5, "validation_data": (X, Y), "verbose": 0}


def make_model() -> Any:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(loss="categorical_crossentropy", optimizer="sgd", metrics=["accuracy"])
    return model


@pytest.mark.lanes
def test_arguments_are_keras_own_in_keras_order(tmp_path: Path) -> None:
    args = ("loss", 1, True, False, "min", 3, 0.5)
    cb = resumable.ModelCheckpoint(str(tmp_path / "m.keras"), *args)
    plain = keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"), *args)
    names = ("monitor", "verbose", "save_best_only", "save_weights_only", "mode", "save_freq", "best")
    kept = [(name, value) for name, value in zip(names, args, strict=True) if hasattr(plain, name)]
    assert len(kept) >= 6  # Keras 3.8 and 3.9 keep no `mode`
    assert [(name, getattr(cb, name)) for name, _ in kept] == kept
    assert isinstance(cb, keras.callbacks.ModelCheckpoint)
    with pytest.raises(ValueError, match="Unrecognized save_freq"):
        resumable.ModelCheckpoint(str(tmp_path / "m.keras"), save_freq="daily")
    with pytest.raises(ValueError, match="must end in `.keras`"):
        resumable.ModelCheckpoint(str(tmp_path / "m.txt"))
    with pytest.raises(ValueError, match=".weights.h5"):
        resumable.ModelCheckpoint(str(tmp_path / "m.keras"), save_weights_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumable.ModelCheckpoint(str(tmp_path / "m.keras"), mode="unknown")
    assert "ModelCheckpoint mode 'unknown' is unknown" in str(caught[-1].message)


@pytest.mark.lanes
@pytest.mark.slow
def test_files_appear_where_keras_puts_them_with_records(tmp_path: Path) -> None:
    model = make_model()
    fixed = tmp_path / "sub" / "best.keras"
    model.fit(X, Y, epochs=2, callbacks=[resumable.ModelCheckpoint(fixed)], **FIT)
    assert fixed.is_file() and (fixed.parent / ".best.keras.resumable.json").is_file()
    assert [p.name for p in fixed.parent.iterdir() if not p.name.startswith(".")] == ["best.keras"]
    assert same_weights(keras.saving.load_model(fixed), model)
    assert same_weights(resumable.load_model(fixed), model)
    record = resumable.verify_file(fixed)
    assert record is not None and record.details["epoch"] == 2

    template = str(tmp_path / "t" / "w.{epoch:02d}-{batch:02d}.weights.h5")
    model.fit(X, Y, epochs=2, callbacks=[resumable.ModelCheckpoint(template, save_weights_only=True,
                                                                   save_freq=3)], **FIT)
    names = sorted(p.name for p in (tmp_path / "t").iterdir() if not p.name.startswith("."))
    assert names == ["w.01-03.weights.h5", "w.01-06.weights.h5", "w.02-03.weights.h5", "w.02-06.weights.h5"]

    # save_best_only, a threshold never beaten, a monitor fit never logs: as in Keras
    never = tmp_path / "never.keras"
    model.fit(X, Y, epochs=1, callbacks=[resumable.ModelCheckpoint(never, save_best_only=True,
                                                                   initial_value_threshold=0)], **FIT)
    assert not never.exists()
    unknown, by_keras = tmp_path / "unknown.keras", tmp_path / "unknown-by-keras.keras"
    with pytest.warns(UserWarning, match="Can save best model only with val_acc available"):
        cb = resumable.ModelCheckpoint(unknown, monitor="val_acc", save_best_only=True, mode="max")
        plain = keras.callbacks.ModelCheckpoint(by_keras, monitor="val_acc", save_best_only=True, mode="max")
        model.fit(X, Y, epochs=1, callbacks=[cb, plain], **FIT)
    assert unknown.exists() == by_keras.exists()  # saved from Keras 3.10 on, skipped before


@pytest.mark.slow
@pytest.mark.parametrize("weights_only", [False, True], ids=["model", "weights"])
def test_article_hdf5_names_load_back(tmp_path: Path, weights_only: bool) -> None:
    model = make_model()
    path = str(tmp_path / "weights-{epoch:02d}-{val_loss:.2f}.hdf5")
    cb = resumable.ModelCheckpoint(path, monitor="val_loss", save_best_only=True,
                                   save_weights_only=weights_only)
    model.fit(X, Y, epochs=1, callbacks=[cb], **FIT)
    (written,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert written.name.startswith("weights-01-") and written.suffix == ".hdf5"
    other = make_model()
    other.load_weights(written)
    assert same_weights(other, model)
    if weights_only:  # Keras 2's weights file: no model config in it, as Keras 2 wrote it
        with pytest.raises(ValueError, match="No model config found"):
            keras.saving.load_model(written)
    else:
        assert same_weights(keras.saving.load_model(written), model)
    fresh = make_model()
    resumable.load_weights(fresh, written)
    assert same_weights(fresh, model)


@pytest.mark.lanes
@pytest.mark.slow
def test_gcs_file_with_record_and_damage_detected(gcs_bucket: str, tmp_path: Path) -> None:
    model = make_model()
    url = f"{gcs_bucket}/ckpt/model-{{epoch}}.keras"
    model.fit(X, Y, epochs=2, callbacks=[resumable.ModelCheckpoint(url, keep_last=1)], **FIT)
    import fsspec

    fs = fsspec.filesystem("gs")
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{gcs_bucket}/ckpt", refresh=True))
    assert names == [".model-2.keras.resumable.json", "model-2.keras"]  # keep_last=1 deleted epoch 1
    assert same_weights(resumable.load_model(f"{gcs_bucket}/ckpt/model-2.keras"), model)
    fs.pipe_file(f"{gcs_bucket}/ckpt/model-2.keras", b"garbage")
    with pytest.raises(CorruptCheckpointError, match="does not match its checksum record"):
        resumable.load_model(f"{gcs_bucket}/ckpt/model-2.keras")


@pytest.mark.lanes
@pytest.mark.slow
def test_best_is_carried_across_sessions_with_resume(tmp_path: Path) -> None:
    best_file = tmp_path / "best.keras"

    class BestAtFirstBatch(keras.callbacks.Callback):
        """What the ModelCheckpoint's best is once training runs: restored, or Keras' fresh inf."""

        def __init__(self, checkpoint: Any) -> None:
            super().__init__()
            self.checkpoint, self.seen = checkpoint, None

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.seen is None:
                self.seen = self.checkpoint.best

    def session(epochs: int) -> tuple[Any, Any]:
        run = resumable.resume(tmp_path / "run", build_model=make_model, monitor="val_loss")
        cb = resumable.ModelCheckpoint(best_file, save_best_only=True)
        spy = BestAtFirstBatch(cb)
        run.fit(X, Y, epochs=epochs, callbacks=[cb, spy], **FIT)
        return cb, spy

    first, _ = session(2)
    second, spy = session(3)
    assert np.isfinite(first.best) and spy.seen == first.best  # the new session starts from the old best
    assert second.best <= first.best


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_killed_mid_save_leaves_the_previous_file_whole(where: str, tmp_path: Path, request: Any) -> None:
    base = str(tmp_path) if where == "local" else request.getfixturevalue("gcs_bucket")
    url = f"{base}/best.keras"
    dropin_job("model_checkpoint", url, "--epochs", "3", "--kill-at-save", "2", killed=True)
    record = resumable.verify_file(url)  # the file of epoch 1, whole, vouched for by its record
    assert record is not None and record.details["epoch"] == 1
    resumable.load_model(url)
    if where == "local":
        leftovers = [p.name for p in tmp_path.iterdir()]
        assert "best.keras" in leftovers and any(n.endswith(".partial") for n in leftovers)
    dropin_job("model_checkpoint", url, "--epochs", "3")
    record = resumable.verify_file(url)
    assert record is not None and record.details["epoch"] == 3
    if where == "local":
        assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())  # a stale one is cleared


@pytest.mark.slow
def test_killed_while_replacing_a_record_leaves_no_tmp_after_the_next_save(tmp_path: Path) -> None:
    """SIGKILLed between writing a record's temporary copy and renaming it: readers ignore the
    ``.tmp`` (the file checks out against the record there), and the next save removes it."""
    url = str(tmp_path / "best.keras")
    dropin_job("model_checkpoint", url, "--epochs", "3", "--kill-in-record", "3", killed=True)
    (leftover,) = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftover.startswith(".best.keras.resumable.json.")
    record = resumable.verify_file(url)  # the file of epoch 2, vouched for by the record still there
    assert record is not None and record.details["epoch"] == 2
    from resumable.cli.app import main

    assert main(["verify", str(tmp_path)]) == 0
    dropin_job("model_checkpoint", url, "--epochs", "3")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".best.keras.resumable.json", "best.keras"]
