"""The two seams where the manager hands work and news up to its caller, without knowing it.

The manager imports no Keras, yet a save needs the Keras side twice in the uploader's thread:
to write a checkpoint's files (a snapshot held in memory) and to hear what became of the save.
Both are interfaces defined here, in the manager's layer, and implemented above it:

1. `Files`: a checkpoint's files, carried by the save job (`commits.SaveJob`) and written
   by its commit (`commits`): straight into the run folder in a local run, into a staging
   folder otherwise. ``write(folder, root)`` returns each file's size and CRC32C as written.
2. `SaveListener`: the events of a save, in the thread they happen in: ``committed(info)``
   after each commit and its retention (the uploader's thread), ``skipped(line)`` when a newer
   checkpoint replaced one that waited for its upload (training's thread).

The manager calls them only through the functions below: every call from the manager up into
the layer above runs through this one file, and `benchmarks/save_path.py` counts those calls
apart from layer climbs. A save that fails is said by the uploader as a warning and raised by
the next `wait`; it is no event of its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from resumable.core.manifest import FileEntry
from resumable.storage import CheckpointInfo

logger = logging.getLogger("resumable")


class Files(Protocol):
    """A checkpoint's files not written yet (a snapshot in memory), written by its save job."""

    def write(self, folder: Path, root: str | None) -> dict[str, FileEntry]:
        """Write the files into ``folder`` (below the run folder ``root``, or a staging folder when
        ``root`` is None); each one's size and CRC32C, computed as it was written."""
        ...


class SaveListener(Protocol):
    """What becomes of each save, told to the caller (the Keras callback's `CommitLines`)."""

    def committed(self, info: CheckpointInfo) -> None:
        """A checkpoint was committed and retention applied (the uploader's thread)."""
        ...

    def skipped(self, line: str) -> None:
        """A checkpoint waiting for its upload was replaced by a newer one: the line saying so."""
        ...


def write_files(files: Files, folder: Path, root: str | None) -> dict[str, FileEntry]:
    """Step 2 of a commit, the caller's part: the files written, each one's size and CRC32C."""
    return files.write(folder, root)


def tell_committed(listener: SaveListener | None, info: CheckpointInfo) -> None:
    if listener is not None:
        listener.committed(info)


def tell_skipped(listener: SaveListener | None, line: str) -> None:
    """The line to the listener, or logged as a warning without one."""
    if listener is not None:
        listener.skipped(line)
    else:
        logger.warning("%s", line)


__all__ = ["Files", "SaveListener", "tell_committed", "tell_skipped", "write_files"]
