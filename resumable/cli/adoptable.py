"""What a folder holds that Keras wrote and `resume()` adopts, named as such by the commands.

A Keras ``OrbaxCheckpoint`` step is a folder named by its number without resumable's manifest:
the run listing calls any such folder "partial" (an interrupted save of ours). Keras
``ModelCheckpoint`` files and a ``BackupAndRestore`` backup carry no checksum record. `list`,
`inspect`, `verify` and `prune` say what they are instead ("adoptable"), never count them as
damaged and never delete them: `resume()` continues from the newest of them
(resumable/keras/dropins/adopt.py).
Nothing here imports Keras: the names and the epoch come from the listing and the file names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from resumable.core.file_epochs import epoch_in_name
from resumable.storage import CheckpointInfo, RunStorage, Status
from resumable.storage.file_folder import UNRECORDED, FileFolder, ModelFile
from resumable.storage.folder import RunFolder

ADOPTABLE = "adoptable"  # the status shown for them: not ok, not partial, not corrupt
ORBAX_STEP = "Keras OrbaxCheckpoint step"
KERAS_FILE = "Keras ModelCheckpoint file"
KERAS_BACKUP = "Keras BackupAndRestore backup"
ORBAX_COMMITTED = "commit_success.txt"  # written last into a step on a bucket
# BackupAndRestore's names in Keras 3.0 to 3.15 (compat.keras_backup reads them from Keras itself).
BACKUP_WEIGHTS, BACKUP_METADATA = "latest.weights.h5", "training_metadata.json"


# ------------------------------------------------------------------ a run folder's entries


def is_orbax_step(info: CheckpointInfo, storage: RunStorage | None = None) -> bool:
    """A numbered folder without a manifest that the run's own names do not make: an Orbax step.

    Orbax writes a step as ``<n>.orbax-checkpoint-tmp-...`` and renames it when done, so a plain
    number is a finished step (on a bucket, where it writes in place, resume() checks
    ``commit_success.txt`` before adopting it).
    """
    if info.status is not Status.PARTIAL or not info.name.isdigit():
        return False
    return storage is None or storage.template.parse(info.name) is None


def status_text(info: CheckpointInfo) -> str:
    return ADOPTABLE if is_orbax_step(info) else info.status._value_  # `_value_`: thousands of rows


def problem_text(info: CheckpointInfo) -> str:
    if not is_orbax_step(info):
        return info.problem
    if unfinished_step(info):
        return (f"a {ORBAX_STEP} Orbax did not finish writing (no {ORBAX_COMMITTED}): resume() skips it; "
                "never changed or deleted")
    return (f"a {ORBAX_STEP}, adopted by resume() (the newest good step, at its epoch); "
            "never changed or deleted")


def unfinished_step(info: CheckpointInfo) -> bool:
    """On a bucket Orbax writes a step in place and its commit file last (locally it renames a
    finished temporary folder, so a numbered one is finished whatever its Orbax version wrote)."""
    return info.url.startswith("gs://") and bool(info.listed) and ORBAX_COMMITTED not in info.listed


def kind_of(info: CheckpointInfo) -> str:
    return ORBAX_STEP if is_orbax_step(info) else "checkpoint"


def orbax_steps(infos: Sequence[CheckpointInfo], storage: RunStorage | None = None) -> list[CheckpointInfo]:
    return [i for i in infos if is_orbax_step(i, storage)]


def steps_line(steps: Sequence[CheckpointInfo]) -> str:
    """What `resume()` does with a folder's Orbax steps, in one line."""
    names = sorted((i.name for i in steps), key=int)
    shown = ", ".join(names[-3:]) + (f" and {len(names) - 3} older" if len(names) > 3 else "")
    return (f"{len(names)} {ORBAX_STEP}{'s' if len(names) > 1 else ''} ({shown}), which resume() adopts "
            "(the newest good one, at its epoch) and never changes or deletes")


# ------------------------------------------------------------------ a folder of model files


def file_kind(file: ModelFile) -> str:
    """What wrote a model file: resumable (a checksum record), else Keras' BackupAndRestore or
    ModelCheckpoint (no record: one resume() adopts by its epoch)."""
    if file.status != UNRECORDED:
        return "resumable model file"
    return KERAS_BACKUP if file.name == BACKUP_WEIGHTS else KERAS_FILE


def file_epochs(folder: FileFolder) -> dict[str, int | None]:
    """The epoch of each file without a record, as `resume()` reads it: from the name (Keras'
    ModelCheckpoint), or from the backup's ``training_metadata.json``; None: not settled."""
    names = [f.name for f in folder.files]
    epochs = {f.name: epoch_in_name(f.name, names) for f in folder.files if f.status == UNRECORDED}
    if BACKUP_WEIGHTS in epochs:
        options = next(f.storage_options for f in folder.files if f.name == BACKUP_WEIGHTS)
        epochs[BACKUP_WEIGHTS] = _backup_epoch(folder.url, dict(options) if options else None)
    return epochs


def file_problem(file: ModelFile, epoch: int | None) -> str:
    """The line about a file without a checksum record: what it is and what resume() does with it."""
    kind = file_kind(file)
    if epoch is None:
        return (f"a {kind} without an epoch in its name: resume() does not adopt it (the epoch is "
                "never guessed); no checksum record to verify it against")
    where = "from its training_metadata.json" if kind == KERAS_BACKUP else "from its name"
    by = "resume(build_model=...)" if file.name.endswith(".weights.h5") else "resume()"  # weights only
    return f"a {kind} (epoch {epoch}, {where}), adopted by {by}; no checksum record to verify it against"


def newest_adoptable(folder: FileFolder, epochs: dict[str, int | None]) -> str | None:
    """The file without a record that resume() tries first, as ``name (kind, epoch N)``."""
    dated = [(epoch, f.saved.timestamp() if f.saved else 0.0, f) for f in folder.files
             if (epoch := epochs.get(f.name)) is not None]
    if not dated:
        return None
    epoch, _, file = max(dated, key=lambda t: (t[0], t[1], t[2].name))
    return f"{file.name} (a {file_kind(file)}, epoch {epoch})"


def _backup_epoch(url: str, storage_options: dict[str, Any] | None) -> int | None:
    folder = RunFolder(url, storage_options=storage_options)
    data = folder.read(folder.path(BACKUP_METADATA), 4096)
    if not isinstance(data, bytes):
        return None
    try:
        return int(json.loads(data)["epoch"])
    except (ValueError, KeyError, TypeError):
        return None


__all__ = ["ADOPTABLE", "KERAS_BACKUP", "KERAS_FILE", "ORBAX_STEP", "file_epochs", "file_kind",
           "file_problem", "is_orbax_step", "kind_of", "newest_adoptable", "orbax_steps", "problem_text",
           "status_text", "steps_line"]
