"""Faults on the local and Google Drive code paths, which `faulty_fs` cannot reach.

A local run folder (Drive's FUSE mount is one) is written with ``os.fsync``, ``os.replace``,
``os.link``, ``fcntl.flock``, exclusive creates (``open(.., "xb")``) and plain reads: calls
that go to the OS, not through an fsspec filesystem. `LocalFaults` patches those functions
for the length of a test and fails the calls it is told to, the way Drive's mount fails:

- an errno (EIO: a failed upload, ENOTCONN: the mount reconnecting, ENOSPC: a full disk or
  quota, EPERM: no hard links) on the Nth matching call, for a number of calls, or for
  every call from then on (an outage longer than any retry budget);
- stale reads (the bytes a file held when `stale` was called) and short reads (half of them);
- renames that are not atomic (``os.replace`` = delete, then write), with a hook or a `Crash`
  between the two;
- writes that fail part-way (`fail("write", ...)`: half the bytes land, then the error).

Only paths under the given roots (the run folder, a download cache) are touched; every other
call goes straight through. Calls that
take a descriptor (fsync, flock, dir_fd opens) are matched by the path /proc/self/fd names.

Example:

```python
def test_x(monkeypatch):
    faults = inject(monkeypatch, run_dir)  # and any other folder to watch: inject(monkeypatch, run, cache)
    faults.fail("fsync", path="manifest.json", errno=errno.EIO)          # the first one only
    faults.fail("fsync", path="ckpt-000002", times=None)                  # every one: an outage
```

Everything injected is recorded in ``faults.injected`` as ``(op, path, exception)``.
"""

from __future__ import annotations

import builtins
import errno as errnos
import fcntl
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

OPS = frozenset({"fsync", "replace", "link", "flock", "create", "open_write", "open_read", "write",
                 "unlink", "ftruncate"})


class Crash(BaseException):
    """Raised where the process would die (a kill between two steps of a non-atomic rename)."""


@dataclass
class Fault:
    """Fail calls of ``op`` whose path ends with ``path``: from the ``nth`` such call, ``times`` of them."""

    op: str
    path: str = ""
    errno: int = errnos.EIO
    nth: int = 1
    times: int | None = 1  # None: every call from the nth on (an outage)
    exception: Callable[[], BaseException] | None = None  # instead of OSError(errno)
    seen: int = 0

    def hits(self, op: str, path: str) -> bool:
        if op != self.op or not path.endswith(self.path):
            return False
        self.seen += 1
        return self.seen >= self.nth and (self.times is None or self.seen < self.nth + self.times)

    def error(self, path: str) -> BaseException:
        if self.exception is not None:
            return self.exception()
        return OSError(self.errno, f"{os.strerror(self.errno)} (injected)", path)


@dataclass
class LocalFaults:
    roots: tuple[str, ...]
    faults: list[Fault] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    injected: list[tuple[str, str, BaseException]] = field(default_factory=list)
    replace_between: Callable[[str, str], None] | None = None  # non-atomic renames: run between
    replace_only: str | None = None  # non-atomic renames: of destinations ending with this
    _redirect: dict[str, str] = field(default_factory=dict)  # path -> file read in its place
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _scratch: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="local-faults-"))

    # ------------------------------------------------------------------ what to inject

    def fail(self, op: str, path: str = "", errno: int = errnos.EIO, nth: int = 1, times: int | None = 1,
             exception: Callable[[], BaseException] | None = None) -> Fault:
        assert op in OPS, op
        fault = Fault(op, path, errno, nth, times, exception)
        self.faults.append(fault)
        return fault

    def stale(self, path: str) -> None:
        """Reads of ``path`` return the bytes it holds now (none: FileNotFoundError), whatever comes later."""
        copy = os.path.join(self._scratch, f"stale-{len(self._redirect)}")
        if os.path.exists(path):
            shutil.copyfile(path, copy)
        self._redirect[_path_of(path)] = copy

    def short(self, path: str) -> None:
        """Reads of ``path`` return the first half of the bytes it holds now."""
        copy = os.path.join(self._scratch, f"short-{len(self._redirect)}")
        with _real_open(path, "rb") as source, _real_open(copy, "wb") as target:
            data = source.read()
            target.write(data[: len(data) // 2])
        self._redirect[_path_of(path)] = copy

    def non_atomic_replace(self, only: str = "", between: Callable[[str, str], None] | None = None,
                           crash: bool = False) -> None:
        """``os.replace(src, dst)`` becomes delete ``dst``, ``between(src, dst)``, rename (or a Crash)."""

        def step(src: str, dst: str) -> None:
            if between is not None:
                between(src, dst)
            if crash:
                raise Crash(f"killed while renaming {src} to {dst}")

        self.replace_only, self.replace_between = only, step

    def heal(self) -> None:
        """Stop injecting anything: the mount reconnected, the disk was cleaned up."""
        self.faults.clear()
        self._redirect.clear()
        self.replace_between = self.replace_only = None

    def count(self, op: str, path: str = "") -> int:
        return sum(1 for name, p in self.calls if name == op and p.endswith(path))

    # ------------------------------------------------------------------ called by the patches

    def _inside(self, path: str) -> bool:
        return any(path == root or path.startswith(root + "/") for root in self.roots)

    def _fails_writes(self) -> bool:
        return any(fault.op == "write" for fault in self.faults)

    def _check(self, op: str, path: str) -> None:
        if not self._inside(path):
            return
        with self._lock:
            self.calls.append((op, path))
            for fault in self.faults:
                if fault.hits(op, path):
                    error = fault.error(path)
                    self.injected.append((op, path, error))
                    raise error

    def _read_instead(self, path: str) -> str | None:
        return self._redirect.get(path) if self._inside(path) else None


_real_open = builtins.open
_real = {name: getattr(os, name) for name in ("fsync", "replace", "link", "open", "unlink", "ftruncate")}
_real_flock = fcntl.flock


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _path_of(file: Any, dir_fd: int | None = None) -> str:
    """The path a call names, its folders resolved (as /proc names them), its last part not."""
    if isinstance(file, int):
        return _fd_path(file)
    path = os.fsdecode(os.fspath(file))
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(_fd_path(dir_fd), path)
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


class _FailingWrites:
    """A file whose writes store half their bytes, then raise (a disk filling up mid-write)."""

    def __init__(self, f: Any, faults: LocalFaults, path: str) -> None:
        self._f, self._faults, self._path = f, faults, path

    def write(self, data: Any) -> int:
        try:
            self._faults._check("write", self._path)
        except BaseException:
            self._f.write(bytes(data)[: len(data) // 2])
            raise
        return int(self._f.write(data))

    def __enter__(self) -> _FailingWrites:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._f)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def install(faults: LocalFaults, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch the OS calls resumable's local code paths make, for this test only."""

    def fsync(fd: int) -> None:
        faults._check("fsync", _fd_path(fd))
        _real["fsync"](fd)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        target = _path_of(dst)
        faults._check("replace", target)
        step = faults.replace_between
        if step is not None and faults._inside(target) and target.endswith(faults.replace_only or ""):
            # Some mounts rename by deleting the old file and writing the new one.
            if os.path.lexists(target):
                _real["unlink"](target)
            step(_path_of(src), target)
        _real["replace"](src, dst, **kwargs)

    def link(src: Any, dst: Any, **kwargs: Any) -> None:
        faults._check("link", _path_of(dst))
        _real["link"](src, dst, **kwargs)

    def os_open(file: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        path = _path_of(file, dir_fd)
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        faults._check("create" if flags & os.O_EXCL else "open_write" if writing else "open_read", path)
        instead = None if writing else faults._read_instead(path)
        if instead is not None:
            return int(_real["open"](instead, flags, mode))
        return int(_real["open"](file, flags, mode, dir_fd=dir_fd))

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, int):
            return _real_open(file, mode, *args, **kwargs)
        path = _path_of(file)
        writing = any(c in mode for c in "wxa+")
        faults._check("create" if "x" in mode else "open_write" if writing else "open_read", path)
        instead = None if writing else faults._read_instead(path)
        f = _real_open(instead or file, mode, *args, **kwargs)
        if writing and faults._inside(path) and faults._fails_writes():
            return _FailingWrites(f, faults, path)
        return f

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        faults._check("unlink", _path_of(path, dir_fd))
        _real["unlink"](path, dir_fd=dir_fd)

    def ftruncate(fd: int, length: int) -> None:
        faults._check("ftruncate", _fd_path(fd))
        _real["ftruncate"](fd, length)

    def flock(fd: Any, operation: int) -> None:
        faults._check("flock", _fd_path(fd if isinstance(fd, int) else fd.fileno()))
        _real_flock(fd, operation)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "remove", unlink)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(builtins, "open", open_)


def inject(monkeypatch: pytest.MonkeyPatch, *roots: Any) -> LocalFaults:
    """A `LocalFaults` for paths under ``roots``, its patches undone when the test ends."""
    faults = LocalFaults(tuple(os.path.realpath(os.fspath(root)) for root in roots))
    install(faults, monkeypatch)
    return faults
