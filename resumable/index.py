"""The run index: what `resumable list` shows of every committed checkpoint, in one object.

``<run>/index.json`` is a cache, never the truth. A checkpoint is committed by its own
manifest; the index is rewritten after each commit and before each delete, so at worst it
misses a checkpoint (listing then reads that folder's manifest) or names one whose folder is
gone (listing drops it). Restoring, verifying and pruning always read the manifests.
See docs/format.md.

Each entry holds the listing part of a manifest only (epoch, step, batch, time, metrics,
files, and the monitored metric), not its free-form state: decoding the index of a long run
is then a few milliseconds, where whole manifests took several times that.
"""

from __future__ import annotations

import json
import math
from typing import Any

from resumable.manifest import FileEntry, Manifest

INDEX_NAME = "index.json"
INDEX_FORMAT = "resumable.index"
INDEX_VERSION = 2  # version 1 held whole manifests; an index of another version is rebuilt
RANKING_KEYS = ("monitor", "mode")  # the only state a listing needs: which metric ranks checkpoints


def decode(data: bytes | None) -> dict[str, dict[str, Any]]:
    """The index's entries by checkpoint name (see `entry`); {} for a missing or unreadable index.

    An unreadable index is only a slower listing, never an error.
    """
    if not data:
        return {}
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT:
        return {}
    if raw.get("format_version") != INDEX_VERSION:
        return {}  # another version's layout: list reads the manifests, the next commit rewrites it
    entries = raw.get("checkpoints")
    if not isinstance(entries, dict):
        return {}
    return {str(name): entry for name, entry in entries.items() if isinstance(entry, dict)}


def encode(entries: dict[str, dict[str, Any]]) -> bytes:
    """Compact JSON: the index of a long run holds thousands of entries."""
    data = {"format": INDEX_FORMAT, "format_version": INDEX_VERSION,
            "checkpoints": dict(sorted(entries.items()))}
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def entry(manifest: Manifest, manifest_size: int) -> dict[str, Any]:
    """The index entry of a committed manifest whose JSON is ``manifest_size`` bytes."""
    data: dict[str, Any] = {
        "epoch": manifest.epoch,
        "step": manifest.step,
        "batch": manifest.batch,
        "created": manifest.created,
        "metrics": {name: _json_float(value) for name, value in manifest.metrics.items()},
        "files": {rel: [e.size, e.crc32c] for rel, e in manifest.files.items()},
        "manifest_size": manifest_size,
    }
    state = manifest.state
    data.update({key: state[key] for key in RANKING_KEYS if isinstance(state.get(key), str)})
    return data


def manifest_of(data: dict[str, Any]) -> tuple[Manifest, int]:
    """The listing part of a manifest, and its size in bytes, from an index entry.

    The manifest has no ``versions`` and only the ranking keys of its ``state``; read the
    checkpoint itself for the rest. Raises KeyError, TypeError or ValueError for a bad entry.
    """
    # Plain loops and `type() is`, no helpers: `list` decodes thousands (a bool is no count either).
    epoch, step, batch, size = data["epoch"], data["step"], data["batch"], data["manifest_size"]
    if type(epoch) is not int or type(step) is not int or type(batch) is not int or type(size) is not int:
        raise TypeError("epoch, step, batch and manifest_size must be integers")
    files = {}
    for rel, (n, crc) in data["files"].items():
        if type(n) is not int or type(crc) is not str:
            raise TypeError(f"bad size or CRC32C for {rel!r}")
        files[rel] = FileEntry(n, crc)
    metrics = data["metrics"]
    for value in metrics.values():
        if type(value) is not float:  # null stands for NaN; an int was hand-made
            metrics = {str(k): math.nan if v is None else float(v) for k, v in metrics.items()}
            break
    state = {key: data[key] for key in RANKING_KEYS if key in data}
    created = data["created"]
    if type(created) is not str:
        raise TypeError("created must be a string")
    return Manifest(epoch, step, batch, files, metrics, created, state=state), size


def _json_float(value: Any) -> float | None:
    number = float(value)  # a NumPy scalar from Keras' logs too
    return None if math.isnan(number) or math.isinf(number) else number


__all__ = ["INDEX_NAME", "decode", "encode", "entry", "manifest_of"]
