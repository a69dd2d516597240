"""`Arrival`: a checkpoint's files coming down in a thread, each usable as soon as it has landed.

A resume from a bucket reads a big checkpoint's shards while the next ones download: the
storage layer fetches the other files first and then those the loader names, in that order
(`RunStorage.fetch`'s ``last``), announcing each file once it is in place and its checksum
checked. The loader asks for a file with `wait_for`, which returns when that file has landed,
or raises the fetch's error (a damaged file: CorruptCheckpointError). Nothing unchecked is
ever handed out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

from resumable.manager.background import Worker, wait_for

Fetch = Callable[[Callable[[str], None]], Path]  # fetch(landed) -> the folder, all files checked


class Arrival:
    """The files of one checkpoint folder, arriving (see the module docstring).

    ``fetch(landed)`` runs in a thread and calls ``landed(rel)`` for each of ``files`` once
    in place; it brings down all but ``streamed`` first. Use as a context manager, or call
    `close`: it waits for the thread, which stops after the file it is on when closed early.
    """

    def __init__(self, folder: Path, fetch: Fetch, files: Iterable[str], streamed: Iterable[str]) -> None:
        self.folder = folder
        self._first = set(files) - set(streamed)
        self._landed: set[str] = set()
        self._done = False
        self._closing = False
        # One job, the fetch; the worker keeps its error. Not waited for at exit: nothing is lost.
        self._worker: Worker[Fetch] = Worker("resumable-arrival", self._run)
        self._changed = self._worker.cond
        self._worker.enqueue(fetch)

    @classmethod
    def already_here(cls, folder: Path) -> Arrival:
        """A folder whose files are all in place and checked (a local run's own folder)."""
        return cls(folder, lambda landed: folder, (), ())

    def wait_first(self) -> Path:
        """The folder, once every file but the streamed ones has landed (they come last)."""
        self._wait(lambda: self._first <= self._landed)
        return self.folder

    def wait_for(self, rel: str) -> Path:
        """The local path of file ``rel`` once it has landed (once all have, for a file the
        checkpoint does not hold: the caller finds it missing)."""
        self._wait(lambda: rel in self._landed)
        return self.folder / rel

    def result(self) -> Path:
        """The folder, once every file has landed."""
        self._wait(lambda: self._done)
        return self.folder

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Until ``ready()``; raises the fetch's error if it failed first."""
        with self._changed:
            wait_for(self._changed, lambda: ready() or self._done or self._worker.error is not None)
            error = self._worker.error
            if not ready() and error is not None:
                raise error

    def close(self) -> None:
        """Stop after the file being fetched now, and wait for that."""
        with self._changed:
            self._closing = True
        with self._changed:  # the fetch's error is its waiters', not close()'s
            wait_for(self._changed, self._worker.idle)

    def __enter__(self) -> Arrival:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self, fetch: Fetch) -> None:
        """In the worker thread; what it raises, the worker keeps for the waiting thread."""
        try:
            fetch(self._land)
        except _Closed:
            raise RuntimeError("closed before all files came down") from None
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def _land(self, rel: str) -> None:
        with self._changed:
            self._landed.add(rel)
            self._changed.notify_all()
            if self._closing:
                raise _Closed()


class _Closed(BaseException):
    """Ends the fetch of a closed Arrival between two files (never seen outside)."""
