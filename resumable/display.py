"""Text for people: aligned tables, sizes and times. Shared by the CLI and the callback's messages."""

from __future__ import annotations

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
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    right_aligned = set(right)
    return [
        "  ".join(
            cell.rjust(width) if i in right_aligned else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    ]


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
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")
