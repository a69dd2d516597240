"""The local tier (#55), Keras-free: its option (`LocalTier`), where it lives, the run id that ties
it to its durable run folder, and which tier's checkpoint is newer.

A run with a local tier keeps two run folders of the same format: the **durable** one the user
named (a local folder, a Drive mount, a bucket) and a **local** one on the VM's own disk, saved
more often and keeping only its newest checkpoint or two. A kernel crash keeps the VM's disk:
the next resume takes the local tier's newer checkpoint. A lost VM loses it: the durable one is
taken.

The durable run folder records a **run id** once (``run.json``, created only if absent, like the
lease a file directly in the run folder, never a checkpoint); the local run folder lives at
``<local root>/<run id>`` and records the same id. A local checkpoint is used only when the ids
match, it is newer than the durable tier's newest (`newer`) and its files pass their checksums.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resumable.core import safe_json
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager
from resumable.storage import CheckpointInfo, RunStorage

RUN_ID_FILE = "run.json"
RUN_ID_FORMAT = "resumable.run"
COLAB_ROOT = "/content/resumable-local"  # the VM's own disk, outside /content/drive
DEFAULT_EVERY_SECONDS = 60.0


@dataclass(frozen=True)
class LocalTier:
    """A fast local tier beside the durable run folder (`CheckpointCallback(local_tier=...)`).

    Args:
        folder: Where local run folders live, one per run (``<folder>/<run id>``). Defaults to
            None: ``/content/resumable-local`` on Colab, ``<tempdir>/resumable-local`` elsewhere.
        every_seconds: Save to the local tier once this many seconds of training passed since
            its last save. Defaults to 60.
        every_steps: Also save when the optimizer's step passes a multiple of N. Defaults to None.
        keep: The newest checkpoints the local tier keeps (its newest epoch end, and as many
            mid-epoch saves newer than it). Defaults to 1.
    """

    folder: str | Path | None = None
    every_seconds: float | None = DEFAULT_EVERY_SECONDS
    every_steps: int | None = None
    keep: int = 1

    def __post_init__(self) -> None:
        if self.folder is not None and (not isinstance(self.folder, (str, Path)) or "://" in str(self.folder)
                                        or not str(self.folder)):
            raise ValueError(
                f"Invalid value for argument `folder`. Received: folder={self.folder!r}. "
                "Expected a folder on this machine's own disk, such as '/content/resumable-local', or None.")
        seconds = self.every_seconds
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not math.isfinite(seconds) or seconds <= 0):
            raise ValueError(
                f"Invalid value for argument `every_seconds`. Received: every_seconds={seconds!r}. "
                "Expected a positive number of seconds, or None.")
        steps = self.every_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(
                f"Invalid value for argument `every_steps`. Received: every_steps={steps!r}. "
                "Expected an int >= 1, or None.")
        if seconds is None and steps is None:
            raise ValueError(
                "Invalid value for arguments `every_seconds` and `every_steps`. Received: both None. "
                "Expected at least one, e.g. every_seconds=60.")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ValueError(
                f"Invalid value for argument `keep`. Received: keep={self.keep!r}. Expected an int >= 1.")

    @property
    def root(self) -> Path:
        """The folder holding the local run folders."""
        return Path(self.folder) if self.folder is not None else default_root()

    def run_folder(self, run_id: str) -> Path:
        """The local run folder of the run ``run_id``."""
        return self.root / run_id


def check_local_tier(value: Any) -> LocalTier | None:
    """``local_tier=``'s value: False or None (off), True (`LocalTier`'s defaults), a `LocalTier`."""
    if value is None or value is False:
        return None
    if value is True:
        return LocalTier()
    if isinstance(value, LocalTier):
        return value
    raise ValueError(
        f"Invalid value for argument `local_tier`. Received: local_tier={value!r}. "
        "Expected False, True or resumable.LocalTier(...).")


def default_root() -> Path:
    """``/content/resumable-local`` on Colab (the VM's disk, not Drive), ``<tempdir>/resumable-local``
    elsewhere."""
    if "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ:
        return Path(COLAB_ROOT)
    return Path(tempfile.gettempdir()) / "resumable-local"


# ---------------------------------------------------------------------- the run id


def read_run_id(storage: RunStorage) -> str | None:
    """The run id a run folder records, or None (none recorded, or not one resumable wrote)."""
    found = storage.run_files.read_run_file(RUN_ID_FILE)
    if found is None:
        return None
    try:
        record = safe_json.loads(found[0], 4096)
    except ValueError:
        return None
    ours = isinstance(record, dict) and record.get("format") == RUN_ID_FORMAT
    run_id = record.get("run_id") if ours else None
    return run_id if isinstance(run_id, str) and len(run_id) == 32 and run_id.isalnum() else None


def record_run_id(storage: RunStorage, run_id: str | None = None) -> str:
    """The run folder's run id: the one it records, else ``run_id`` (a new one if None), recorded
    now, create-only (two processes racing both end with the one that landed)."""
    found = read_run_id(storage)
    if found is not None:
        return found
    new = run_id or uuid.uuid4().hex
    data = json.dumps({"format": RUN_ID_FORMAT, "version": 1, "run_id": new}, sort_keys=True).encode()
    if storage.run_files.create_run_file(RUN_ID_FILE, data) is not None:
        return new
    return read_run_id(storage) or new  # another process recorded one first (or left a bad file)


# ---------------------------------------------------------------------- the local run folder


def local_manager(tier: LocalTier, run_id: str, *, filename: str, lease_timeout: float,
                  verbose: bool = False) -> RunManager:
    """The manager of run ``run_id``'s local run folder: its own retention (the newest ``keep``),
    in-place commits on the local disk. Its writer takes the local lease over whoever held it:
    the durable tier's lease is the one that keeps two writers apart."""
    return RunManager(str(tier.run_folder(run_id)), filename=filename,
                      retention=Retention(keep_last=tier.keep, keep_best=0), lease_timeout=lease_timeout,
                      takeover=True, async_upload=True, verbose=verbose, when_behind="skip",
                      staging_dir=tier.root / ".staging" / run_id)


def position(info: CheckpointInfo | None) -> tuple[int, int]:
    """Where training stood at a checkpoint, comparable across tiers: (optimizer step, epoch)."""
    if info is None:
        return (-1, -1)
    return (int(info.step or 0), int(info.epoch or 0))


def newer(candidate: CheckpointInfo, than: CheckpointInfo | None) -> bool:
    """Whether ``candidate`` holds training past ``than`` (None: no checkpoint at all)."""
    return position(candidate) > position(than)


def where(info: CheckpointInfo | None) -> str:
    """A checkpoint's name and position in a few words: ``ckpt-000006-step-000000120 (epoch 7, batch 3)``
    (3 batches into epoch 7), ``ckpt-000006 (end of epoch 6)``."""
    if info is None:
        return "none"
    batch = info.manifest.batch if info.manifest is not None else 0
    at = f"epoch {(info.epoch or 0) + 1}, batch {batch}" if batch else f"end of epoch {info.epoch}"
    return f"{info.name} ({at})"


__all__ = ["COLAB_ROOT", "RUN_ID_FILE", "LocalTier", "check_local_tier", "default_root", "local_manager",
           "newer", "position", "read_run_id", "record_run_id", "where"]
