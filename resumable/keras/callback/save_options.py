"""`CheckpointCallback`'s constructor arguments, checked once: each bad value is one ValueError
naming the argument, what was received and what was expected (Keras' wording), raised before
anything is created; the callback and its collaborators then read `SaveOptions`."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from resumable.core.policy import Retention, resolve_mode
from resumable.keras.callback.save_schedule import SaveSchedule
from resumable.keras.checkpoint.memory_budget import SnapshotMemory
from resumable.manager import check_timeout
from resumable.manager.run_manager import RunManager
from resumable.manager.tiers import LocalTier, check_local_tier
from resumable.manager.uploader import check_when_behind

_MODEL_FILE_SUFFIXES = (".keras", ".h5", ".hdf5", ".weights.h5")
DEFAULT_SHARD_GIB = 1.0  # checkpoints' weights over this go to shards: several transfers at once

T = TypeVar("T")


@dataclass(frozen=True)
class SaveOptions:
    """What a `CheckpointCallback` was asked to do, validated (see its docstring for each)."""

    filepath: str
    monitor: str
    mode: str  # "min" or "max": "auto" resolved
    save_best_only: bool
    save_weights_only: bool
    save_trainable_only: bool
    save_freq: str | int
    save_interval: float | None  # seconds
    retention: Retention
    filename: str
    verbose: int
    initial_value_threshold: float | None
    staging_dir: str | Path | None
    storage_options: dict[str, Any] | None
    async_upload: bool
    takeover: bool
    lease_timeout: float  # seconds
    max_shard_size: float | None
    when_behind: str
    barrier_timeout: float  # seconds
    snapshot_memory: SnapshotMemory  # #54: what a save may copy to host memory
    local_tier: LocalTier | None = None  # #55: the fast local tier beside the run folder; None: off

    @property
    def file_format(self) -> str:
        """The payload a single process saves: ``"trainable"``, ``"weights"`` or ``"keras"``."""
        return "trainable" if self.save_trainable_only else "weights" if self.save_weights_only else "keras"

    def run_manager(self, process_index: int) -> RunManager:
        """The manager of the run folder these options name, for process ``process_index``."""
        return RunManager(
            self.filepath, filename=self.filename, storage_options=self.storage_options,
            staging_dir=self.staging_dir, retention=self.retention, lease_timeout=self.lease_timeout,
            takeover=self.takeover, async_upload=self.async_upload, verbose=bool(self.verbose),
            process_index=process_index, when_behind=self.when_behind,
        )

    def save_schedule(self) -> SaveSchedule:
        """A schedule of the saves these options ask for, with no best value yet beyond the threshold."""
        return SaveSchedule(self.save_freq, self.save_interval, self.monitor, self.mode,
                            save_best_only=self.save_best_only, keep_best=self.retention.keep_best,
                            initial_best=self.initial_value_threshold)


def check_options(
    filepath: Any,
    *,
    monitor: Any,
    mode: str,
    save_best_only: bool,
    save_weights_only: bool,
    save_trainable_only: Any,
    save_freq: Any,
    save_interval: Any,
    keep_last: int | None,
    keep_best: int,
    keep_every: int | None,
    filename: str,
    verbose: Any,
    initial_value_threshold: float | None,
    staging_dir: str | Path | None,
    storage_options: dict[str, Any] | None,
    async_upload: Any,
    takeover: Any,
    lease_timeout: Any,
    max_shard_size: Any,
    when_behind: Any,
    barrier_timeout: Any,
    snapshot_memory: Any,
    local_tier: Any = False,
) -> SaveOptions:
    """`CheckpointCallback`'s arguments as `SaveOptions`; ValueError for the first bad one. Every
    argument is given: the defaults are the constructor's alone."""
    _check_filepath(filepath)
    _check_save_freq(save_freq)
    interval = _check_save_interval(save_interval)
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(
            f"Invalid value for argument `monitor`. Received: monitor={monitor!r}. "
            "Expected a metric name such as 'val_loss'."
        )
    retention = Retention(keep_last=keep_last, keep_best=keep_best, monitor=monitor, mode=mode,
                          keep_every=keep_every)
    if verbose not in (0, 1, 2, True, False, "auto"):
        raise ValueError(
            f"Invalid value for argument `verbose`. Received: verbose={verbose!r}. "
            "Expected 0, 1 or 'auto'."
        )
    _check_bool("async_upload", async_upload)
    check_when_behind(when_behind)
    _check_bool("takeover", takeover)
    _check_bool("save_trainable_only", save_trainable_only)
    shard_size = _check_max_shard_size(max_shard_size)
    memory = SnapshotMemory(snapshot_memory)
    tier = check_local_tier(local_tier)
    lease_seconds = check_timeout(lease_timeout)
    barrier_seconds = check_timeout(barrier_timeout, "barrier_timeout", "how long a process of a "
                                    "multi-host job waits for the others at a save")
    return SaveOptions(
        filepath=str(filepath), monitor=monitor, mode=resolve_mode(monitor, mode),
        save_best_only=bool(save_best_only), save_weights_only=bool(save_weights_only),
        save_trainable_only=save_trainable_only, save_freq=save_freq, save_interval=interval,
        retention=retention, filename=filename, verbose=int(1 if verbose == "auto" else verbose),
        initial_value_threshold=None if initial_value_threshold is None else float(initial_value_threshold),
        staging_dir=staging_dir, storage_options=storage_options, async_upload=async_upload,
        takeover=takeover, lease_timeout=lease_seconds, max_shard_size=shard_size,
        when_behind=when_behind, barrier_timeout=barrier_seconds, snapshot_memory=memory, local_tier=tier,
    )


class Option(Generic[T]):
    """A read-only attribute of the callback that shows one of its `SaveOptions` (``cb.monitor``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Option[T]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> T: ...

    def __get__(self, obj: object | None, objtype: type | None = None) -> Option[T] | T:
        if obj is None:
            return self
        value: T = getattr(obj.options, self.name)  # type: ignore[attr-defined]
        return value

    def __set__(self, obj: object, value: T) -> None:
        raise AttributeError(f"`{self.name}` is a constructor argument: pass it when creating the callback")


class OptionAttributes:
    """The constructor arguments as read-only attributes (``cb.monitor``), read from ``options``."""

    options: SaveOptions

    filepath = Option[str]()
    monitor = Option[str]()
    mode = Option[str]()
    save_best_only = Option[bool]()
    save_weights_only = Option[bool]()
    save_trainable_only = Option[bool]()
    save_freq = Option[str | int]()
    save_interval = Option[float | None]()
    retention = Option[Retention]()
    verbose = Option[int]()
    async_upload = Option[bool]()
    takeover = Option[bool]()
    max_shard_size = Option[float | None]()
    when_behind = Option[str]()
    barrier_timeout = Option[float]()
    snapshot_memory = Option[SnapshotMemory]()
    local_tier = Option[LocalTier | None]()


def _check_bool(argument: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. "
            "Expected True or False."
        )


def _check_filepath(filepath: Any) -> None:
    text = str(filepath) if isinstance(filepath, (str, Path)) else ""
    if not text or text.endswith(_MODEL_FILE_SUFFIXES) or "{" in text:
        raise ValueError(
            f"Invalid value for argument `filepath`. Received: filepath={filepath!r}. "
            "Expected a run folder such as '/content/drive/MyDrive/runs/exp1' or 'gs://bucket/runs/exp1'; "
            "checkpoint names come from `filename`. "
            "To write model files by name, use resumable.ModelCheckpoint."
        )


def _check_max_shard_size(max_shard_size: Any) -> float | None:
    if max_shard_size is None:
        return None
    if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, (int, float)) or not (
            math.isfinite(max_shard_size) and max_shard_size > 0):
        raise ValueError(
            f"Invalid value for argument `max_shard_size`. Received: max_shard_size={max_shard_size!r}. "
            "Expected a size in GiB greater than 0, such as 1.0, or None for one file."
        )
    return float(max_shard_size)


def _check_save_interval(save_interval: Any) -> float | None:
    if save_interval is None:
        return None
    seconds = save_interval
    if isinstance(save_interval, datetime.timedelta):
        seconds = save_interval.total_seconds()
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if number and math.isfinite(seconds) and seconds > 0:
        return float(seconds)
    raise ValueError(
        f"Invalid value for argument `save_interval`. Received: save_interval={save_interval!r}. "
        "Expected a positive number of seconds or a datetime.timedelta, e.g. 600 for every 10 minutes."
    )


def _check_save_freq(save_freq: Any) -> None:
    if save_freq == "epoch":
        return
    if isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0:
        return
    raise ValueError(
        f"Invalid value for argument `save_freq`. Received: save_freq={save_freq!r}. "
        "Expected 'epoch' or a positive int."
    )


__all__ = ["DEFAULT_SHARD_GIB", "Option", "OptionAttributes", "SaveOptions", "check_options"]
