"""Lands staged single files at their final names in a background thread (resumable.ModelCheckpoint).

One file in flight and one waiting. A newer save of the same file replaces the waiting one (it
would be overwritten anyway); a save of another file while one waits blocks until the slot is
free, so no file Keras would have written is dropped and the staging folder holds at most three
files. A failed landing is retried with backoff by the storage layer; if it still fails it is
warned about at once and raised by the next `wait` (the end of ``fit``). At interpreter exit
the pending files land first.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resumable.core.errors import ResumableError
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
        self._cond = threading.Condition()
        self._in_flight: FileJob | None = None
        self._waiting: FileJob | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.landed: list[str] = []  # URLs landed, in order
        _live.add(self)

    @property
    def pending(self) -> list[str]:
        with self._cond:
            return [j.target.url for j in (self._in_flight, self._waiting) if j is not None]

    def submit(self, job: FileJob) -> None:
        """Land ``job``; in the background unless ``background=False`` (then errors raise here)."""
        if not self.background:
            self._land(job)
            return
        with self._cond:
            while self._waiting is not None and self._waiting.target.url != job.target.url:
                self._cond.wait()  # one waiting at most: training waits for the slot
            if self._waiting is not None:
                _drop(self._waiting)  # the same file, saved again: the newer one wins
            self._waiting = job
            self._cond.notify_all()
            if self._thread is None or not self._thread.is_alive():
                _register_exit_hook()
                self._thread = threading.Thread(target=self._work, name="resumable-file-writer", daemon=True)
                self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted file landed; raise the last failure. False on timeout."""
        with self._cond:
            done = self._cond.wait_for(lambda: self._in_flight is None and self._waiting is None, timeout)
            error, self._error = self._error, None
        if error is not None:
            raise ResumableError(f"resumable: could not write a checkpoint file: {error}") from error
        return done

    def _work(self) -> None:
        while True:
            with self._cond:
                if self._waiting is None:
                    self._thread = None
                    self._cond.notify_all()
                    return
                job, self._waiting = self._waiting, None
                self._in_flight = job
                self._cond.notify_all()
            try:
                self._land(job)
            except BaseException as e:  # noqa: BLE001 - reported by wait(), warned now
                warnings.warn(f"resumable: could not write {job.target.url}: {e}", stacklevel=1)
                with self._cond:
                    self._error = e
            finally:
                _drop(job)
                with self._cond:
                    self._in_flight = None
                    self._cond.notify_all()

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


_live: weakref.WeakSet[FileWriter] = weakref.WeakSet()
_hook_registered = False


def _register_exit_hook() -> None:
    global _hook_registered
    if not _hook_registered:
        _hook_registered = True
        atexit.register(_wait_at_exit)


def _wait_at_exit() -> None:
    """At interpreter exit, the files still pending land first."""
    for writer in list(_live):
        pending = writer.pending
        if not pending:
            continue
        print(f"resumable: finishing the upload of {', '.join(pending)} before exiting ...",
              file=sys.stderr, flush=True)
        try:
            writer.wait()
        except Exception as e:  # noqa: BLE001 - exiting anyway
            print(f"resumable: {e}", file=sys.stderr)


__all__ = ["FileJob", "FileWriter"]
