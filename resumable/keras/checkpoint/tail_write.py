"""A partly copied snapshot's write (#54): started now, in a thread of its own, into a private
folder; training waits only until its live part is written (`snapshot.ModelSnapshot.partial`),
and the save job (the manager's `listener.Files`) takes the files once the copied tail is written.

The write cannot wait for the uploader's thread, which may be busy uploading the previous
checkpoint for minutes: training would wait for that upload too. So it runs in its own thread,
beside the upload, into a new ``<staging>.writing-*`` folder; the save job then moves the files into its
staging folder (a bucket's run) or copies them, checksummed again, into the checkpoint's folder
of a local run (nothing written through a link there: `WrittenFiles`). The private folder goes
with the save job (committed, or dropped unrun when a newer checkpoint replaced it), once the
thread is done.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from resumable.core.manifest import FileEntry
from resumable.manager import PRIVATE_WRITE, WrittenFiles, give_heap_back

COPY_CHUNK = 2**22


class _State:
    """What the thread and the finalizer share (never the `TailWrite` itself, so that a dropped
    job can be collected while its thread runs)."""

    def __init__(self, folder: Path, write: Callable[[Path], dict[str, FileEntry]]) -> None:
        self.folder = folder
        self.write: Callable[[Path], dict[str, FileEntry]] | None = write  # dropped once run
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.entries: dict[str, FileEntry] = {}
        self.error: BaseException | None = None
        self.abandoned = False


class TailWrite:
    """``write(folder)`` run now in a thread, into a new folder beside ``beside``; `write` (the
    save job's) hands the files on once it is done."""

    def __init__(self, write: Callable[[Path], dict[str, FileEntry]], beside: Path) -> None:
        # A folder of its own beside ``beside``: an earlier save of the same name may not be
        # collected yet, and its private folder goes when it is
        beside.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f"{beside.name}{PRIVATE_WRITE}", dir=beside.parent))
        self._state = state = _State(folder, write)
        self._thread = threading.Thread(target=_run, args=(state,), name="resumable-tail-write", daemon=True)
        self._thread.start()
        weakref.finalize(self, _abandon, state)

    def join(self) -> None:
        """Wait until the whole snapshot is written (or failed)."""
        self._state.done.wait()

    def write(self, folder: Path, root: str | None) -> dict[str, FileEntry]:
        """The files, once written, into ``folder``: moved into a staging folder (``root`` None),
        copied into a run's checkpoint folder (below ``root``); each one's size and CRC32C."""
        state = self._state
        state.done.wait()
        if state.error is not None:
            raise state.error
        if root is None:  # a staged commit writes its files once: they move
            entries = _move(state.folder, folder, state.entries)
            shutil.rmtree(state.folder, ignore_errors=True)
            return entries
        # A commit in place that fails after this (its manifest) is retried with these files:
        # the private copy goes with this object (`_abandon`)
        return _copy(state.folder, folder, root, state.entries)


def _run(state: _State) -> None:
    write, state.write = state.write, None
    assert write is not None
    try:
        state.entries = write(state.folder)
    except BaseException as e:  # raised to the save job by `TailWrite.write`
        state.error = e
    # The snapshot goes now, and the heap it leaves behind with it: the copies, and on
    # TensorFlow the buffers its views kept from the variables' copy on write
    del write
    give_heap_back()
    with state.lock:
        state.done.set()
        abandoned = state.abandoned
    if abandoned:
        shutil.rmtree(state.folder, ignore_errors=True)


def _abandon(state: _State) -> None:
    """The save job is gone (committed, or dropped unrun): the private files go, now or when
    the thread ends."""
    with state.lock:
        state.abandoned = True
        done = state.done.is_set()
    if done:
        shutil.rmtree(state.folder, ignore_errors=True)


def _move(source: Path, folder: Path, entries: dict[str, FileEntry]) -> dict[str, FileEntry]:
    """Into a staging folder on the same disk: renamed, the checksums as written."""
    shutil.rmtree(folder, ignore_errors=True)
    for rel in entries:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(source / rel, folder / rel)
    return dict(entries)


def _copy(source: Path, folder: Path, root: str, entries: dict[str, FileEntry]) -> dict[str, FileEntry]:
    """Into the run folder: each file a new one, checksummed as it is copied, which must match."""
    files = WrittenFiles(folder, root)
    try:
        for rel in entries:
            with open(source / rel, "rb") as original, files.create(rel) as copy:
                shutil.copyfileobj(original, copy, COPY_CHUNK)
    finally:
        files.close()
    copied = files.entries
    if copied != entries:
        raise OSError(f"{folder}: the files copied from {source} differ from those written there")
    return copied


__all__ = ["TailWrite"]
