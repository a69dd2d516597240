"""A process's part of a checkpoint of a model split across the processes of a multi-host job.

Training waits for `snapshot` alone: every process copies the shards of replica 0 its devices
hold into host memory (never a whole split variable), process 0 also the listing
(``variables.json``), ``state.json`` and the arrays. The save job then writes the part in the
uploader's thread (`PartSnapshot.write`: one zarr array per variable, through TensorStore, into
this process's staging folder), and the manager's `commits.Parts` uploads it and commits it with
every other process's (`resumable.manager.job_commit`). Resuming such a checkpoint is
`multihost`'s job; the layout on disk is described there.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import shutil
from pathlib import Path
from typing import Any

import keras
import numpy as np

from resumable.core.errors import ResumableError
from resumable.core.manifest import FileEntry
from resumable.keras import topology
from resumable.keras.checkpoint import model_to_files, training_state
from resumable.keras.checkpoint.snapshot import ARRAYS_FILE, SPACE_MARGIN, STATE_FILE
from resumable.keras.multihost import shard_io

VARIABLES_FILE = "variables.json"
VARIABLES_FOLDER = "variables"
FORMAT = "resumable.variables"
FORMAT_VERSION = 1



@dataclasses.dataclass
class PartSnapshot:
    """This process's part of a checkpoint, in host memory; `write` makes its files (as `ModelSnapshot`)."""

    chief: bool
    variables: list[shard_io.OwnedShards]
    listing: dict[str, Any] | None = None  # variables.json: process 0's
    state: dict[str, Any] | None = None  # state.json: process 0's
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    payload: str = VARIABLES_FILE
    spent: bool = False  # written once: the shards' memory went as each variable landed on disk

    @property
    def nbytes(self) -> int:
        """Bytes held in memory: this process's shards (never a whole split variable) and arrays."""
        return sum(v.nbytes for v in self.variables) + sum(int(a.nbytes) for a in self.arrays.values())

    def fits_in(self, folder: Path) -> bool:
        """Always True: no process of the job skips a save alone (the others would wait for its
        part); a full disk fails `write`, and the round fails for every process."""
        return True

    def write(self, folder: Path, root: str | None = None) -> dict[str, FileEntry]:
        """Write this process's files of the checkpoint into ``folder`` (created if needed), a staging
        folder: TensorStore writes the chunks, so their CRC32Cs are taken as they are uploaded
        (`Committer.upload`) and none is returned here. ``root`` must be None: a part is never
        written into a run folder in place (`RunManager.writes_in_place`).

        OSError(ENOSPC) before anything is written when the disk cannot hold them.
        """
        if root is not None:
            raise ValueError(f"{folder}: a process's part of a checkpoint is staged, never written in place")
        existing = folder
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if self.spent:
            raise ResumableError(f"{folder}: this part of a checkpoint was written once already")
        if shutil.disk_usage(existing).free < self.nbytes + SPACE_MARGIN:
            raise OSError(errno.ENOSPC, f"{self.nbytes + SPACE_MARGIN:,} bytes needed", str(folder))
        self.spent = True
        folder.mkdir(parents=True, exist_ok=True)
        for i, owned in enumerate(self.variables):
            shard_io.write(folder / VARIABLES_FOLDER / str(i), owned, create=self.chief)
            owned.shards = []  # on disk: the memory goes now, not after the whole part
        if self.chief:
            (folder / VARIABLES_FILE).write_text(json.dumps(self.listing, indent=1))
            (folder / STATE_FILE).write_text(json.dumps(self.state, indent=1))
            if self.arrays:
                np.savez(folder / ARRAYS_FILE, **self.arrays)  # type: ignore[arg-type]
        return {}


def snapshot(model: keras.Model, *, state: dict[str, Any], arrays: dict[str, np.ndarray]) -> PartSnapshot:
    """This process's part of a checkpoint of ``model``, copied to host memory now (what training waits for).

    Every process takes the shards of replica 0 its devices hold; process 0 also the listing,
    ``state.json`` and the arrays (seed generator states, metrics, callbacks' arrays).
    """
    index = topology.process_index()
    variables = model_variables(model)
    shard_io.start_transfers([v.value for v in variables], index)
    owned = [shard_io.take(v.value, index) for v in variables]
    if index != 0:
        return PartSnapshot(False, owned)
    listing = {"format": FORMAT, "format_version": FORMAT_VERSION, "processes": topology.process_count(),
               "variables": [{"path": v.path, "shape": list(o.shape), "dtype": o.dtype}
                             for v, o in zip(variables, owned, strict=True)]}
    # Copies: a JAX step may donate the buffers these arrays view.
    held = {key: np.array(value, copy=True)
            for key, value in {**arrays, **training_state.seed_generator_arrays(model)}.items()}
    return PartSnapshot(True, owned, listing, model_to_files.checkpoint_state(model, state), held)


def model_variables(model: keras.Model) -> list[Any]:
    """What a checkpoint of a split model holds as arrays: the weights, then the optimizer's variables."""
    optimizer = getattr(model, "optimizer", None)
    extra = list(optimizer.variables) if optimizer is not None and optimizer.built else []
    return list(model.weights) + extra


__all__ = ["FORMAT", "FORMAT_VERSION", "VARIABLES_FILE", "VARIABLES_FOLDER", "PartSnapshot",
           "model_variables", "snapshot"]
