"""How the commands print: lines and JSON on stdout, progress bars on stderr, shared cell formats."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from resumable.cli import adoptable
from resumable.core.display import printable
from resumable.storage import CheckpointInfo

PROGRESS_MIN_ITEMS = 5  # fewer than this finish before a bar is worth drawing

T = TypeVar("T")


def out(line: str) -> None:
    """One line on stdout, `printable`: lines quote names read from the run folder."""
    print(printable(line), file=sys.stdout)


def out_lines(lines: Iterable[str]) -> None:
    lines = [printable(line) for line in lines]  # each a line: a newline in a name is escaped
    if lines:
        print("\n".join(lines), file=sys.stdout)  # one write: a listing may be thousands of lines


def out_section(title: str, lines: Sequence[str]) -> None:
    out("")
    out(title)
    out_lines(f"  {line}" for line in lines)


def out_json(data: Any) -> None:
    # ensure_ascii (the default) escapes every control character, C1 and DEL included
    print(json.dumps(data, indent=2, allow_nan=False), file=sys.stdout)


def progress(items: Iterable[T], total: int, what: str, unit: str) -> Iterator[T]:
    """Items with a progress bar on stderr, when it is a terminal and the job is not tiny."""
    if total <= PROGRESS_MIN_ITEMS or not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, total=total, desc=what, unit=unit, file=sys.stderr, leave=False)


# ------------------------------------------------------------------ cells and phrases


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def fmt_float(value: float) -> str:
    return f"{value:.4g}"


def metric_text(info: CheckpointInfo, name: str) -> str:
    """The checkpoint's value of metric ``name`` as a table shows it; ``-`` when it has none."""
    value = info.metrics.get(name)
    return "-" if value is None else fmt_float(value)


def problem_lines(infos: Sequence[CheckpointInfo]) -> list[str]:
    return [f"{i.name}: {adoptable.status_text(i)}: {adoptable.problem_text(i)}" for i in infos if not i.ok]


# ------------------------------------------------------------------ JSON


def info_json(info: CheckpointInfo) -> dict[str, Any]:
    manifest = info.manifest
    return {
        "name": info.name,
        "url": info.url,
        "status": adoptable.status_text(info),
        "kind": adoptable.kind_of(info),
        "problem": adoptable.problem_text(info),
        "epoch": info.epoch,
        "step": info.step,
        "batch": manifest.batch if manifest else None,
        "metrics": {k: json_float(v) for k, v in info.metrics.items()},
        "size": info.size,
        "created": info.created.isoformat() if info.created else None,
        "files_checked": info.checked,
    }


def json_float(value: float) -> float | None:
    """JSON has no NaN or infinity: ``null`` for them."""
    return None if math.isnan(value) or math.isinf(value) else value
