"""The run index: what `resumable list` shows of every committed checkpoint, in one object.

``<run>/index.json`` is a cache, never the truth. A checkpoint is committed by its own
manifest; the index is rewritten after each commit and before each delete, so at worst it
misses a checkpoint (listing then reads that folder's manifest) or names one whose folder is
gone (listing drops it). Restoring, verifying and pruning always read the manifests.
See docs/format.md.

Each entry holds the listing part of a manifest only (epoch, step, batch, time, metrics,
files, and the monitored metric), not its free-form state. The file stores the entries a
column at a time (``"epoch": [1, 2, ...]``): JSON lists of numbers and strings decode in
about two thirds of the time of one object per checkpoint, and `listing` hands out the rows
straight from the columns, checked a column at a time; a row's manifest is built only when
asked for (`manifest_of_row`).
"""

from __future__ import annotations

import json
import math
from itertools import chain
from operator import itemgetter
from typing import Any

from resumable.core.manifest import FileEntry, Manifest

INDEX_NAME = "index.json"
INDEX_FORMAT = "resumable.index"
# 1 held whole manifests, 2 one object per checkpoint; an index of another version is rebuilt
INDEX_VERSION = 3
# the columns, each a list with one item per checkpoint; "names" orders them all
COLUMNS = ("names", "epoch", "step", "batch", "created", "manifest_size", "files", "metrics", "state")
# A row of `listing`: the columns' values for one checkpoint, in `COLUMNS` order, checked
Row = tuple[Any, ...]
RANKING_KEYS = ("monitor", "mode")  # the only state a listing needs: which metric ranks checkpoints

_new_tuple = tuple.__new__  # FileEntry(n, crc) without NamedTuple's Python-level __new__: 4x as fast


def decode(data: bytes | None) -> dict[str, dict[str, Any]]:
    """The index's entries by checkpoint name (see `entry`); {} for a missing or unreadable index.

    An unreadable index is only a slower listing, never an error. Values are as stored:
    `manifest_of` checks them.
    """
    columns = _columns(data)
    if columns is None:
        return {}
    keys = COLUMNS[1:]
    return {str(name): dict(zip(keys, values, strict=True)) for name, *values in zip(*columns, strict=True)}


def encode(entries: dict[str, dict[str, Any]]) -> bytes:
    """Compact JSON, a column at a time: the index of a long run holds thousands of entries."""
    names = sorted(entries)
    data: dict[str, Any] = {"format": INDEX_FORMAT, "format_version": INDEX_VERSION, "names": names}
    for key in COLUMNS[1:]:
        data[key] = [entries[name][key] for name in names]
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def entry(manifest: Manifest, manifest_size: int) -> dict[str, Any]:
    """The index entry of a committed manifest whose JSON is ``manifest_size`` bytes."""
    state = manifest.state
    return {
        "epoch": manifest.epoch,
        "step": manifest.step,
        "batch": manifest.batch,
        "created": manifest.created,
        "manifest_size": manifest_size,
        "files": {rel: [e.size, e.crc32c] for rel, e in manifest.files.items()},
        "metrics": {name: _json_float(value) for name, value in manifest.metrics.items()},
        "state": {key: state[key] for key in RANKING_KEYS if isinstance(state.get(key), str)},
    }


def listing(data: bytes | None) -> list[Row]:
    """Every good entry as a `Row`, in the index's order; bad ones are left out.

    A missing or unreadable index gives []. An entry with a bad value is left out (that
    folder's own manifest decides). The rows are checked a column at a time, with builtins
    that loop in C, and only when a column fails, one row at a time: `list` reads thousands.
    Build a row's manifest with `manifest_of_row`.
    """
    columns = _columns(data)
    if columns is None:
        return []
    rows = _checked_by_columns(columns)
    if rows is not None:
        return rows
    found = []
    for row in zip(*columns, strict=True):
        try:
            if type(row[0]) is not str or type(row[5]) is not int:
                raise TypeError("the name must be a string and manifest_size an integer")
            manifest = manifest_of_row(row)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        found.append((*row[:7], manifest.metrics, row[8]))  # null (NaN) and integer metrics as floats
    return found


def manifest_of_row(row: Row) -> Manifest:
    """The listing part of a manifest (see `manifest_of`) from a row of `listing`.

    Raises KeyError, TypeError or ValueError for a row `listing` would have left out.
    """
    _, epoch, step, batch, created, _, files, metrics, state = row
    return _manifest(epoch, step, batch, created, files, metrics, state)


def manifest_of(data: dict[str, Any]) -> tuple[Manifest, int]:
    """The listing part of a manifest, and its size in bytes, from an index entry.

    The manifest has no ``versions`` and only the ranking keys of its ``state``; read the
    checkpoint itself for the rest. Raises KeyError, TypeError or ValueError for a bad entry.
    """
    manifest = _manifest(data["epoch"], data["step"], data["batch"], data["created"], data["files"],
                         data["metrics"], data["state"])
    size = data["manifest_size"]
    if type(size) is not int:
        raise TypeError("manifest_size must be an integer")
    return manifest, size


def _columns(data: bytes | None) -> list[list[Any]] | None:
    """The columns of an index of this version, in `COLUMNS` order, all of one length; else None."""
    if not data:
        return None
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT:
        return None
    if raw.get("format_version") != INDEX_VERSION:
        return None  # another version's layout: list reads the manifests, the next commit rewrites it
    columns: list[list[Any]] = []
    for key in COLUMNS:
        column = raw.get(key)
        if type(column) is not list or (columns and len(column) != len(columns[0])):
            return None  # a column missing or of another length: no row can be trusted to line up
        columns.append(column)
    return columns


def _checked_by_columns(columns: list[list[Any]]) -> list[Row] | None:
    """The rows, when every one passes `_manifest`'s checks; else None (check them one by one)."""
    names, epoch, step, batch, created, size, files, metrics, state = columns
    if not (_all(names, str) and _all(epoch, int) and _all(step, int) and _all(batch, int)
            and _all(created, str) and _all(size, int)
            and _all(files, dict) and _all(metrics, dict) and _all(state, dict)):
        return None
    entries = list(chain.from_iterable(map(dict.values, files)))
    if not (_all(entries, list) and set(map(len, entries)) <= {2}
            and _all(map(_first, entries), int) and _all(map(_second, entries), str)
            and set(chain.from_iterable(map(dict.keys, state))) <= set(RANKING_KEYS)
            and _all(chain.from_iterable(map(dict.values, state)), str)):
        return None
    metric_types = set(map(type, chain.from_iterable(map(dict.values, metrics))))
    if not metric_types <= {float, type(None)}:  # null: NaN or infinity, which JSON cannot hold
        return None
    if type(None) in metric_types:  # a diverged epoch need not slow the whole listing
        metrics = [_nan_for_null(m) if None in m.values() else m for m in metrics]
    return list(zip(names, epoch, step, batch, created, size, files, metrics, state, strict=True))


def _all(values: Any, kind: type) -> bool:
    """Every value is exactly of ``kind`` (a bool is no int here): one C loop, no Python per value."""
    return set(map(type, values)) <= {kind}


_first, _second = itemgetter(0), itemgetter(1)


def _nan_for_null(metrics: dict[str, Any]) -> dict[str, Any]:
    return {name: math.nan if value is None else value for name, value in metrics.items()}


def _manifest(
    epoch: Any, step: Any, batch: Any, created: Any, files: Any, metrics: Any, state: Any
) -> Manifest:
    # Plain loops and `type() is`, no helpers: `list` checks thousands (a bool is no count either).
    if type(epoch) is not int or type(step) is not int or type(batch) is not int:
        raise TypeError("epoch, step and batch must be integers")
    if type(created) is not str:
        raise TypeError("created must be a string")
    entries = {}
    for rel, (n, crc) in files.items():
        if type(n) is not int or type(crc) is not str:
            raise TypeError(f"bad size or CRC32C for {rel!r}")
        entries[rel] = _new_tuple(FileEntry, (n, crc))
    for value in metrics.values():
        if type(value) is not float:  # null stands for NaN; an int was hand-made
            metrics = {str(k): math.nan if v is None else float(v) for k, v in metrics.items()}
            break
    for key, value in state.items():
        if key not in RANKING_KEYS or type(value) is not str:
            raise ValueError(f"unexpected state {key!r}")
    return Manifest(epoch, step, batch, entries, metrics, created, state=state)


def _json_float(value: Any) -> float | None:
    number = float(value)  # a NumPy scalar from Keras' logs too
    return None if math.isnan(number) or math.isinf(number) else number


__all__ = ["INDEX_NAME", "Row", "decode", "encode", "entry", "listing", "manifest_of", "manifest_of_row"]
