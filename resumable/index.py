"""The run index: copies of the committed manifests in one object, so `list` costs two requests.

``<run>/index.json`` is a cache, never the truth. A checkpoint is committed by its own
manifest; the index is rewritten after each commit and before each delete, so at worst it
misses a checkpoint (listing then reads that folder's manifest) or names one whose folder is
gone (listing drops it). Restoring, verifying and pruning always read the manifests.
See docs/format.md.
"""

from __future__ import annotations

import json
from typing import Any

INDEX_NAME = "index.json"
INDEX_FORMAT = "resumable.index"
INDEX_VERSION = 1


def decode(data: bytes | None) -> dict[str, dict[str, Any]]:
    """The index's entries by checkpoint name, ``{"manifest": raw manifest dict, "manifest_size": bytes}``.

    Returns {} for a missing or unreadable index.

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
        return {}  # another version's layout: list reads the manifests instead
    entries = raw.get("checkpoints")
    if not isinstance(entries, dict):
        return {}
    return {str(name): entry for name, entry in entries.items() if isinstance(entry, dict)}


def encode(entries: dict[str, dict[str, Any]]) -> bytes:
    """Compact JSON: the index of a long run holds thousands of manifests."""
    data = {"format": INDEX_FORMAT, "format_version": INDEX_VERSION,
            "checkpoints": dict(sorted(entries.items()))}
    return json.dumps(data, separators=(",", ":")).encode()


__all__ = ["INDEX_NAME", "decode", "encode"]
