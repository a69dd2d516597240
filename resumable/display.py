"""Text for people: aligned tables, sizes and times. Shared by the CLI and the callback's messages."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import datetime


def format_table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[int] = (), header: bool = True
) -> list[str]:
    """Align columns with two spaces between them; columns in ``right`` are right-aligned.

    Example:
        >>> format_table(["NAME", "SIZE"], [["a", "1 KB"], ["bcd", "12.5 MB"]], right={1})
        ['NAME     SIZE', 'a        1 KB', 'bcd   12.5 MB']
    """
    table = [list(headers)] if header else []
    table += [list(row) for row in rows]
    if not table:
        return []
    right_aligned = set(right)
    return format_columns([list(column) for column in zip(*table, strict=True)], right_aligned)


def format_columns(columns: Sequence[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    """The lines of a table given a column at a time (headers included), aligned as `format_table`.

    Faster than rows for long tables: `resumable list` formats thousands of checkpoints.

    Example:
        >>> format_columns([["NAME", "a"], ["SIZE", "1 KB"]], right={1})
        ['NAME  SIZE', 'a     1 KB']
    """
    right_aligned = set(right)
    padded = []
    for i, column in enumerate(columns):
        width = max(map(len, column), default=0)
        if i in right_aligned:
            padded.append([c.rjust(width) for c in column])
        else:
            padded.append([c.ljust(width) for c in column])
    return ["  ".join(cells).rstrip() for cells in zip(*padded, strict=True)]


def human_size(size: int) -> str:
    """Bytes in the largest unit keeping the number >= 1: ``512 B``, ``1.5 KB``, ``2.0 GB`` (1024-based)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def local_time(moment: datetime | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in the local time zone; ``-`` when unknown."""
    if moment is None:
        return "-"
    # time.localtime is several times faster than datetime.astimezone(): `list` formats thousands
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment.timestamp()))
