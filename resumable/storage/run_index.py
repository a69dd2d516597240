"""The run index: what `resumable list` shows of every committed checkpoint, in one object.

``<run>/index.json`` is a cache, never the truth. A checkpoint is committed by its own
manifest; the index is rewritten after each commit and before each delete, so at worst it
misses a checkpoint (listing then reads that folder's manifest) or names one whose folder is
gone (listing drops it). Restoring, verifying and pruning always read the manifests.
See docs/format.md.

In memory the index is one `IndexRow` per checkpoint name: the listing part of its manifest
(epoch, step, batch, time, metrics, files, and the monitored metric), not its free-form
state. On disk it is stored a column at a time (``"epoch": [1, 2, ...]``): JSON lists decode
in about two thirds of the time of one object per checkpoint, and a long run lists thousands.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resumable.core import safe_json
from resumable.core.manifest import MAX_COUNT, FileEntry, Manifest, is_safe_relative

INDEX_NAME = "index.json"
INDEX_FORMAT = "resumable.index"
# 1 held whole manifests, 2 one object per checkpoint; an index of another version is rebuilt
INDEX_VERSION = 3
# the columns, each a list with one item per checkpoint; "names" orders them all
COLUMNS = ("names", "epoch", "step", "batch", "created", "manifest_size", "files", "metrics", "state")
RANKING_KEYS = ("monitor", "mode")  # the only state a listing needs: which metric ranks checkpoints
INDEX_LIMIT = safe_json.INDEX_LIMIT  # bytes: a larger index is not read, and listing reads the manifests


@dataclass(frozen=True, slots=True)
class IndexRow:
    """What the index records of one committed checkpoint (its name is the row's key)."""

    epoch: int
    step: int
    batch: int
    created: str  # the manifest's ISO 8601 time, as recorded
    manifest_size: int  # bytes of manifest.json itself
    files: dict[str, list[Any]]  # relative path: [size, crc32c], as stored (see `manifest`)
    metrics: dict[str, float]  # NaN where the file holds null
    state: dict[str, str]  # only the RANKING_KEYS of the manifest's state

    @classmethod
    def from_json(
        cls, epoch: Any, step: Any, batch: Any, created: Any, manifest_size: Any, files: Any, metrics: Any,
        state: Any,
    ) -> IndexRow:
        """The row of one checkpoint's values as decoded from the file's columns.

        Raises TypeError, ValueError or AttributeError for a value a hand edit or another
        version could have left; the caller leaves that row out. `type(...) is`, not
        isinstance: a bool is no count, and `list` checks thousands of rows.
        """
        if not (type(epoch) is int and type(step) is int and type(batch) is int
                and type(manifest_size) is int and type(created) is str):
            raise TypeError("epoch, step, batch and manifest_size must be integers, created a string")
        if not (0 <= epoch <= MAX_COUNT and 0 <= step <= MAX_COUNT and 0 <= batch <= MAX_COUNT
                and 0 <= manifest_size <= MAX_COUNT):
            raise ValueError("epoch, step, batch and manifest_size must be counts")
        if not files:  # as a manifest: a checkpoint that lists no file restores nothing
            raise ValueError("no files")
        for rel, (size, crc32c) in files.items():  # a dict of pairs, else one of the errors
            if type(size) is not int or type(crc32c) is not str or not 0 <= size <= MAX_COUNT:
                raise TypeError(f"bad size or CRC32C for {rel!r}")
            if not is_safe_relative(rel):  # as a manifest: never a path out of the checkpoint folder
                raise ValueError(f"file name {rel!r} is not a plain relative path")
        for key, value in state.items():
            if key not in RANKING_KEYS or type(value) is not str:
                raise ValueError(f"unexpected state {key!r}")
        for value in metrics.values():
            # null stands for NaN, an integer was hand-made; `value - value` is NaN for an infinity
            if type(value) is not float or value - value:
                metrics = _floats(metrics)
                break
        return cls(epoch, step, batch, created, manifest_size, files, metrics, state)

    @property
    def size(self) -> int:
        """Bytes of the checkpoint's files and its manifest."""
        total = self.manifest_size
        for size, _ in self.files.values():
            total += size
        return total

    def manifest(self) -> Manifest:
        """The listing part of the checkpoint's manifest: no versions, only the ranking state.

        Read the checkpoint's own manifest for the rest.
        """
        files = {rel: FileEntry(size, crc32c) for rel, (size, crc32c) in self.files.items()}
        return Manifest(self.epoch, self.step, self.batch, files, dict(self.metrics), self.created,
                        state=dict(self.state))

    def to_json(self) -> dict[str, Any]:
        """The row's values by column, as the file holds them."""
        return {
            "epoch": self.epoch, "step": self.step, "batch": self.batch, "created": self.created,
            "manifest_size": self.manifest_size, "files": self.files,
            "metrics": {name: _json_float(value) for name, value in self.metrics.items()},
            "state": self.state,
        }


def entry(manifest: Manifest, manifest_size: int) -> IndexRow:
    """The row of a committed manifest whose JSON is ``manifest_size`` bytes."""
    ranking = {key: manifest.state[key] for key in RANKING_KEYS if isinstance(manifest.state.get(key), str)}
    metrics = {name: float(value) for name, value in manifest.metrics.items()}  # a NumPy scalar too
    files = {rel: [entry.size, entry.crc32c] for rel, entry in manifest.files.items()}
    return IndexRow(manifest.epoch, manifest.step, manifest.batch, manifest.created, manifest_size,
                    files, metrics, ranking)


def encode(rows: Mapping[str, IndexRow]) -> bytes:
    """Compact JSON, a column at a time, rows in name order: a long run holds thousands."""
    names = sorted(rows)
    stored = [rows[name].to_json() for name in names]
    data: dict[str, Any] = {"format": INDEX_FORMAT, "format_version": INDEX_VERSION, "names": names}
    for column in COLUMNS[1:]:
        data[column] = [values[column] for values in stored]
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def decode(data: bytes | None) -> dict[str, IndexRow]:
    """The good rows by checkpoint name, in the file's order.

    A missing, unreadable or other-version index gives {}: only a slower listing, never an
    error. A row with a bad value is left out (that folder's own manifest decides).
    """
    columns = _columns(data)
    if columns is None:
        return {}
    rows = {}
    for name, epoch, step, batch, created, manifest_size, files, metrics, state in zip(*columns, strict=True):
        try:
            if type(name) is not str:
                raise TypeError("a checkpoint name must be a string")
            rows[name] = IndexRow.from_json(epoch, step, batch, created, manifest_size, files, metrics, state)
        except (TypeError, ValueError, AttributeError):
            continue  # that folder is checked from its own files
    return rows


def _columns(data: bytes | None) -> list[list[Any]] | None:
    """The columns of an index of this version, in `COLUMNS` order, all of one length; else None."""
    if not data:
        return None
    try:  # the rows' values are checked one by one below: the quick parse of `safe_json`
        raw = safe_json.loads(data, INDEX_LIMIT, thorough=False)
    except safe_json.RefusedJSON:
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


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    """Metrics as floats: null stands for NaN (JSON has none), an integer was hand-made."""
    floats = {}
    for name, value in metrics.items():
        if value is None:
            floats[name] = math.nan
        elif type(value) is float and math.isfinite(value):
            floats[name] = value
        elif type(value) is int and abs(value) <= MAX_COUNT:
            floats[name] = float(value)
        else:  # another type, an infinity (1e400 parses as one), or an integer no float holds
            raise TypeError(f"metric {name!r} is not a number")
    return floats


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


__all__ = ["COLUMNS", "INDEX_NAME", "INDEX_VERSION", "IndexRow", "decode", "encode", "entry"]
