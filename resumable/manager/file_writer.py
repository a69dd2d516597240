"""Lands staged single files at their final names in a background thread (resumable.ModelCheckpoint).

One file in flight and one waiting. A newer save of the same file replaces the waiting one (it
would be overwritten anyway); a save of another file while one waits blocks until the slot is
free, so no file Keras would have written is dropped and the staging folder holds at most three
files. A failed landing is retried with backoff by the storage layer; if it still fails it is
warned about at once, and the first such failure is raised by the next `wait` (the end of
``fit``). At interpreter exit the pending files land first (`background.Worker`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resumable.core import user_warnings
from resumable.core.errors import ResumableError
from resumable.manager.background import Worker
from resumable.storage.single_file import FileRecord, FileTarget

logger = logging.getLogger("resumable")


@dataclass
class FileJob:
    """One staged file and where it goes."""

    local: Path
    target: FileTarget
    details: dict[str, Any] = field(default_factory=dict)
    on_landed: Callable[[FileRecord], None] | None = None


class FileWriter:
    """Puts staged files at their URLs, in a background thread or (``background=False``) at once."""

    def __init__(self, *, background: bool = True) -> None:
        self.background = background
        self._worker: Worker[FileJob] = Worker("resumable-file-writer", self._land_staged,
                                               at_exit=self._wait_at_exit)
        self.landed: list[str] = []  # URLs landed, in order

    @property
    def pending(self) -> list[str]:
        worker = self._worker
        with worker.cond:
            return [j.target.url for j in (worker.in_flight, worker.waiting) if j is not None]

    def write_later(self, job: FileJob) -> None:
        """Land ``job``, later: in the background, returning at once; with ``background=False``
        now, in this thread (then errors raise here)."""
        if not self.background:
            self._land(job)
            return
        # One waiting at most: training waits for the slot, unless the same file is saved again
        # (the newer one wins).
        replaced = self._worker.enqueue(job, replaces=lambda waiting: waiting.target.url == job.target.url)
        if replaced is not None:
            _drop(replaced)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every file given to `write_later` landed; raise the first failure. False on timeout."""
        return self._worker.join(timeout)

    def _wait_at_exit(self) -> None:
        """At interpreter exit, the files still pending land first."""
        pending = self.pending
        if not pending:
            return
        print(f"resumable: finishing the upload of {', '.join(pending)} before exiting ...",
              file=sys.stderr, flush=True)
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 - exiting anyway
            print(f"resumable: {e}", file=sys.stderr)

    def _land_staged(self, job: FileJob) -> None:
        """In the worker thread: a failure is warned about now and raised by the next wait()."""
        try:
            self._land(job)
        except BaseException as e:
            user_warnings.warn(f"resumable: could not write {job.target.url}: {e}")
            raise ResumableError(f"resumable: could not write a checkpoint file: {e}") from e
        finally:
            _drop(job)

    def _land(self, job: FileJob) -> None:
        try:
            record = job.target.land(job.local, job.details)
        finally:
            if not self.background:
                _drop(job)
        self.landed.append(job.target.url)
        logger.info("resumable: wrote %s (%d bytes)", job.target.url, record.size)
        if job.on_landed is not None:
            job.on_landed(record)


def _drop(job: FileJob) -> None:
    with contextlib.suppress(OSError):
        job.local.unlink()
    with contextlib.suppress(OSError):
        job.local.parent.rmdir()


__all__ = ["FileJob", "FileWriter"]
