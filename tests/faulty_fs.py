"""A fault-injecting fsspec filesystem for the tests: ``faulty://`` wraps a real one.

It forwards every call to a real filesystem (local, ``memory://`` or gcsfs against the
fake-gcs-server) and fails the calls a `Faults` object chooses, the way Google Drive's FUSE
mount and GCS fail in Colab:

- transient errors (EIO, ENOTCONN "Transport endpoint is not connected", HTTP 429/503) on a
  share of the calls, or on the first N calls;
- a permanent error once a byte budget is spent (ENOSPC, EDQUOT), the last write landing
  only in part, as on a full disk;
- writes cut short: only part of the bytes land, with or without an error;
- late visibility: listings omit what was written in the last few listings.

Example:

```python
faults = Faults(transient_rate=0.3, seed=1)
storage = RunStorage("faulty:///tmp/run", storage_options=faulty_options(faults, "file"))
```

Everything injected is recorded in ``faults.injected`` as ``(operation, path, exception)``.
"""

from __future__ import annotations

import errno
import io
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

PROTOCOL = "faulty"

WRITES = frozenset({"put_file", "pipe_file", "open_write"})
READS = frozenset({"cat_file", "get_file", "open_read", "info"})
LISTINGS = frozenset({"find", "ls", "isdir"})
DELETES = frozenset({"rm_file"})
ALL = WRITES | READS | LISTINGS | DELETES


def eio() -> Exception:
    return OSError(errno.EIO, "Input/output error")


def enotconn() -> Exception:
    return OSError(errno.ENOTCONN, "Transport endpoint is not connected")


def http(code: int) -> Callable[[], Exception]:
    """A gcsfs HttpError, as gcsfs raises it for GCS' JSON error answers."""

    def make() -> Exception:
        from gcsfs.retry import HttpError

        reason = {429: "rateLimitExceeded", 503: "backendError"}.get(code, "error")
        return HttpError({"code": code, "message": f"{reason}\nWe encountered an internal error."})

    return make


@dataclass
class Faults:
    """Which calls fail, and how. Mutable: a test may change it between calls.

    Args:
        ops: The operations transient errors hit (names in WRITES, READS, LISTINGS, DELETES).
        transient_rate: Share of the calls in ``ops`` that fail with ``transient()``.
        fail_first: The first N calls in ``ops`` fail with ``transient()``, whatever the rate.
        transient: Builds the transient error.
        budget: Bytes that writes may still store; the write that exceeds it stores what fits
            and raises ``budget_error()``, and so does every write after it.
        budget_error: Builds the error of a spent budget. Defaults to ENOSPC.
        cut_short: The next N writes store only half their bytes.
        cut_short_raises: Whether a cut-short write raises (a dropped connection) or reports
            success (a short write nobody noticed).
        cut_only: Cut short only writes whose path ends with this. Defaults to any path.
        hide_new: A path written is missing from the next N listings (late visibility).
        seed: For ``transient_rate``.
    """

    ops: frozenset[str] = ALL
    transient_rate: float = 0.0
    fail_first: int = 0
    transient: Callable[[], Exception] = eio
    budget: int | None = None
    budget_error: Callable[[], Exception] = lambda: OSError(errno.ENOSPC, "No space left on device")
    cut_short: int = 0
    cut_short_raises: bool = False
    cut_only: str = ""
    hide_new: int = 0
    seed: int = 0
    calls: list[tuple[str, str]] = field(default_factory=list)
    injected: list[tuple[str, str, Exception]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()
        self._hidden: dict[str, int] = {}  # path -> listings it still misses

    def count(self, op: str) -> int:
        return sum(1 for name, _ in self.calls if name == op)

    def injected_in(self, *ops: str) -> list[tuple[str, str, Exception]]:
        return [entry for entry in self.injected if entry[0] in ops]

    def heal(self) -> None:
        """Stop injecting anything (the mount reconnected, the disk was cleaned up)."""
        with self._lock:
            self.transient_rate, self.fail_first, self.budget, self.cut_short = 0.0, 0, None, 0
            self.hide_new = 0
            self._hidden.clear()

    # called by FaultyFileSystem

    def before(self, op: str, path: str) -> None:
        with self._lock:
            self.calls.append((op, path))
            if op not in self.ops:
                return
            fail = self.fail_first > 0
            if fail:
                self.fail_first -= 1
            elif self.transient_rate and self._random.random() < self.transient_rate:
                fail = True
            if fail:
                error = self.transient()
                self.injected.append((op, path, error))
                raise error

    def allowed(self, op: str, path: str, size: int) -> tuple[int, Exception | None]:
        """How many of ``size`` bytes this write stores, and the error it raises after."""
        with self._lock:
            if self.budget is not None and size > self.budget:
                error = self.budget_error()
                stored, self.budget = self.budget, 0
                self.injected.append((op, path, error))
                return stored, error
            if self.budget is not None:
                self.budget -= size
            if self.cut_short > 0 and path.endswith(self.cut_only):
                self.cut_short -= 1
                raised = eio() if self.cut_short_raises else None
                self.injected.append((op, path, raised or OSError(errno.EIO, "short write")))
                return size // 2, raised
            return size, None

    def written(self, path: str) -> None:
        with self._lock:
            if self.hide_new:
                self._hidden[path] = self.hide_new

    def visible(self, paths: list[str]) -> set[str]:
        """The paths a listing shows now; each call counts one listing for the hidden ones."""
        with self._lock:
            hidden = {p for p in paths if self._hidden.get(p, 0) > 0}
            for path in list(self._hidden):
                self._hidden[path] -= 1
                if self._hidden[path] <= 0:
                    del self._hidden[path]
            return set(paths) - hidden


class FaultyFileSystem(AbstractFileSystem):
    """Forwards to ``target_protocol``'s filesystem; ``faults`` says what fails."""

    protocol = PROTOCOL
    root_marker = ""
    cachable = False  # every test gets its own faults

    def __init__(self, target_protocol: str = "file", target_options: dict[str, Any] | None = None,
                 faults: Faults | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        options = dict(target_options or {})
        if target_protocol == "file":
            options.setdefault("auto_mkdir", True)  # as GCS: no folders to create first
        self.target = fsspec.filesystem(target_protocol, **options)
        self.target_protocol = target_protocol
        self.faults = faults or Faults()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3:]
        return path.rstrip("/") or path

    # ----------------------------------------------------------------- listing

    def _visible(self, found: dict[str, Any]) -> dict[str, Any]:
        shown = self.faults.visible([p for p, d in found.items() if d.get("type") != "directory"])
        return {p: d for p, d in found.items() if d.get("type") == "directory" or p in shown}

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        self.faults.before("find", path)
        self._fresh(path)
        found = self.target.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=True, **kwargs)
        found = self._visible(dict(found))
        return found if detail else sorted(found)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self.faults.before("ls", path)
        self._fresh(path)
        entries = self.target.ls(path, detail=True, **kwargs)
        found = self._visible({e["name"]: e for e in entries})
        entries = [e for e in entries if e["name"] in found]
        return entries if detail else [e["name"] for e in entries]

    def isdir(self, path: str) -> bool:
        self.faults.before("isdir", path)
        return bool(self.target.isdir(path))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.faults.before("info", path)
        return dict(self.target.info(path, **kwargs))

    def _fresh(self, path: str) -> None:
        if hasattr(self.target, "invalidate_cache"):
            self.target.invalidate_cache(path)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.target.invalidate_cache(path)

    # ----------------------------------------------------------------- reading

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        self.faults.before("cat_file", path)
        return bytes(self.target.cat_file(path, start=start, end=end, **kwargs))

    def get_file(self, rpath: str, lpath: str, callback: Any = None, **kwargs: Any) -> None:
        self.faults.before("get_file", rpath)
        self.target.get_file(rpath, lpath, **kwargs)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            self.faults.before("open_read", path)
            return self.target.open(path, mode, **kwargs)
        self.faults.before("open_write", path)
        return _Buffered(self, path, mode)

    # ----------------------------------------------------------------- writing

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self.faults.before("pipe_file", path)
        self._store("pipe_file", path, bytes(value), create=mode == "create")

    def put_file(self, lpath: str, rpath: str, callback: Any = None, **kwargs: Any) -> None:
        self.faults.before("put_file", rpath)
        with open(lpath, "rb") as f:
            self._store("put_file", rpath, f.read())

    def _store(self, op: str, path: str, data: bytes, create: bool = False) -> None:
        stored, error = self.faults.allowed(op, path, len(data))
        if create:
            if self.target_protocol == "file":
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "xb") as f:  # exclusive create, as the real thing
                    f.write(data[:stored])
            else:
                self.target.pipe_file(path, data[:stored], mode="create")
        else:
            self.target.pipe_file(path, data[:stored])
        self.faults.written(path)
        if error is not None:
            raise error

    def rm_file(self, path: str) -> None:
        self.faults.before("rm_file", path)
        self.target.rm_file(path)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        self.target.rm(path, recursive=recursive, maxdepth=maxdepth)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.target.mkdir(path, create_parents=create_parents, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.target.makedirs(path, exist_ok=exist_ok)


class _Buffered(io.BytesIO):
    """A file opened for writing: its bytes are stored on close, through the faults."""

    def __init__(self, fs: FaultyFileSystem, path: str, mode: str) -> None:
        super().__init__()
        self.fs, self.path, self.create = fs, path, "x" in mode

    def close(self) -> None:
        if not self.closed:
            data = self.getvalue()
            super().close()
            self.fs._store("open_write", self.path, data, create=self.create)


fsspec.register_implementation(PROTOCOL, FaultyFileSystem, clobber=True)


def faulty_options(faults: Faults, target_protocol: str, **target_options: Any) -> dict[str, Any]:
    """``storage_options`` for a RunStorage on ``faulty://``."""
    return {"target_protocol": target_protocol, "target_options": target_options, "faults": faults}


def faulty_url(real_url: str) -> tuple[str, str]:
    """``(faulty:// URL, target protocol)`` for a local path, ``memory://...`` or ``gs://...``."""
    protocol, _, rest = real_url.partition("://")
    if not rest:
        return f"{PROTOCOL}://{os.path.abspath(real_url)}", "file"
    if protocol == "memory":
        return f"{PROTOCOL}:///{rest}", "memory"
    return f"{PROTOCOL}://{rest}", protocol
