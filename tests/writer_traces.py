"""What a writer leaves behind, for tests that check a reader left none: the objects built, the
threads started, the run folder's files and times."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from resumable import RunStorage


@contextmanager
def built(*kinds: type) -> Iterator[Counter[str]]:
    """Count the objects of each of ``kinds`` built inside the block (calls of its ``__init__``),
    by class name. Counting constructions, not the objects alive after, also catches one built
    and already let go; and it costs nothing however large the heap (a gc scan late in a whole
    suite took a minute)."""
    counts: Counter[str] = Counter()
    originals = {kind: kind.__dict__["__init__"] for kind in kinds}

    def counting(kind: type, init: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            counts[kind.__name__] += 1
            init(self, *args, **kwargs)
        return __init__

    for kind, init in originals.items():
        kind.__init__ = counting(kind, init)  # type: ignore[misc]
    try:
        yield counts
    finally:
        for kind, init in originals.items():
            kind.__init__ = init  # type: ignore[misc]


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
