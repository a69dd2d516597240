"""Retention: which checkpoints to keep. Pure functions over checkpoint descriptions.

The callback's ``keep_last`` / ``keep_best`` and the CLI's ``prune`` both call `plan`;
deleting is the storage layer's job. Two checkpoints are always kept: the newest good one
and (when a metric is monitored) the best one.

``keep_last`` counts end-of-epoch checkpoints: with ``save_freq`` or ``save_interval`` a run
also saves mid-epoch, and those must not push the epoch ends out. A mid-epoch save (``batch``
> 0) is kept only while it is newer than the newest end-of-epoch checkpoint (the last
``keep_last`` of those), so that once the epoch it was saved in ends, it goes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class CheckpointLike(Protocol):
    """What retention needs to know about a checkpoint (CheckpointInfo satisfies it)."""

    @property
    def name(self) -> str: ...

    @property
    def ok(self) -> bool: ...

    @property
    def epoch(self) -> int | None: ...

    @property
    def step(self) -> int | None: ...

    @property
    def batch(self) -> int | None: ...  # batches into the next epoch: > 0 for a mid-epoch save

    @property
    def metrics(self) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class Retention:
    """What to keep.

    Args:
        keep_last: Keep the newest N good end-of-epoch checkpoints, and the newest N mid-epoch
            saves newer than all of them; None keeps all. Defaults to None.
        keep_best: Keep the best N by `monitor`. Defaults to 0.
        monitor: Metric name for `keep_best`, e.g. ``"val_loss"``. Defaults to None.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (max for accuracy-like names). Defaults to "auto".
        keep_every: Also keep every checkpoint whose epoch is a multiple of N. Defaults to None.
    """

    keep_last: int | None = None
    keep_best: int = 0
    monitor: str | None = None
    mode: str = "auto"
    keep_every: int | None = None

    def __post_init__(self) -> None:
        for arg in ("keep_last", "keep_every"):
            value = getattr(self, arg)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(
                    f"Invalid value for argument `{arg}`. Received: {arg}={value!r}. "
                    "Expected an int >= 1 or None."
                )
        if not isinstance(self.keep_best, int) or isinstance(self.keep_best, bool) or self.keep_best < 0:
            raise ValueError(
                f"Invalid value for argument `keep_best`. Received: keep_best={self.keep_best!r}. "
                "Expected an int >= 0."
            )
        if self.mode not in ("auto", "min", "max"):
            raise ValueError(
                f"Invalid value for argument `mode`. Received: mode={self.mode!r}. "
                "Expected 'auto', 'min' or 'max'."
            )
        if self.keep_best and not self.monitor:
            raise ValueError(
                f"Invalid value for argument `monitor`. Received: monitor={self.monitor!r} "
                f"with keep_best={self.keep_best}. Expected a metric name such as 'val_loss'."
            )


@dataclass
class Decision:
    """Keep or delete one checkpoint, and why (reasons are short phrases for the CLI)."""

    name: str
    keep: bool
    reasons: list[str] = field(default_factory=list)


def resolve_mode(monitor: str | None, mode: str = "auto") -> str:
    """``"min"`` or ``"max"``; ``auto`` means max for accuracy-like metrics, as in Keras."""
    if mode in ("min", "max"):
        return mode
    name = (monitor or "").lower()
    return "max" if ("acc" in name or name.startswith("fmeasure") or name.endswith("auc")) else "min"


def is_better(value: float, best: float | None, mode: str) -> bool:
    """True when ``value`` improves on ``best`` under ``mode`` ('min' or 'max'); NaN never does."""
    if math.isnan(value):
        return False
    if best is None or math.isnan(best):
        return True
    return value < best if mode == "min" else value > best


def best(checkpoints: Sequence[CheckpointLike], monitor: str, mode: str = "auto") -> list[CheckpointLike]:
    """Good end-of-epoch checkpoints that logged ``monitor``, best first (ties: the newer first).

    ``checkpoints`` are ordered oldest first. A mid-epoch save is never a best: its metrics are
    running averages over part of an epoch.
    """
    sign = 1 if resolve_mode(monitor, mode) == "min" else -1
    scored = [(score, c) for c in _newest_first(checkpoints) if (score := _score(c, monitor)) is not None]
    scored.sort(key=lambda pair: pair[0] * sign)  # stable: among ties the newer stays first
    return [c for _, c in scored]


def best_one(
    checkpoints: Sequence[CheckpointLike], monitor: str, mode: str = "auto"
) -> CheckpointLike | None:
    """The first of `best`, or None, in one pass without sorting: `resumable list` ranks thousands."""
    sign = 1 if resolve_mode(monitor, mode) == "min" else -1
    found, found_score = None, 0.0
    for c in _newest_first(checkpoints):
        if c.batch:  # mid-epoch: part of an epoch's running averages, never a best
            continue
        value = c.metrics.get(monitor)
        if value is None or value != value:  # not logged, or NaN: `_score` inlined, a call per checkpoint
            continue
        if found is None or float(value) * sign < found_score:  # ties: the newer stays
            found, found_score = c, float(value) * sign
    return found


def plan(checkpoints: Sequence[CheckpointLike], retention: Retention) -> list[Decision]:
    """Decide for every checkpoint whether to keep it.

    ``checkpoints`` must be ordered oldest first, as `RunStorage.list` returns them: a
    partial checkpoint has no manifest, so its place in the list is all that dates it.

    - The newest good checkpoint is always kept, and so is the best one when monitoring.
    - ``keep_last`` N keeps the newest N good end-of-epoch checkpoints, and of the mid-epoch
      saves newer than the newest of those, the newest N: a mid-epoch save goes once an
      epoch end follows it, however many there were.
    - ``keep_last``, ``keep_best`` and ``keep_every`` add to what is kept (any-of).
    - Partial or corrupt checkpoints older than the newest good one are deleted;
      newer ones are kept, since another process may still be writing them.
    """
    decisions = {c.name: Decision(c.name, keep=False) for c in checkpoints}
    good = _newest_first(checkpoints)
    newest_good_at = max((i for i, c in enumerate(checkpoints) if c.ok), default=-1)

    if good:
        decisions[good[0].name].reasons.append("latest good")
    newest_end_at = max((i for i, c in enumerate(checkpoints) if c.ok and not c.batch), default=-1)
    if retention.keep_last is None:
        for c in good:
            decisions[c.name].reasons.append("keep all")
    else:
        ends = [c for c in good if not c.batch]
        after_newest_end = {id(c) for c in checkpoints[newest_end_at + 1:]}
        since = [c for c in good if c.batch and id(c) in after_newest_end]
        for c in ends[: retention.keep_last]:
            decisions[c.name].reasons.append(f"last {retention.keep_last}")
        for c in since[: retention.keep_last]:
            decisions[c.name].reasons.append("mid-epoch, after the last epoch end")
    if retention.monitor:
        ranked = best(checkpoints, retention.monitor, retention.mode)  # oldest first, as best() expects
        for rank, c in enumerate(ranked[: max(retention.keep_best, 1)]):
            label = "best" if rank == 0 else f"best {retention.keep_best}"
            score = _score(c, retention.monitor)
            decisions[c.name].reasons.append(f"{label} {retention.monitor}={score:.4g}")
    if retention.keep_every:
        first_of_epoch = _first_of_each_epoch(good)
        for c in good:
            if c.epoch and c.epoch % retention.keep_every == 0 and first_of_epoch[c.epoch] is c:
                decisions[c.name].reasons.append(f"every {retention.keep_every} epochs")

    for position, c in enumerate(checkpoints):
        decision = decisions[c.name]
        if c.ok:
            decision.keep = bool(decision.reasons)
            if not decision.keep:
                decision.reasons.append(
                    "mid-epoch, an epoch end is newer" if c.batch and position < newest_end_at
                    else _why_dropped(retention)
                )
        elif position < newest_good_at:
            decision.reasons.append("unfinished or corrupt, older than the latest good")
        else:
            decision.keep = True
            decision.reasons.append("unfinished or corrupt, newer than the latest good: may be in progress")
    return [decisions[c.name] for c in checkpoints]


def _why_dropped(retention: Retention) -> str:
    if retention.keep_last is not None:
        return f"beyond the last {retention.keep_last}"
    return "not kept by any rule"


def _newest_first(checkpoints: Sequence[CheckpointLike]) -> list[CheckpointLike]:
    return [c for c in reversed(checkpoints) if c.ok]


def _score(c: CheckpointLike, monitor: str) -> float | None:
    if c.batch:  # a mid-epoch save: never a best
        return None
    value = c.metrics.get(monitor)
    if value is None or math.isnan(value):
        return None
    return float(value)


def _first_of_each_epoch(good: Sequence[CheckpointLike]) -> dict[int | None, CheckpointLike]:
    """The save with the lowest step of each epoch: the end-of-epoch one, not the mid-epoch saves after it.

    One pass, so that keep-every stays linear on runs with thousands of checkpoints.
    """
    first: dict[int | None, CheckpointLike] = {}
    for c in good:
        kept = first.get(c.epoch)
        if kept is None or (c.step or 0) < (kept.step or 0):
            first[c.epoch] = c
    return first
