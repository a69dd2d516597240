"""Text for people: aligned tables, sizes and times. Shared by the CLI and the callback's messages."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters (C0, C1, DEL, so ANSI escapes and
    newlines too) and other unprintable ones escaped as Python writes them (``\\x1b``).

    For every string read from a run folder (checkpoint, file and metric names, versions,
    notes, problems): a name holding ``\\x1b[2J`` must not clear the screen of whoever lists it,
    nor one holding a newline print a line of its own.

    Example:
        >>> printable("ckpt\\x1b[31m-1\\n")
        'ckpt\\\\x1b[31m-1\\\\n'
    """
    if text.isprintable():  # the usual case, at C speed: `list` shows thousands of names
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def first_line(error: BaseException) -> str:
    """``TypeError: Could not locate class ...``: the first line of a library's message, cut short."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= 200 else text[:197] + "..."


def format_table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[int] = (), header: bool = True
) -> list[str]:
    """Align columns with two spaces between them; columns in ``right`` are right-aligned.

    Cells are `printable` first, so that a name read from a run folder neither moves the
    terminal's cursor nor breaks the alignment.

    Example:
        >>> format_table(["NAME", "SIZE"], [["a", "1 KB"], ["bcd", "12.5 MB"]], right={1})
        ['NAME     SIZE', 'a        1 KB', 'bcd   12.5 MB']
    """
    table = [[printable(cell) for cell in headers]] if header else []
    table += [[printable(cell) for cell in row] for row in rows]
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
    padded: list[Sequence[str]] = []
    for i, column in enumerate(columns):
        width = max(map(len, column), default=0)
        if i in right_aligned:
            padded.append([c.rjust(width) for c in column])
        elif i == len(columns) - 1:
            padded.append(column)  # the last column, left-aligned: its padding would be stripped
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


def utc_time(text: str | None) -> str:
    """An ISO 8601 time in UTC to the second, as gcloud shows times: ``2026-11-22T06:10:03Z``.

    ``-`` when missing or not a time. A time without an offset is taken as UTC, as manifests
    record it. One word, so that scripts can split a table's columns on spaces.

    Example:
        >>> utc_time("2026-11-22T07:10:03.25+01:00")
        '2026-11-22T06:10:03Z'
    """
    return utc_times([text])[0]


def utc_times(texts: Iterable[str | None]) -> list[str]:
    """`utc_time` of each: `resumable list` formats thousands.

    A manifest's own form (``2026-11-22T06:10:03+00:00``, whole seconds in UTC) is checked by
    parsing and then sliced: formatting a datetime costs five times as much as that.
    """
    found = []
    for text in texts:
        if text and len(text) == 25 and text.endswith("+00:00"):
            try:
                _parse(text)  # a hand-edited manifest may hold anything
            except ValueError:
                found.append("-")
            else:
                found.append(text[:19] + "Z")
        else:
            found.append(_any_utc_time(text))
    return found


_parse = datetime.fromisoformat


def _any_utc_time(text: str | None) -> str:
    try:
        moment = _parse(text.replace("Z", "+00:00")) if text else None  # Python 3.11 reads no "Z"
    except ValueError:
        moment = None
    if moment is None:
        return "-"
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
