"""Commit checkpoint 1, then die at one write of checkpoint 2's commit.

Used by tests/test_crash_commit.py in two ways:

* as a script, in a child process that kills itself with SIGKILL (local and gs:// run folders)::

      python tests/jobs/commit_job.py RUN_URL WORKDIR WRITE_NUMBER before|torn|after

* as a module, in the test process, raising an exception instead (every backend).

No hook in resumable: the filesystem object's write methods (``put_file``, ``pipe_file``,
``open`` for writing) are wrapped on the instance that RunStorage holds. Only calls made by
RunStorage itself are counted, not the calls those methods make inside fsspec.

``before``: die before write k runs. ``torn``: write half of write k's bytes, then die.
``after``: die right after write k finished.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAYLOAD = {
    "model.keras": bytes(range(256)) * 64,
    "state.json": b'{"optimizer": "adam", "epoch": %d}\n',
    "assets/vocab.txt": b"alpha\nbeta\ngamma\n",
}
WRITES_PER_COMMIT = len(PAYLOAD) + 2  # each payload file, the manifest, then the run index
MANIFEST_WRITE = WRITES_PER_COMMIT - 1
MODES = ("before", "torn", "after")


class InjectedFault(RuntimeError):
    """The exception raised in place of the SIGKILL when the test runs in-process."""


def payload(epoch: int) -> dict[str, bytes]:
    """Files of checkpoint ``epoch``: different bytes for each epoch."""
    return {rel: (data % epoch if b"%d" in data else data + bytes([epoch])) for rel, data in PAYLOAD.items()}


def stage(folder: Path, epoch: int) -> Path:
    """Write checkpoint ``epoch``'s files into a local staging folder."""
    for rel, data in payload(epoch).items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def sigkill() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def raise_fault() -> None:
    raise InjectedFault("injected fault")


def wrap_writes(
    fs: Any,
    target: int,
    mode: str,
    die: Callable[[], None],
    setattr_: Callable[[Any, str, Any], None] = setattr,
) -> list[str]:
    """Wrap ``fs``'s write methods; at write number ``target`` (1-based), ``die`` as ``mode`` says.

    Returns the log of writes seen so far, ``"put_file <path>"`` and the like.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    log: list[str] = []
    depth = [0]
    originals = {name: getattr(fs, name) for name in ("put_file", "pipe_file", "open")}

    def is_write(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if name != "open":
            return True
        open_mode = kwargs.get("mode", args[1] if len(args) > 1 else "rb")
        return any(c in open_mode for c in "wxa")

    def torn(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name == "put_file":
            data = Path(args[0]).read_bytes()
            originals["pipe_file"](args[1], data[: len(data) // 2])
            die()
        if name == "pipe_file":
            data = args[1] if len(args) > 1 else kwargs["value"]
            originals["pipe_file"](args[0], data[: len(data) // 2], mode=kwargs.get("mode", "overwrite"))
            die()
        return _TornFile(originals["open"](*args, **kwargs), die)

    def make(name: str) -> Callable[..., Any]:
        original = originals[name]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if depth[0] or not is_write(name, args, kwargs):
                depth[0] += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    depth[0] -= 1
            log.append(f"{name} {args[0] if name != 'put_file' else args[1]}")
            number = len(log)
            print(f"write {number}: {log[-1]}", flush=True)
            if number == target and mode == "before":
                die()
            depth[0] += 1
            if number == target and mode == "torn":
                try:
                    return torn(name, args, kwargs)
                finally:
                    depth[0] -= 1
            try:
                result = original(*args, **kwargs)
            finally:
                depth[0] -= 1
            if number == target and mode == "after":
                if name == "open":  # the bytes land when the file is closed
                    return _TornFile(result, die, keep=1.0)
                die()
            return result

        return wrapper

    for name in originals:
        setattr_(fs, name, make(name))
    return log


class _TornFile:
    """A file opened for writing that keeps only a ``keep`` share of the first write, then dies."""

    def __init__(self, f: Any, die: Callable[[], None], keep: float = 0.5) -> None:
        self._f = f
        self._die = die
        self._keep = keep

    def __enter__(self) -> _TornFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def write(self, data: bytes) -> int:
        self._f.write(data[: int(len(data) * self._keep)])
        self._f.close()
        self._die()
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def main(argv: list[str]) -> int:
    url, workdir, target, mode = argv[0], Path(argv[1]), int(argv[2]), argv[3]
    from resumable.core.manifest import Manifest
    from resumable.storage import RunStorage

    storage = RunStorage(url)
    storage.commit(stage(workdir / "stage1", 1), "ckpt-000001", Manifest(epoch=1, step=100))
    print("committed ckpt-000001", flush=True)
    wrap_writes(storage.fs, target, mode, sigkill)
    storage.commit(stage(workdir / "stage2", 2), "ckpt-000002", Manifest(epoch=2, step=200))
    print("committed ckpt-000002 without being killed", flush=True)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
