"""JSON read from a run folder, where anyone may have written anything: bounded and strict.

Every JSON file resumable reads back (manifests, the run index, the writer lease, single-file
checksum records, ``state.json``) goes through `loads`. A file over its size limit, not UTF-8,
nested deeper than `MAX_DEPTH`, holding ``NaN`` or ``Infinity``, a number too large for a float
(``1e400``), an integer of more than `MAX_DIGITS` digits, an unpaired UTF-16 surrogate or a key
twice is refused with a one-line `RefusedJSON`; the caller names the file and says what that
means for it (a corrupt checkpoint, an index to rebuild). Each reader then checks its own
fields' types and ranges. Readers should not read more than ``limit + 1`` bytes either (see
the limits' uses), so that a 400 MB "manifest" never reaches memory whole.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Any

from resumable.core.display import human_size

KIB = 1024
MIB = 1024 * KIB
# A real manifest is a few KB: one entry per file and the callback's small state. 16 MiB still
# holds some 200,000 file entries or a large free-form state from another writer.
MANIFEST_LIMIT = 16 * MIB
# The run index holds about 200 bytes per checkpoint (more with many metrics): 64 MiB is
# some 300,000 checkpoints. A larger one is ignored: `list` then reads the manifests.
INDEX_LIMIT = 64 * MIB
# state.json grows with the history (some 30 bytes per metric and epoch) and the weight layout.
STATE_LIMIT = 64 * MIB
RECORD_LIMIT = 1 * MIB  # a single file's checksum record: a few hundred bytes
LEASE_LIMIT = 64 * KIB  # the writer lease: a few hundred bytes
MAX_DEPTH = 64  # ours nest 6 levels at most; the C parser itself stops near 1,000
MAX_DIGITS = 64  # int64 has 19 digits; Python refuses over 4,300 (and gets slow long before)

# An escaped UTF-16 surrogate, the only way JSON text that is UTF-8 can hold one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_WIDE_BOMS = (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


class RefusedJSON(ValueError):
    """A JSON file resumable will not use; the message says why, in a few words."""


def loads(data: bytes, limit: int, *, thorough: bool = True) -> Any:
    """The parsed JSON of ``data``; RefusedJSON if it breaks a rule of the module docstring.

    ``thorough=False`` (the run index: thousands of rows, each of whose values its reader
    checks anyway) skips the checks that cost a Python call per value: duplicate keys,
    numbers too large, depth and surrogates. Size, encoding, ``NaN`` and the parser's own
    recursion limit are always checked.
    """
    if len(data) > limit:
        raise RefusedJSON(f"is over {human_size(limit)}, larger than any real one")
    text = _text(data)
    try:
        if thorough:
            value = json.loads(text, parse_constant=_constant, parse_float=_finite, parse_int=_integer,
                               object_pairs_hook=_unique_keys)
        else:
            value = json.loads(text, parse_constant=_constant)
    except RefusedJSON:
        raise
    except RecursionError:
        raise RefusedJSON("is nested too deep to be real") from None
    except ValueError as e:  # JSONDecodeError, or an integer over Python's 4,300 digits
        if "integer string conversion" in str(e):
            raise RefusedJSON("holds an integer of thousands of digits") from None
        raise RefusedJSON(f"is not valid JSON ({e})") from None
    if thorough and _may_be_deep_or_unpaired(text):
        _check_nesting(value)
    return value


def _may_be_deep_or_unpaired(text: str) -> bool:
    """Whether `_check_nesting` has anything to find: cheap scans of the text (a manifest is
    read for every checkpoint `list --deep` shows), so that most files skip the walk."""
    return text.count("[") + text.count("{") > MAX_DEPTH or _SURROGATE_ESCAPE.search(text) is not None


def _text(data: bytes) -> str:
    """``data`` as UTF-8 text: the only encoding resumable writes (json.loads would guess others)."""
    if data.startswith(_WIDE_BOMS) or b"\x00" in data[:4]:
        raise RefusedJSON("is UTF-16 or UTF-32 text, not UTF-8")
    if data.startswith(codecs.BOM_UTF8):
        raise RefusedJSON("starts with a byte-order mark; JSON files are UTF-8 without one")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RefusedJSON(f"is not UTF-8 text (byte {e.start})") from None


def _constant(name: str) -> Any:
    raise RefusedJSON(f"holds {name}, which JSON does not allow")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise RefusedJSON(f"holds the number {_cut(text)}, too large for a float")
    return value


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise RefusedJSON(f"holds an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):  # JSON would silently keep the last: two readers could disagree
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RefusedJSON(f"holds the key {_cut(repr(key))} twice")
            seen.add(key)
    return found


def _check_nesting(value: Any) -> None:
    """Depth at most MAX_DEPTH (code that walks it later must not hit Python's recursion limit),
    and no unpaired surrogate in a string (it can be neither printed nor written as UTF-8)."""
    level, depth = [value], 0
    while level:
        strings = [v for v in level if type(v) is str]
        for text in strings:
            if not text.isascii():
                _check_encodable(text)
        containers = [v for v in level if type(v) in (dict, list)]
        if containers:
            depth += 1
            if depth > MAX_DEPTH:
                raise RefusedJSON(f"is nested more than {MAX_DEPTH} levels deep")
        level = []
        for container in containers:
            if type(container) is dict:
                level += container  # keys too: they are strings
                level += container.values()
            else:
                level += container


def _check_encodable(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RefusedJSON(f"holds an unpaired UTF-16 surrogate ({e.object[e.start]!r})") from None


def _cut(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
