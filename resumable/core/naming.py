"""Checkpoint folder names: built from a template, parsed back with a strict regex.

The name only orders checkpoints cheaply (one listing finds the newest); the epoch and step
a checkpoint holds are always read from its manifest.

==============================  =====  ====  ==============================
template                        epoch  step  name
==============================  =====  ====  ==============================
``ckpt-{epoch:06d}`` (default)  12     -     ``ckpt-000012``
``ckpt-{epoch:06d}``, mid-epoch 12     3400  ``ckpt-000012-step-000003400``
``weights-{epoch:02d}-{val_accuracy:.3f}``  3  -  ``weights-03-0.912``
``e{epoch:02d}-b{batch:04d}``, mid-epoch  2  250  ``e02-b0050-step-000000250``
==============================  =====  ====  ==============================

A mid-epoch name gets ``-step-NNNNNNNNN`` appended unless the template has ``{step}`` itself.
``{batch}`` is the batch within the epoch (0 at an epoch's end), as in Keras' ModelCheckpoint.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from typing import Any

from resumable.core.errors import ResumableError

DEFAULT_TEMPLATE = "ckpt-{epoch:06d}"
STEP_SUFFIX = "-step-{step:09d}"

_INT = r"\d+"
# Whatever str.format makes of a float: 0.912, -1.5e-04, 1.2E+03, nan, NAN, -inf, 91.20%.
_NUMBER = r"[-+]?(?:(?i:nan|inf)|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)%?"
_FORBIDDEN = ("/", "\\", "\n")


class NameTemplate:
    """A validated ModelCheckpoint-style name template such as ``"ckpt-{epoch:04d}"``.

    Args:
        template: A `str.format` template containing ``{epoch}``; other fields are ``step``
            and metric names from the logs, like ``val_loss``.
    """

    def __init__(self, template: str = DEFAULT_TEMPLATE) -> None:
        self.template = template
        fields = _fields(template)
        if "epoch" not in fields or any(c in template for c in _FORBIDDEN) or template in (".", ".."):
            raise ValueError(
                f"Invalid value for argument `filename`. Received: filename={template!r}. "
                "Expected a folder name template containing '{epoch}' and no '/', "
                "for example 'ckpt-{epoch:04d}'."
            )
        self._has_step = "step" in fields
        self._regex = re.compile(_pattern(template, self._has_step))

    def __repr__(self) -> str:
        return f"NameTemplate({self.template!r})"

    def format(
        self, epoch: int, step: int = 0, logs: Mapping[str, Any] | None = None, *,
        mid_epoch: bool = False, batch: int = 0,
    ) -> str:
        """Return the folder name for a checkpoint; missing metrics are written as ``nan``.

        ``batch``: the batch within the epoch, for ``{batch}`` (0 at an epoch's end).
        """
        values = _MissingAsNan(logs or {})
        values.update(epoch=epoch, step=step, batch=batch)
        name = string.Formatter().vformat(self.template, (), values)
        if mid_epoch and not self._has_step:
            name += STEP_SUFFIX.format(step=step)
        return name

    def parse(self, name: str) -> tuple[int, int] | None:
        """Return ``(epoch, step)`` for a name this template makes, or None.

        ``step`` is -1 for an end-of-epoch name without a step, so it sorts before the
        mid-epoch saves that follow it.
        """
        match = self._regex.fullmatch(name)
        if match is None:
            return None
        step = match.group("step")
        return int(match.group("epoch")), int(step) if step is not None else -1


class _MissingAsNan(dict[str, Any]):
    def __missing__(self, key: str) -> float:
        return math.nan


def _fields(template: str) -> set[str]:
    try:
        return {field for _, field, _, _ in string.Formatter().parse(template) if field}
    except ValueError:
        return set()


def _pattern(template: str, has_step: bool) -> str:
    parts = []
    seen: set[str] = set()
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if not field:
            continue
        if field == "batch":
            parts.append(_INT)
        elif field in ("epoch", "step") and field not in seen:
            parts.append(f"(?P<{field}>{_INT})")
            seen.add(field)
        elif field in ("epoch", "step"):
            parts.append(f"(?P={field})")
        else:
            parts.append(_NUMBER)
    if not has_step:
        parts.append(r"(?:-step-(?P<step>\d+))?")
    return "".join(parts)


def is_plain_name(name: str) -> bool:
    """One plain folder or file name: never a path, never ``.`` or ``..``.

    GCS object names may hold ``.`` and ``..`` segments; such a "folder" is never a
    checkpoint: it would resolve outside the run folder or the local cache.
    """
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def check_name(name: str) -> None:
    """A checkpoint (or run file) name must be one plain folder name: never a path."""
    if not is_plain_name(name):
        raise ResumableError(f"invalid checkpoint name {name!r}: expected a plain folder name")
