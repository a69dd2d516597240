"""Giving the C heap's freed memory back to the system while a checkpoint downloads and loads.

glibc serves an allocation from its heap rather than a mapping of its own once a larger block
has been freed (its mmap threshold rises, up to 32 MiB), and keeps what is freed there: the
arrays a load reads one after another, each dropped once assigned, leave holes that stay
resident. Measured on JAX with a 0.6 GB checkpoint of 4 MiB variables: the load peaked at 1.55x
the checkpoint, 1.18x with the holes given back; a download in ranged pieces leaves the same.
``malloc_trim`` gives them back (well under a
millisecond each time); elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def give_back() -> None:
    """Return the heap's free memory to the system, where the C library can."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
