"""The lines `CheckpointCallback` prints: one per commit (with ``verbose``), one per checkpoint
skipped while uploads fall behind, and the no-space lines; one message per event.

While a fit runs, a line from the uploader's thread waits for the training thread: it is printed
at the next epoch start (before Keras' header), the end of training, or a batch end when no
progress bar is drawn: never in the middle of a progress bar.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from resumable.core.display import human_size
from resumable.manager import CheckpointInfo, free_space


class CommitLines:
    """The commit and skip lines of one callback, held while a fit draws its progress bar: the
    callback's `resumable.manager.listener.SaveListener` (`committed`, `skipped`)."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.save_started = time.monotonic()  # the newest save's start, for the seconds a commit took
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._defer = False

    def hold(self) -> None:
        """A fit begins: lines wait for `print_lines` from now on."""
        self._defer = True

    def committed(self, info: CheckpointInfo) -> None:
        """After each commit and its retention (in the uploader's thread when uploading in the
        background): with ``verbose``, one line."""
        if not self.verbose:
            return
        batch = info.manifest.batch if info.manifest else 0
        epoch = info.epoch or 0
        where = f"Epoch {epoch + 1}, batch {batch}" if batch else f"Epoch {epoch}"
        size = info.manifest.total_size if info.manifest else 0
        seconds = time.monotonic() - self.save_started
        self.say(f"{where}: saved {info.url} ({human_size(size)}, {seconds:.1f} s)")

    def skipped(self, line: str) -> None:
        """A checkpoint waiting for its upload was replaced by a newer one: the manager's line."""
        self.say(line)

    def say(self, line: str) -> None:
        """Print ``line`` now, or while a fit runs at the next point where no progress bar is drawn."""
        with self._lock:
            if self._defer:
                self._lines.append(line)
                return
        print(line, flush=True)

    def print_lines(self, *, fit_ended: bool = False) -> None:
        """Print the lines waiting for the training thread; ``fit_ended``: print later ones at once."""
        with self._lock:
            lines, self._lines = self._lines, []
            if fit_ended:
                self._defer = False
        for line in lines:
            print(line, flush=True)


def no_space_line(name: str, last: CheckpointInfo | None, *, staging_dir: Path | None, root: str,
                  in_background: bool = False) -> str:
    """Why checkpoint ``name`` could not be written: its disk (the staging folder's, or with
    ``staging_dir`` None the run folder ``root``'s), the space needed (as last time) and free.
    ``in_background``: for the save job's failure, whose warning says itself what is kept and retried."""
    needed = f"the last checkpoint took {human_size(last.size)}" if last and last.size else "size unknown"
    then = "" if in_background else "; training goes on and the next save tries again"
    if staging_dir is not None:
        return (f"no space left in the staging folder {staging_dir} to save {name} ({needed}"
                f"{free_space(str(staging_dir))}){then}: free space there, or pass staging_dir= on a "
                "bigger disk")
    return (f"no space left in the run folder {root} to save {name} ({needed}{free_space(root)}){then}: "
            "free space there (empty Drive's trash), or lower keep_last")


__all__ = ["CommitLines", "no_space_line"]
