"""The manifest: the file written last, whose presence commits a checkpoint.

It records every payload file with its size and CRC32C, plus what the checkpoint holds
(epoch, step, metrics, library versions and free-form state). See docs/format.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from resumable.core.errors import CorruptCheckpointError, UnsupportedFormatError

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "resumable.checkpoint"
FORMAT_VERSION = 1


class FileEntry(NamedTuple):  # a tuple, not a dataclass: `list` makes one per file of every checkpoint
    """One payload file: its size in bytes and CRC32C as 8 hex digits."""

    size: int
    crc32c: str


@dataclass
class Manifest:
    """What a committed checkpoint holds.

    Attributes:
        epoch: Epochs completed; a resumed fit starts with ``initial_epoch=epoch``.
        step: Optimizer steps completed over the whole run.
        batch: Batches completed in the epoch after ``epoch`` (0 at an epoch's end).
        files: Payload files by path relative to the checkpoint folder.
        metrics: The logs of the save (loss, val_loss, ...).
        created: UTC time of the commit, ISO 8601.
        versions: Versions of resumable, keras and the backend that wrote it.
        state: Free-form JSON state (callback state, history summary, ...).
        processes: Processes that trained the run (``jax.process_count()``, the workers of a
            ``tf.distribute`` cluster); None in manifests written before it was recorded.
        devices: Devices the model was trained on (the distribution's mesh, the strategy's
            replicas); None when unknown. The files hold whole arrays, so any count can restore.
    """

    epoch: int
    step: int = 0
    batch: int = 0
    files: dict[str, FileEntry] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    created: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    processes: int | None = None
    devices: int | None = None
    format_version: int = FORMAT_VERSION

    @property
    def total_size(self) -> int:
        return sum(entry.size for entry in self.files.values())

    @property
    def created_at(self) -> datetime | None:
        try:
            return datetime.fromisoformat(self.created)
        except ValueError:
            return None

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-able data (also the run index's entry for this checkpoint)."""
        data: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "epoch": self.epoch,
            "step": self.step,
            "batch": self.batch,
            "created": self.created or now_iso(),
            "metrics": {k: _json_float(v) for k, v in self.metrics.items()},
            "files": {
                name: {"size": entry.size, "crc32c": entry.crc32c}
                for name, entry in sorted(self.files.items())
            },
            "versions": self.versions,
            "state": self.state,
        }
        # Optional fields, added within format 1: absent when unknown, ignored by older readers.
        for key in ("processes", "devices"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse a manifest; ``where`` names it in errors. Raises CorruptCheckpointError."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(
                f"{where}: manifest is not valid JSON ({e}); the checkpoint is unusable, "
                "delete it with `resumable prune` or by hand"
            ) from e
        return cls.from_dict(raw, where)

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> Manifest:
        """Check and convert parsed manifest JSON; ``where`` names it in errors."""
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise CorruptCheckpointError(f"{where}: not a resumable manifest")
        version = raw.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CorruptCheckpointError(f"{where}: manifest has no valid format_version (got {version!r})")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{where}: manifest format {version} is newer than this resumable supports "
                f"({FORMAT_VERSION}); upgrade with `pip install -U keras-resumable`"
            )
        try:
            files = {
                str(name): FileEntry(size=int(e["size"]), crc32c=str(e["crc32c"]))
                for name, e in raw["files"].items()
            }
            unsafe = [name for name in files if not is_safe_relative(name)]
            if unsafe:  # a hand-edited or hostile manifest must not make fetch write elsewhere
                raise ValueError(f"file name {unsafe[0]!r} is not a plain relative path")
            return cls(
                epoch=int(raw["epoch"]),
                step=int(raw.get("step", 0)),
                batch=int(raw.get("batch", 0)),
                files=files,
                metrics={
                    str(k): math.nan if v is None else float(v)
                    for k, v in raw.get("metrics", {}).items()
                },
                created=str(raw.get("created", "")),
                versions={str(k): str(v) for k, v in raw.get("versions", {}).items()},
                state=dict(raw.get("state", {})),
                processes=_optional_count(raw, "processes"),
                devices=_optional_count(raw, "devices"),
                format_version=version,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptCheckpointError(
                f"{where}: manifest is missing or has a bad field ({type(e).__name__}: {e})"
            ) from e


def is_safe_relative(name: str) -> bool:
    """A file name a checkpoint may list: a plain relative path inside its folder, never the manifest."""
    parts = name.split("/")
    return (
        bool(name)
        and "\\" not in name
        and not name.startswith("/")
        and ":" not in parts[0]
        and all(part not in ("", ".", "..") for part in parts)
        and name != MANIFEST_NAME
    )


def _optional_count(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _json_float(value: Any) -> float | None:
    number = float(value)
    return None if math.isnan(number) or math.isinf(number) else number
