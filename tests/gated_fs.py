"""GatedFS: an fsspec filesystem wrapper that holds (or fails) uploads, for the tests of
background uploads and of what waits for them."""

from __future__ import annotations

import errno
import threading
from typing import Any


class GatedFS:
    """Wraps an fsspec filesystem: each upload of a payload file (an ``open`` for writing, which
    is how RunStorage streams them), or in a local run the manifest that commits the files written
    in place, blocks until `gate` is set, or fails `failures` times."""

    def __init__(self, fs: Any, gate: threading.Event | None = None, failures: int = 0) -> None:
        self._fs = fs
        self.gate = gate
        self.failures = failures
        self.puts: list[str] = []
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        # A write: an upload, or the manifest that commits files written in place (a local run's
        # exclusive create); not the local run index's temporary file.
        if ("w" in mode or "x" in mode) and not path.endswith(".tmp"):
            self.puts.append(path)
            self.entered.set()
            # A bound only against a test that never opens it: in the whole suite a 4-epoch fit
            # once took over 30 s (an I/O stall; 2 s alone) before its gate opened
            if self.gate is not None:
                assert self.gate.wait(300), "the test never opened the gate"
            if self.failures:
                self.failures -= 1
                raise OSError(errno.EIO, "Input/output error (injected)")
        return self._fs.open(path, mode, **kwargs)
