"""What a writer leaves behind, for tests that check a reader left none: the objects built, the
threads started, the run folder's files and times."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from resumable import RunStorage


def instances(kind: type) -> int:
    """How many objects of ``kind`` this process holds now."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


def run_folder(storage: RunStorage) -> dict[str, tuple[Any, ...]]:
    """Every file under the run folder: its size and whatever modification time the backend keeps."""
    found = storage.fs.find(storage.root, detail=True)
    return {path: (info.get("size"), info.get("mtime"), info.get("updated"), info.get("created"),
                   info.get("generation")) for path, info in found.items()}


def new_threads(before: set[threading.Thread]) -> set[str]:
    """The names of threads alive now that were not ``before`` (a download's own thread ends when
    it is done: waited for up to 10 s)."""
    deadline = time.monotonic() + 10
    while (extra := set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {t.name for t in extra}
