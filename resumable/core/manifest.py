"""The manifest: the file written last, whose presence commits a checkpoint.

It records every payload file with its size and CRC32C, plus what the checkpoint holds
(epoch, step, metrics, library versions and free-form state). See docs/format.md.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from resumable.core import safe_json
from resumable.core.errors import CorruptCheckpointError, UnsupportedFormatError

MANIFEST_NAME = "manifest.json"
MANIFEST_LIMIT = safe_json.MANIFEST_LIMIT  # bytes: larger is refused unread
FORMAT_NAME = "resumable.checkpoint"
FORMAT_VERSION = 1
# What resumable's Keras side has always saved (snapshot.MODEL_FILE, WEIGHTS_FILE): a manifest
# with a "keras" version and no `payload` must list one of them.
KERAS_PAYLOADS = ("model.keras", "model.weights.h5")
MAX_COUNT = 2**63 - 1  # epochs, steps and sizes fit an int64, as GCS and NumPy hold them
UNUSABLE = "the checkpoint is unusable, delete it with `resumable prune` or by hand"
_CRC32C = re.compile("[0-9a-f]{8}")
_KINDS: dict[type, str] = {str: "a string", dict: "an object"}
_MISSING = object()


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
        payload: The file a loader opens (the Keras side's ``model.keras`` or
            ``model.weights.h5``); None when the writer did not say (writers other than Keras).
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
    payload: str | None = None
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
        for key in ("processes", "devices", "payload"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse a manifest; ``where`` names it in errors. Raises CorruptCheckpointError.

        ``data`` over `MANIFEST_LIMIT` bytes is refused unread: callers read at most one byte more.
        """
        try:
            raw = safe_json.loads(data, MANIFEST_LIMIT)
        except safe_json.RefusedJSON as e:
            raise CorruptCheckpointError(f"{where}: manifest {e}; {UNUSABLE}") from None
        return cls.from_dict(raw, where)

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> Manifest:
        """Check and convert parsed manifest JSON; ``where`` names it in errors.

        Every field must have its documented type and range (docs/format.md), and the files
        must name something to restore (`check_usable`): a hand-edited or hostile manifest is
        corrupt, never half-read.
        """
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise CorruptCheckpointError(f"{where}: not a resumable manifest")
        version = raw.get("format_version")
        if type(version) is not int or version < 1:
            raise CorruptCheckpointError(
                f"{where}: manifest has no valid format_version (got {_shown(version)})")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{where}: manifest format {version} is newer than this resumable supports "
                f"({FORMAT_VERSION}); upgrade with `pip install -U keras-resumable`"
            )
        try:
            manifest = cls(
                epoch=_count(raw, "epoch", required=True),
                step=_count(raw, "step"),
                batch=_count(raw, "batch"),
                files=_files(raw.get("files", _MISSING)),
                metrics=_metrics(raw.get("metrics", {})),
                created=_typed(raw, "created", str, ""),
                versions=_strings(raw.get("versions", {})),
                state=_typed(raw, "state", dict, {}),
                processes=_optional_count(raw, "processes"),
                devices=_optional_count(raw, "devices"),
                payload=_typed(raw, "payload", str, None),
                format_version=version,
            )
            manifest.check_usable()
        except ValueError as e:
            raise CorruptCheckpointError(
                f"{where}: manifest is missing or has a bad field ({e}); {UNUSABLE}"
            ) from None
        return manifest

    def check_usable(self) -> None:
        """ValueError unless the manifest names something a loader can restore.

        It must list files; its `payload`, when given, must be one of them; and one written by
        the Keras side (a ``keras`` version) without a `payload` must list a file that side
        always saves (`KERAS_PAYLOADS`). Otherwise retention could keep it as the newest good
        checkpoint and delete the real ones.
        """
        if not self.files:
            raise ValueError("files: lists no file, so there is nothing to restore")
        if self.payload is not None:
            if self.payload not in self.files:
                raise ValueError(f"payload: {_shown(self.payload)} is not among the files")
        elif "keras" in self.versions and not any(name in self.files for name in KERAS_PAYLOADS):
            raise ValueError(f"files: written by Keras but lists neither {' nor '.join(KERAS_PAYLOADS)}")


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


def _count(raw: dict[str, Any], key: str, *, required: bool = False) -> int:
    """A count (epoch, step, batch): an integer, 0 or more; 0 when absent and not ``required``."""
    if key not in raw:
        if required:
            raise ValueError(f"{key}: missing")
        return 0
    value = raw[key]
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{key}: expected an integer >= 0, got {_shown(value)}")
    return value


def _optional_count(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"{key} must be a positive integer, got {_shown(value)}")
    return value


def _typed(raw: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """``raw[key]`` when it is a ``kind``; ``default`` when absent (or null)."""
    value = raw.get(key)
    if value is None:
        return default
    if type(value) is not kind:
        raise ValueError(f"{key}: expected {_KINDS[kind]}, got {_shown(value)}")
    return value


def _files(files: Any) -> dict[str, FileEntry]:
    if files is _MISSING:
        raise ValueError("files: missing")
    if type(files) is not dict:
        raise ValueError(f"files: expected an object, got {_shown(files)}")
    entries = {}
    for name, entry in files.items():
        if not is_safe_relative(name):  # a hand-edited or hostile manifest: fetch must not write elsewhere
            raise ValueError(f"file name {_shown(name)} is not a plain relative path")
        where = f"files[{_shown(name)}]"
        if type(entry) is not dict:
            raise ValueError(f"{where}: expected an object with size and crc32c")
        size, crc32c = entry.get("size"), entry.get("crc32c")
        if type(size) is not int or not 0 <= size <= MAX_COUNT:
            raise ValueError(f"{where}.size: expected an integer >= 0, got {_shown(size)}")
        if type(crc32c) is not str or not _CRC32C.fullmatch(crc32c):
            raise ValueError(f"{where}.crc32c: expected 8 lowercase hex digits, got {_shown(crc32c)}")
        entries[name] = FileEntry(size, crc32c)
    return entries


def _metrics(metrics: Any) -> dict[str, float]:
    """Numbers, null for NaN and infinities (JSON has neither)."""
    if type(metrics) is not dict:
        raise ValueError(f"metrics: expected an object, got {_shown(metrics)}")
    found = {}
    for name, value in metrics.items():
        if value is not None and type(value) not in (int, float):
            raise ValueError(f"metrics[{_shown(name)}]: expected a number or null, got {_shown(value)}")
        found[name] = math.nan if value is None else float(value)
    return found


def _strings(versions: Any) -> dict[str, str]:
    if type(versions) is not dict or any(type(v) is not str for v in versions.values()):
        raise ValueError(f"versions: expected an object of strings, got {_shown(versions)}")
    return versions


def _shown(value: Any) -> str:
    """A value as an error message quotes it: short, one line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _json_float(value: Any) -> float | None:
    number = float(value)
    return None if math.isnan(number) or math.isinf(number) else number
