"""The epoch in a model file's name, as Keras' ModelCheckpoint wrote it from its template (pure: the
CLI names the files it lists with it, `resume()` adopts them by it).

With the template (``weights-{epoch:02d}-{val_acc:.3f}.keras``) the ``{epoch}`` field is read
where the template puts it, and only the files the template names count. Without one (a folder
given to `resume()`), the number after the word "epoch", else the one whole number of the name
(decimals such as a loss of ``0.412`` are metrics, not epochs), else the one number that differs
between names of the same shape (``run2-w-03.keras``, ``run2-w-04.keras``). A name none of these
settles carries no epoch: it is said, never guessed.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

# The suffixes of the model files Keras writes (``.weights.h5`` tried before ``.h5``).
MODEL_FILE_SUFFIXES = (".keras", ".weights.h5", ".h5", ".hdf5")
_DECIMAL = re.compile(r"\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+")
_INTEGER = re.compile(r"\d+")
_EPOCH_WORD = re.compile(r"epoch[-_=.]?(\d+)", re.IGNORECASE)


def stem(name: str) -> str:
    """The name without its model file suffix (``.weights.h5`` before ``.h5``)."""
    for suffix in sorted(MODEL_FILE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def template_pattern(template: str) -> re.Pattern[str]:
    """The names a Keras file template can produce; its ``{epoch}`` field as group ``epoch``."""
    parts = []
    epoch_seen = False
    for literal, field, _spec, _conversion in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is None:
            continue
        if field == "epoch" and not epoch_seen:
            parts.append(r"(?P<epoch>\d+)")
            epoch_seen = True
        elif field in ("epoch", "batch"):
            parts.append(r"\d+")
        else:
            parts.append(r".+?")
    return re.compile("".join(parts) + r"\Z")


def epoch_in_template_name(pattern: re.Pattern[str], name: str) -> int | None:
    """The ``{epoch}`` of a name the template produced; None when the template has no such field."""
    found = pattern.match(name)
    if found is None or "epoch" not in pattern.groupindex:
        return None
    return int(found.group("epoch"))


def epoch_in_name(name: str, siblings: Iterable[str] = ()) -> int | None:
    """The epoch a name carries without its template (see the module's note); None: not settled."""
    text = stem(name)
    word = _EPOCH_WORD.search(text)
    if word is not None:
        return int(word.group(1))
    numbers = _integers(text)
    if len(numbers) == 1:
        return numbers[0]
    if not numbers:
        return None
    shape = _shape(text)
    alike = [_integers(stem(s)) for s in siblings if s != name and _shape(stem(s)) == shape]
    varying = {i for other in alike for i, value in enumerate(other) if value != numbers[i]}
    return numbers[varying.pop()] if len(varying) == 1 else None


def _integers(text: str) -> list[int]:
    return [int(n) for n in _INTEGER.findall(_DECIMAL.sub("~", text))]


def _shape(text: str) -> str:
    """The name with its decimals and whole numbers blanked: names of one template share it."""
    return _INTEGER.sub("#", _DECIMAL.sub("~", text))


__all__ = ["epoch_in_name", "epoch_in_template_name", "stem", "template_pattern"]
