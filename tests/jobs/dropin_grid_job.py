"""Every argument of resumable.ModelCheckpoint and resumable.BackupAndRestore across its values,
next to Keras' own class.

    KERAS_BACKEND=jax python tests/jobs/dropin_grid_job.py FOLDER

Each ModelCheckpoint case trains the same small model twice from the same weights (one model,
reset before each fit: `trainee`), once with
``keras.callbacks.ModelCheckpoint`` and once with ``resumable.ModelCheckpoint`` (files in two
folders), and compares what each printed, the warnings, the files written, and the weights and
optimizer state in each file. Where Keras refuses an argument resumable takes (``.hdf5`` names,
``verbose="auto"``), resumable is compared with the Keras call it stands for (``.keras``,
``verbose=1``). Each BackupAndRestore case is interrupted after its second epoch and fitted
again: the final weights must equal a run never interrupted (and Keras' own, for per-epoch
backups). Prints one JSON line, ``{"cases": N, "mismatches": [...]}``; the test imports
`run_grid` on TensorFlow and runs this file on JAX.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import resumable  # noqa: E402

EPOCHS = 2
# 24 samples: 3 batches an epoch
FIT: dict[str, Any] = {"batch_size": 8, "epochs": EPOCHS, "verbose": 0, "shuffle": False}


@dataclass
class Case:
    """One ModelCheckpoint call: ``template`` and ``kwargs`` for both classes, unless Keras refuses
    them (then ``keras_template`` / ``keras_kwargs`` say what Keras is called with instead)."""

    template: str
    kwargs: dict[str, Any]
    ours: dict[str, Any] = field(default_factory=dict)  # resumable's own arguments
    keras_template: str | None = None
    keras_kwargs: dict[str, Any] | None = None


MODEL_CHECKPOINT_CASES = [
    Case("m.keras", {}),
    Case("m.keras", {"verbose": 1}, {"async_upload": False}),
    Case("m-{epoch:02d}-{val_loss:.3f}.keras", {"verbose": "auto"}, {"keep_last": 1},
         keras_kwargs={"verbose": 1}),
    Case("best.keras", {"monitor": "val_loss", "save_best_only": True, "mode": "min", "verbose": 1}),
    Case("best-{epoch}.keras",
         {"monitor": "val_accuracy", "save_best_only": True, "mode": "max", "verbose": 1}),
    Case("best.keras", {"save_best_only": True, "initial_value_threshold": 0.0, "verbose": 1}),  # not beaten
    Case("best.keras", {"save_best_only": True, "mode": "auto", "initial_value_threshold": 9.0, "verbose": 1},
         {"keep_last": 2}),
    Case("w-{epoch}.weights.h5", {"save_weights_only": True, "verbose": 1}, {"async_upload": False}),
    Case("{epoch:02d}-{batch:02d}.keras", {"save_freq": 2, "verbose": 1}),
    Case("b-{epoch}-{batch}.weights.h5", {"save_freq": 1, "save_weights_only": True, "save_best_only": True,
                                          "monitor": "loss", "verbose": 1}, {"keep_last": 2}),
    Case("m.keras", {"mode": "unknown"}),
    Case("m.keras", {"monitor": "val_acc", "save_best_only": True, "mode": "max"}),
    Case("weights-{epoch:02d}-{val_accuracy:.3f}.hdf5",
         {"monitor": "val_accuracy", "verbose": 1, "mode": "max"},
         keras_template="weights-{epoch:02d}-{val_accuracy:.3f}.keras"),
    Case("w-{epoch}.h5", {"save_weights_only": True, "save_freq": "epoch"},
         {"staging_dir": "<tmp>/staging"}, keras_template="w-{epoch}.weights.h5"),
]

# The cases whose printing reaches Keras-version-dependent code (the save decision and its lines,
# made by resumable before Keras 3.10): every lane runs these (`run_printing_cases`).
PRINTING_CASES = [MODEL_CHECKPOINT_CASES[i] for i in (1, 2, 3, 5)]

BACKUP_CASES: list[dict[str, Any]] = [
    {},
    {"save_freq": 2, "double_checkpoint": True},
    {"double_checkpoint": True, "delete_checkpoint": False, "verbose": 1},
    {"save_freq": 1, "delete_checkpoint": False, "verbose": "auto", "async_upload": False},
    {"save_interval": 1e-6, "when_behind": "wait", "lease_timeout": 20},
]


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 4)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 3, size=24), 3)
    return x, y


X, Y = data()


def make_model(weights: list[np.ndarray] | None = None) -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    if weights is not None:
        model.set_weights(weights)
    return model


_TRAINEE: list[tuple[keras.Model, list[np.ndarray]]] = []


def trainee(weights: list[np.ndarray]) -> keras.Model:
    """The one compiled model every fit of the grid trains, set to ``weights`` with its optimizer
    as new: its train step is traced once, where a new model per fit traced about fifty times
    (most of the grid's time on TensorFlow). A user fitting one model again with other callbacks
    does the same. Files are loaded into models of their own (`make_model`)."""
    if not _TRAINEE:
        model = make_model()
        model.optimizer.build(model.trainable_variables)
        _TRAINEE.append((model, [np.array(v) for v in model.optimizer.variables]))
    model, fresh = _TRAINEE[0]
    model.set_weights(weights)
    for variable, value in zip(model.optimizer.variables, fresh, strict=True):
        variable.assign(value)
    return model


@dataclass
class Outcome:
    lines: list[str]
    warnings: list[str]
    files: list[str]
    error: str | None


def fit_with(callback_class: Any, folder: Path, template: str, kwargs: dict[str, Any], init: list[np.ndarray]
             ) -> Outcome:
    folder.mkdir(parents=True)
    model = trainee(init)
    out = io.StringIO()
    error = None
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        try:
            callback = callback_class(str(folder / template), **kwargs)
            model.fit(X, Y, validation_data=(X, Y), callbacks=[callback], **FIT)
        except Exception as e:  # noqa: BLE001 - compared with Keras'
            error = f"{type(e).__name__}: {e}".replace(str(folder), "<dir>")
    lines = [line.replace(str(folder), "<dir>") for line in out.getvalue().splitlines() if line.strip()]
    said = [str(w.message).replace(str(folder), "<dir>") for w in caught
            if issubclass(w.category, UserWarning) and "__array__" not in str(w.message)]
    files = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    return Outcome(lines, said, files, error)


def same_state(a: keras.Model, b: keras.Model) -> bool:
    weights = all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))
    optimizer_a = [np.asarray(v) for v in a.optimizer.variables] if a.optimizer is not None else []
    optimizer_b = [np.asarray(v) for v in b.optimizer.variables] if b.optimizer is not None else []
    return weights and len(optimizer_a) == len(optimizer_b) and all(
        np.array_equal(x, y) for x, y in zip(optimizer_a, optimizer_b, strict=True))


def loaded(path: Path, ours: bool, weights_only: bool) -> keras.Model:
    if weights_only:
        model = make_model()
        if ours:
            resumable.load_weights(model, path)
        else:
            model.optimizer.build(model.trainable_variables)
            model.load_weights(path)
        return model
    return resumable.load_model(path) if ours else keras.saving.load_model(path)


def keras_name(name: str, case: Case) -> str:
    """The name Keras wrote for resumable's file ``name`` (the suffix Keras stands in with)."""
    if case.keras_template is None:
        return name
    ours, theirs = case.template.rsplit("}", 1)[-1], case.keras_template.rsplit("}", 1)[-1]
    return name[: -len(ours)] + theirs


def compare_model_checkpoint(case: Case, root: Path, init: list[np.ndarray]) -> list[str]:
    ours_args = {k: v.replace("<tmp>", str(root)) if isinstance(v, str) else v for k, v in case.ours.items()}
    keras_args = {**case.kwargs, **(case.keras_kwargs or {})}
    theirs = fit_with(keras.callbacks.ModelCheckpoint, root / "keras", case.keras_template or case.template,
                      keras_args, init)
    ours = fit_with(resumable.ModelCheckpoint, root / "ours", case.template, {**case.kwargs, **ours_args},
                    init)
    what = f"{case.template} {case.kwargs} {case.ours}"
    problems = []
    if theirs.error or ours.error:
        if (theirs.error or "").split(":")[0] != (ours.error or "").split(":")[0]:
            problems.append(f"{what}: Keras raised {theirs.error}, resumable {ours.error}")
        return problems
    ours_lines = [_as_keras(line, case) for line in ours.lines]
    if ours_args.get("async_upload") is False:
        if ours_lines != theirs.lines:
            problems.append(f"{what}: printed {ours_lines}, Keras {theirs.lines}")
    elif collections.Counter(ours_lines) != collections.Counter(theirs.lines):
        problems.append(f"{what}: printed {ours_lines}, Keras {theirs.lines}")
    if ours.warnings != theirs.warnings:
        problems.append(f"{what}: warned {ours.warnings}, Keras {theirs.warnings}")
    expected = [keras_name(n, case) for n in ours.files]
    keep_last = ours_args.get("keep_last")
    kept = theirs.files if keep_last is None else _newest(theirs.files, keep_last)
    if sorted(expected) != sorted(kept):
        problems.append(f"{what}: wrote {ours.files}, Keras {theirs.files}")
        return problems
    for name in ours.files:
        ours_path, theirs_path = root / "ours" / name, root / "keras" / keras_name(name, case)
        if resumable.verify_file(ours_path) is None:
            problems.append(f"{what}: {name} has no checksum record")
        weights_only = bool(case.kwargs.get("save_weights_only"))
        if not same_state(loaded(ours_path, True, weights_only), loaded(theirs_path, False, weights_only)):
            problems.append(f"{what}: {name} holds other weights or optimizer state than Keras' file")
    return problems


def _as_keras(line: str, case: Case) -> str:
    if case.keras_template is None:
        return line
    for word in line.split():
        if word.startswith("<dir>/"):
            line = line.replace(word, "<dir>/" + keras_name(word[len("<dir>/"):], case))
    return line


def _newest(files: list[str], count: int) -> list[str]:
    """The files a keep_last=N callback leaves: the last N written (names sort by epoch and batch here)."""
    return sorted(files)[-count:]


class InterruptAfter(keras.callbacks.Callback):
    def __init__(self, epochs: int) -> None:
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if epoch + 1 == self.epochs:
            raise RuntimeError("interrupted")


def backup_run(callback_class: Any, folder: Path, kwargs: dict[str, Any], init: list[np.ndarray]
               ) -> tuple[list[np.ndarray], list[int], bool, list[str]]:
    """Fit 3 epochs interrupted after the second, then fit again: (weights, epochs of the second fit,
    whether the backup folder is left, lines printed)."""
    model = trainee(init)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        callback = callback_class(str(folder), **kwargs)
        with contextlib.suppress(RuntimeError):
            model.fit(X, Y, callbacks=[callback, InterruptAfter(2)], **{**FIT, "epochs": 3})
        if hasattr(callback, "wait_for_uploads"):
            callback.wait_for_uploads()  # Keras calls no on_train_end after an exception
        history = model.fit(X, Y, callbacks=[callback], **{**FIT, "epochs": 3})
    return model.get_weights(), list(history.epoch), folder.exists(), out.getvalue().splitlines()


def compare_backup(kwargs: dict[str, Any], root: Path, init: list[np.ndarray], reference: list[np.ndarray]
                   ) -> list[str]:
    keras_args = {k: v for k, v in kwargs.items()
                  if k in ("save_freq", "double_checkpoint", "delete_checkpoint")}
    weights, epochs, left, lines = backup_run(resumable.BackupAndRestore, root / "ours", kwargs, init)
    problems = []
    if epochs != [2]:
        problems.append(f"BackupAndRestore {kwargs}: the second fit trained epochs {epochs}, not [2]")
    if not all(np.array_equal(a, b) for a, b in zip(weights, reference, strict=True)):
        problems.append(f"BackupAndRestore {kwargs}: final weights differ from a run never interrupted")
    if left != (not kwargs.get("delete_checkpoint", True)):
        problems.append(f"BackupAndRestore {kwargs}: backup folder left={left}")
    if kwargs.get("verbose") and not any("restored" in line for line in lines):
        problems.append(f"BackupAndRestore {kwargs}: verbose printed no restore line: {lines}")
    if kwargs.get("save_freq", "epoch") == "epoch":
        theirs, their_epochs, their_left, _ = backup_run(keras.callbacks.BackupAndRestore, root / "keras",
                                                         keras_args, init)
        if their_epochs != epochs or their_left != left or not all(
                np.array_equal(a, b) for a, b in zip(weights, theirs, strict=True)):
            problems.append(f"BackupAndRestore {kwargs}: differs from Keras' (epochs {their_epochs}, "
                            f"folder left {their_left})")
    return problems


def run_printing_cases(folder: Path) -> list[str]:
    """`PRINTING_CASES` alone, as in `run_grid`: the mismatches."""
    keras.utils.set_random_seed(3)
    init = make_model().get_weights()
    return [problem for i, case in enumerate(PRINTING_CASES)
            for problem in compare_model_checkpoint(case, folder / f"mc-{i}", init)]


def run_grid(folder: Path) -> dict[str, Any]:
    keras.utils.set_random_seed(3)
    init = make_model().get_weights()
    mismatches: list[str] = []
    for i, case in enumerate(MODEL_CHECKPOINT_CASES):
        mismatches += compare_model_checkpoint(case, folder / f"mc-{i}", init)
    never_stopped = trainee(init)
    never_stopped.fit(X, Y, **{**FIT, "epochs": 3})
    reference = never_stopped.get_weights()
    for i, kwargs in enumerate(BACKUP_CASES):
        mismatches += compare_backup(kwargs, folder / f"br-{i}", init, reference)
    return {"cases": len(MODEL_CHECKPOINT_CASES) + len(BACKUP_CASES), "mismatches": mismatches,
            "backend": keras.backend.backend()}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    shutil.rmtree(target, ignore_errors=True)
    print(json.dumps(run_grid(target)), flush=True)
