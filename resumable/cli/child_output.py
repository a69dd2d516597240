"""The stderr of the demo's training processes, passed on line by line, TensorFlow's start-up
banner shown once.

TensorFlow 2.21 prints its banner (absl's "All log messages before absl::InitializeLog()...",
oneDNN's note, the CPU instructions it was not built for) twice per process, whatever
``TF_CPP_MIN_LOG_LEVEL`` says, and the demo starts three processes: six banners. Each banner
line is shown the first time only, whichever process prints it; every other line as it comes.
"""

from __future__ import annotations

import re
import threading
from typing import IO, TextIO

_BANNER = re.compile(
    r"(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IWE]\d{4} [\d:.]+\s+\d+ (port|cpu_feature_guard)\.cc:\d+\]"
    r"|To enable the following instructions:)"
)
_HEADER = re.compile(r"^[IWE]\d{4} [\d:.]+\s+\d+ ")  # severity, date, time and thread: differ each time


class BannerOnce:
    """Which banner lines were shown already, across the processes of one demo."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def keep(self, line: str) -> bool:
        """Whether to show ``line``: any line but a banner line shown before."""
        if _BANNER.match(line) is None:
            return True
        kind = _HEADER.sub("", line).strip()
        with self._lock:
            if kind in self._seen:
                return False
            self._seen.add(kind)
        return True


def forward(stream: IO[bytes], out: TextIO, banner: BannerOnce) -> threading.Thread:
    """A thread passing ``stream``'s lines to ``out`` as they come, until it ends."""
    def run() -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            if banner.keep(line):
                out.write(line)
                out.flush()
        stream.close()

    thread = threading.Thread(target=run, name="resumable-demo-stderr", daemon=True)
    thread.start()
    return thread


__all__ = ["BannerOnce", "forward"]
