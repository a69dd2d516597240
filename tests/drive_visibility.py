"""One Google Drive folder seen from two Colab runtimes, each seeing the other's writes late.

Each runtime mounts Drive through its own FUSE client: its own writes show in its mount at
once, another runtime's only once both clients have synced (seconds; sometimes much longer).
`DelayedDrive` models that with two real local folders, one per machine (``a`` and ``b``): a
thread copies every change made in one (a file created, rewritten or deleted) into the other
``delay`` seconds after it was seen, the later change winning where both changed a file, as
Drive's last writer does. Exclusive creates and ``flock`` hold within one view only: across
the two nothing is atomic, as across two Drive clients.

Example:

```python
with DelayedDrive(tmp_path, delay=0.4) as drive:
    ...                       # one writer in drive.a, another in drive.b
drive.settle()                # both views the same again
```
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POLL = 0.02  # seconds between two looks at each view


@dataclass(frozen=True)
class Change:
    """A file of one view, as seen at ``when``: its bytes, or None once deleted."""

    rel: str
    data: bytes | None
    when: float


class DelayedDrive:
    """Two views of one folder that sync with a delay (see the module docstring)."""

    def __init__(self, root: Path, delay: float) -> None:
        self.a, self.b = root / "a", root / "b"
        self.a.mkdir(parents=True, exist_ok=True)
        self.b.mkdir(parents=True, exist_ok=True)
        self.delay = delay
        self._seen: dict[Path, dict[str, tuple[int, int]]] = {self.a: {}, self.b: {}}
        self._written: dict[Path, dict[str, bytes | None]] = {self.a: {}, self.b: {}}  # our own copies
        self._changed_at: dict[Path, dict[str, float]] = {self.a: {}, self.b: {}}
        self._queue: list[tuple[float, Path, Change]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delayed-drive", daemon=True)

    def __enter__(self) -> DelayedDrive:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def settle(self, quiet: float = 1.0) -> None:
        """Sync until nothing changed for ``quiet`` seconds past the delay; then both views match."""
        if not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="delayed-drive", daemon=True)
            self._thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(self.delay + quiet)
            if not self._queue and self.files(self.a) == self.files(self.b):
                return
        raise AssertionError("the two views never settled")

    @staticmethod
    def files(view: Path) -> dict[str, bytes]:
        found = sorted(view.rglob("*"))
        return {p.relative_to(view).as_posix(): p.read_bytes() for p in found if p.is_file()}

    # ------------------------------------------------------------------ the sync thread

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for view, other in ((self.a, self.b), (self.b, self.a)):
                for change in self._changes(view, now):
                    self._queue.append((now + self.delay, other, change))
            due = [item for item in self._queue if item[0] <= now]
            self._queue = [item for item in self._queue if item[0] > now]
            for _, view, change in sorted(due, key=lambda item: item[2].when):
                self._apply(view, change)
            time.sleep(POLL)

    def _changes(self, view: Path, now: float) -> list[Change]:
        """What changed in ``view`` since the last look, not counting the copies we wrote there."""
        current: dict[str, tuple[int, int]] = {}
        for path in view.rglob("*"):
            try:
                stat = path.lstat()
            except FileNotFoundError:
                continue
            if path.is_file():
                current[path.relative_to(view).as_posix()] = (stat.st_mtime_ns, stat.st_size)
        before, written = self._seen[view], self._written[view]
        changes = []
        for rel in sorted(set(before) | set(current)):
            if before.get(rel) == current.get(rel):
                continue
            data = _read(view / rel) if rel in current else None
            if rel in written and written[rel] == data:
                del written[rel]  # our own copy landing: not a change of this machine
                continue
            self._changed_at[view][rel] = now
            changes.append(Change(rel, data, now))
        self._seen[view] = current
        return changes

    def _apply(self, view: Path, change: Change) -> None:
        """The other machine's change, unless this one changed the file later (last writer wins)."""
        if self._changed_at[view].get(change.rel, -1.0) > change.when:
            return
        path = view / change.rel
        self._written[view][change.rel] = change.data
        if change.data is None:
            try:
                path.unlink()
            except FileNotFoundError:
                self._written[view].pop(change.rel, None)
            _remove_empty_parents(path.parent, view)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.drive-sync")
        temporary.write_bytes(change.data)
        os.replace(temporary, path)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None


def _remove_empty_parents(folder: Path, view: Path) -> None:
    while folder != view and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
