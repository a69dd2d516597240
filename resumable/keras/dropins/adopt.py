"""The model files a folder held before it had checkpoints of its own: adopted by `resume()`, and
read by `load_newest_model` for a `resumable.ModelCheckpoint` (or Keras ModelCheckpoint) template.

Four kinds are found: `resumable.ModelCheckpoint` files (their checksum records give the epoch
and are checked), Keras ModelCheckpoint files (the epoch from the name, `file_epochs`), a Keras
BackupAndRestore backup (``latest.weights.h5`` and ``training_metadata.json``, names from
`compat.keras_backup`) and the steps of a Keras OrbaxCheckpoint (`orbax_steps`). They are tried
newest first; a damaged one is skipped with one line. The files are only read: never modified,
moved or deleted (the run's retention deletes checkpoints ``ckpt-*`` alone).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras

from resumable.core import file_epochs, user_warnings
from resumable.core.display import first_line, printable
from resumable.core.errors import CheckpointNotFoundError, CorruptCheckpointError, ResumableError
from resumable.keras import compat, topology
from resumable.keras.checkpoint import files_to_model
from resumable.keras.dropins import orbax_steps, save_and_load
from resumable.manager import CORRUPT, ModelFile, RunFolder, list_model_files, split_url

RESUMABLE_FILE = "a resumable.ModelCheckpoint file"
KERAS_FILE = "a keras.callbacks.ModelCheckpoint file"
KERAS_BACKUP = "a keras.callbacks.BackupAndRestore backup"
SAVED_FILE = "a resumable.save_model file"
ORBAX_STEP = orbax_steps.KIND

# What a checkpoint holds and a model file does not: said in the adoption line.
_NOT_CARRIED = ("EarlyStopping's and ReduceLROnPlateau's counters", "the history", "the data order")


@dataclass(frozen=True)
class Candidate:
    """One file that may be adopted, and where its run stood."""

    name: str
    url: str
    kind: str
    epochs_done: int | None  # None: the name carries no epoch
    batch: int = 0  # a save inside epoch epochs_done + 1, this many batches in (0: an epoch's end)
    problem: str = ""  # why it cannot be adopted: damaged; empty when it may be
    saved: float = 0.0  # seconds since the epoch, to order saves of one epoch
    details: dict[str, Any] = field(default_factory=dict)  # a checksum record's (best, monitor, ...)

    def order(self) -> tuple[int, int, float, str]:
        return (self.epochs_done if self.epochs_done is not None else -1, self.batch, self.saved, self.name)

    @property
    def weights_only(self) -> bool:
        return self.name.endswith((".weights.h5", ".bkp")) or bool(self.details.get("weights_only"))


@dataclass
class Adopted:
    """The model of the newest file that loaded, and what `resume()` says about it."""

    model: keras.Model
    file: Candidate

    @property
    def epochs_done(self) -> int:
        return self.file.epochs_done or 0

    def line(self, folder: str) -> str:
        """The one line of a resume that adopted a file."""
        file = self.file
        mid_epoch = (f"; it was saved {file.batch} batches into epoch {file.epochs_done + 1}, which restarts "
                     "at its first batch" if file.batch and file.epochs_done is not None else "")
        lost = list(_NOT_CARRIED)
        if file.kind != RESUMABLE_FILE or file.details.get("best") is None:
            lost.append("the best value")
        return printable(
            f"resumable: adopted {file.name} ({file.kind}, epoch {self.epochs_done}) in {folder}: training "
            f"continues at epoch {self.epochs_done + 1}, new checkpoints go beside it{mid_epoch}; "
            f"{', '.join(lost[:-1])} and {lost[-1]} restart")


def candidates(url: str, *, template: str | None = None,
               storage_options: dict[str, Any] | None = None) -> list[Candidate]:
    """The files of folder ``url`` that may be adopted, newest first (with ``template``: the files
    it names; ``url`` is then their folder); those whose name carries no epoch last."""
    folder = list_model_files(url, storage_options=storage_options)
    names = [f.name for f in folder.files]
    pattern = file_epochs.template_pattern(template) if template is not None else None
    backup = compat.backup_names()
    found: list[Candidate] = []
    for file in folder.files:
        if pattern is not None and pattern.match(file.name) is None:
            continue
        if pattern is None and file.name == backup.weights and file.record is None:
            continue  # read with its metadata below
        found.append(_model_file(file, pattern, names))
    if pattern is None:
        found.extend(_backups(url, storage_options, {f.name: f for f in folder.files}))
        found.extend(Candidate(f"step {s.number}", s.url, ORBAX_STEP, s.number + 1, 0, s.problem,
                               details={"orbax_step": s.number, "orbax_weights_only": s.weights_only})
                     for s in orbax_steps.steps(url, folder.folders, storage_options))
    return sorted(found, key=Candidate.order, reverse=True)


def load_newest(url: str, build_model: Callable[[], keras.Model] | None, *, template: str | None = None,
                strategy: Any = None, distribution: Any = None,
                storage_options: dict[str, Any] | None = None) -> Adopted | None:
    """The model of the newest file of ``url`` that loads, skipping damaged ones with one line each;
    None when the folder holds no such file. Raises `CheckpointNotFoundError`, in one line saying
    what to do, when it holds files of which none can be adopted."""
    files = candidates(url, template=template, storage_options=storage_options)
    if not files:
        return None
    undated = [f for f in files if f.epochs_done is None]
    unbuilt = [f.name for f in files if f.epochs_done is not None and f.weights_only and build_model is None]
    need_build = (f"{', '.join(unbuilt)} hold weights only: pass build_model=<a function returning the "
                  "compiled model> to continue from them")
    skipped: list[str] = []
    for file in (f for f in files if f.epochs_done is not None):
        if file.name in unbuilt:
            continue
        problem = file.problem
        if not problem and file.kind == ORBAX_STEP:
            _check_orbax(file, url)
        if not problem:
            with topology.scope(strategy, distribution):  # a bad build_model raises: not the file's fault
                model = files_to_model.build(build_model) if build_model is not None else None
            try:
                model = _load(file, model, strategy, distribution, storage_options)
            except CorruptCheckpointError as e:
                problem = printable(str(e))
            except ResumableError:  # the storage's (not mounted, no access): not this file's fault
                raise
            except orbax_steps.BatchStep as e:
                raise CheckpointNotFoundError(printable(
                    f"{file.url}: {e}, so it is not adopted (the epoch is never guessed); continue it with "
                    f"keras.saving.load_model({url!r}) and fit(initial_epoch=<the epochs done>), or save "
                    "with save_freq=\"epoch\" for resume() to continue")) from None
            except Exception as e:  # noqa: BLE001 - whatever Keras raises on a file it cannot read: said, skipped
                problem = f"cannot be loaded ({first_line(e)})"
            else:
                if undated:
                    user_warnings.warn(f"resumable: {_undated_line(undated, adopted=file.name)}")
                if unbuilt and file.order() < max(f.order() for f in files if f.name in unbuilt):
                    user_warnings.warn(printable(f"resumable: {need_build}; adopted {file.name} instead"))
                return Adopted(model, file)
        said = problem if problem.startswith(file.url) else f"{file.url}: {problem}"
        user_warnings.warn(printable(f"resumable: {said}; skipped, the next older file is tried"))
        skipped.append(file.name)
    where = printable(url if template is None else f"{url} ({template})")
    if unbuilt:
        raise CheckpointNotFoundError(printable(f"{where}: {need_build}"))
    if undated and not skipped:
        raise CheckpointNotFoundError(_undated_line(undated, adopted=None))
    raise CheckpointNotFoundError(
        f"{where}: none of its {len(files)} model files can be continued from (said above); move them "
        "to another folder to start a new run here, or fix what was said and call it again")


def _check_orbax(file: Candidate, url: str) -> None:
    """A step that cannot be read here, or read without guessing: one line saying what to do."""
    if not orbax_steps.available():
        raise CheckpointNotFoundError(printable(
            f"{url} holds checkpoints keras.callbacks.OrbaxCheckpoint wrote (newest: {file.name}); reading "
            f"them needs orbax-checkpoint: run `{orbax_steps.INSTALL}` and call resume() again"))
    if file.details.get("orbax_weights_only"):
        raise CheckpointNotFoundError(printable(
            f"{file.url} was saved with OrbaxCheckpoint(save_weights_only=True): it holds no optimizer "
            "state, and its step does not tell epochs from batches, so it is not adopted; continue it "
            f"with model.load_weights({url!r}) and fit(initial_epoch=<the epochs done>)"))


def _model_file(file: ModelFile, pattern: Any, names: list[str]) -> Candidate:
    saved = file.saved.timestamp() if file.saved is not None else 0.0
    if pattern is not None:
        epoch = file_epochs.epoch_in_template_name(pattern, file.name)
    else:
        epoch = file_epochs.epoch_in_name(file.name, names)
    if file.record is not None and file.epoch is not None:
        epoch, batch = file.epoch, file.batch
        if batch:
            epoch -= 1  # saved inside the epoch: those epochs done before it
        problem = file.problem if file.status == CORRUPT else ""
        return Candidate(file.name, file.url, RESUMABLE_FILE, epoch, batch, problem, saved, file.details)
    if file.record is not None:  # resumable.save_model's record: checked, but no epoch in it
        problem = file.problem if file.status == CORRUPT else ""
        return Candidate(file.name, file.url, SAVED_FILE, epoch, 0, problem, saved, file.details)
    problem = file.problem if file.status == CORRUPT else ""  # a link, never read through
    return Candidate(file.name, file.url, KERAS_FILE, epoch, 0, problem, saved)


def _backups(url: str, storage_options: dict[str, Any] | None,
             listed: dict[str, ModelFile]) -> list[Candidate]:
    """Keras BackupAndRestore's backup in ``url``, and its previous one (double_checkpoint)."""
    names = compat.backup_names()
    if names.weights not in listed:  # no backup (a new run reads nothing more); Keras' previous is a copy
        return []
    folder = RunFolder(url, storage_options=storage_options)
    found = []
    pairs = ((names.weights, names.metadata), (names.previous_weights, names.previous_metadata))
    for weights, metadata in pairs:
        data = folder.read(folder.path(metadata), 4096)
        present = weights in listed or (weights == names.previous_weights and _exists(folder, weights))
        if not present and isinstance(data, Exception):
            continue
        problem, epoch, batch = "", None, 0
        if not present:
            problem = f"its weights file {weights} is missing"
        elif isinstance(data, Exception):
            problem = f"its {metadata}, which holds the epoch, is missing"
        else:
            try:
                saved = json.loads(data)
                epoch, batch = int(saved["epoch"]), int(saved.get("batch") or 0)
            except (ValueError, KeyError, TypeError) as e:
                problem = f"its {metadata} cannot be read ({first_line(e)})"
        mine = listed.get(weights)
        when = mine.saved.timestamp() if mine is not None and mine.saved is not None else 0.0
        found.append(Candidate(weights, folder.url_of(weights), KERAS_BACKUP, epoch if not problem else -1,
                               batch, problem, when))
    return found


def _exists(folder: RunFolder, name: str) -> bool:
    with folder.errors(folder.url_of(name)):
        return bool(folder.call(lambda: folder.fs.exists(folder.path(name)), f"check {name}"))


def _load(file: Candidate, built: keras.Model | None, strategy: Any, distribution: Any,
          storage_options: dict[str, Any] | None) -> keras.Model:
    """The file's model: ``built`` (build_model's) with the file's weights and optimizer state, else the
    file's own model. The file is read where it is (downloaded from a bucket), never changed."""
    if file.kind == ORBAX_STEP:
        with topology.scope(strategy, distribution):
            return orbax_steps.load(file.url, int(file.details["orbax_step"]), built, storage_options)
    path, _ = save_and_load.local_copy(file.url, storage_options, warn_unrecorded=False)
    staged = None
    if file.name.endswith(".bkp"):  # Keras reads weights by their suffix: a copy under a name it reads
        staged = Path(tempfile.mkdtemp(prefix="resumable-adopt-"))
        path = Path(shutil.copyfile(path, staged / "previous.weights.h5"))
    try:
        with topology.scope(strategy, distribution):
            if built is not None:
                save_and_load.load_weights_file(built, path)
                return built
            model = save_and_load.load_file(path)
        if getattr(model, "optimizer", None) is None:  # a Keras-written .h5 of loss="mse": no fit from it
            raise ValueError("it loads uncompiled: pass build_model=<a function returning the compiled "
                             "model>")
        return model
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)


def _undated_line(undated: list[Candidate], adopted: str | None) -> str:
    more = f" and {len(undated) - 3} more" if len(undated) > 3 else ""
    names = ", ".join(f.name for f in undated[:3]) + more
    folder, _ = split_url(undated[0].url)
    then = (f"{adopted} is adopted instead" if adopted is not None else
            "rename the file to carry its epoch (e.g. best-07.keras for 7 epochs done) and call it again, "
            "or move it out to start a new run here")
    return printable(f"{folder}: {names} carries no epoch in its name, so it is not adopted "
                     f"(the epoch is never guessed); {then}")


__all__ = ["KERAS_BACKUP", "KERAS_FILE", "ORBAX_STEP", "RESUMABLE_FILE", "SAVED_FILE", "Adopted", "Candidate",
           "candidates", "load_newest"]
