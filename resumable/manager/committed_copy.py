"""`CommittedCopy`: the local copy of the last committed checkpoint, kept until the next save.

After a commit the uploader moves the staged folder here (`keep`) instead of deleting it: a
copy to recover by hand. The next save deletes it first (`drop`). Nothing reads it back:
resume() downloads into its own cache.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

logger = logging.getLogger("resumable")


class CommittedCopy:
    """One folder holding at most one committed checkpoint's staged files, as ``folder/<name>``.

    Args:
        folder: Where the copy goes; None keeps none (staged folders are deleted once committed).
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._lock = threading.Lock()  # the uploader's thread fills it, the training thread empties it

    def drop(self) -> None:
        """Delete the copy: the next save is about to replace it.

        Deleted before that save rather than after it, the copy never doubles the staging disk a
        save needs; and on the benchmark machine, writing a 288 MB checkpoint next to the previous
        one cost 0.5 s more kernel time per save than writing it after deleting that one
        (docs/benchmarks.md).
        """
        if self.folder is None:
            return
        with self._lock:
            self._empty()

    def keep(self, staged: Path, name: str) -> None:
        """Move the committed ``staged`` folder here as ``name``, replacing the copy (or delete it)."""
        if self.folder is None:
            shutil.rmtree(staged, ignore_errors=True)
            return
        try:
            with self._lock:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._empty()
                staged.rename(self.folder / name)
        except OSError as e:  # only a convenience copy: nothing depends on it
            logger.info("resumable: not keeping a local copy of %s: %s", name, e)
            shutil.rmtree(staged, ignore_errors=True)

    def _empty(self) -> None:
        """Delete every copy (the caller holds the lock)."""
        if self.folder is not None and self.folder.is_dir():
            for child in self.folder.iterdir():
                shutil.rmtree(child, ignore_errors=True)


__all__ = ["CommittedCopy"]
