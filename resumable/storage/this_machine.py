"""This process and this machine, as the writer lease names them: the host name, the boot id, a
process's start time (which tells a reused pid). (The wall clock, as lease.json stores it, is
`lease_info.wall_clock`.)

Tests that play another machine change `HOST` here; everything reads it from this module.
"""

from __future__ import annotations

import os
import socket


def process_start(pid: int) -> int | None:
    """The process' start time in clock ticks since boot; -1 if it is gone or a zombie; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return -1 if os.path.isdir("/proc/self") else None
    except (OSError, IndexError):
        return None
    try:
        return -1 if fields[0] == b"Z" else int(fields[19])  # state, then starttime (field 22)
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


HOST = socket.gethostname()
BOOT_ID = _boot_id()
_own_start: tuple[int, int | None] = (-1, None)


def own_process_start() -> int | None:
    """This process' start time, per pid: a process forked after import has its own."""
    global _own_start
    pid = os.getpid()
    if _own_start[0] != pid:
        start = process_start(pid)
        _own_start = (pid, None if start == -1 else start)
    return _own_start[1]


__all__ = ["BOOT_ID", "HOST", "own_process_start", "process_start"]
