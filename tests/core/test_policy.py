"""The pure retention policy, tested with plain lists of a tiny stand-in for CheckpointInfo."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest

from resumable.core.policy import Retention, best, best_one, is_better, plan, resolve_mode


@dataclass(frozen=True)
class Ckpt:
    name: str
    ok: bool = True
    epoch: int | None = None
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    batch: int | None = 0


def run(*val_losses: float | None, partial_at: tuple[int, ...] = ()) -> list[Ckpt]:
    """Checkpoints of epochs 1..N, oldest first; None = no val_loss; indexes in partial_at = partial."""
    made = []
    for i, loss in enumerate(val_losses):
        epoch = i + 1
        if i in partial_at:
            made.append(Ckpt(f"ckpt-{epoch:06d}", ok=False))
        else:
            metrics = {} if loss is None else {"val_loss": loss, "val_accuracy": 1 - loss}
            made.append(Ckpt(f"ckpt-{epoch:06d}", epoch=epoch, step=epoch * 10, metrics=metrics))
    return made


def kept(checkpoints: list[Ckpt], retention: Retention) -> list[str]:
    return [d.name for d in plan(checkpoints, retention) if d.keep]


def epochs(*numbers: int) -> list[str]:
    return [f"ckpt-{n:06d}" for n in numbers]


@pytest.mark.parametrize(
    ("retention", "expected"),
    [
        (Retention(), epochs(1, 2, 3, 4, 5, 6)),
        (Retention(keep_last=1), epochs(6)),
        (Retention(keep_last=2), epochs(5, 6)),
        (Retention(keep_last=100), epochs(1, 2, 3, 4, 5, 6)),
        # the best (epoch 3) is always kept when a metric is monitored
        (Retention(keep_last=1, monitor="val_loss"), epochs(3, 6)),
        (Retention(keep_last=1, keep_best=2, monitor="val_loss"), epochs(3, 4, 6)),
        (Retention(keep_last=1, keep_best=2, monitor="val_loss", mode="max"), epochs(1, 5, 6)),
        # auto: accuracy-like names are maximised
        (Retention(keep_last=1, monitor="val_accuracy"), epochs(3, 6)),
        (Retention(keep_last=1, keep_every=2), epochs(2, 4, 6)),
        (Retention(keep_last=2, keep_every=3, keep_best=1, monitor="val_loss"), epochs(3, 5, 6)),
    ],
)
def test_plan_keeps_the_union_of_the_rules(retention: Retention, expected: list[str]) -> None:
    checkpoints = run(0.9, 0.5, 0.1, 0.2, 0.95, 0.4)
    assert kept(checkpoints, retention) == expected


def test_every_checkpoint_gets_a_decision_in_input_order_with_a_reason() -> None:
    checkpoints = run(0.9, 0.5, 0.1, 0.2)
    decisions = plan(checkpoints, Retention(keep_last=1, monitor="val_loss"))
    assert [d.name for d in decisions] == [c.name for c in checkpoints]
    assert all(d.reasons for d in decisions)
    by_name = {d.name: d for d in decisions}
    assert by_name["ckpt-000004"].reasons == ["latest good", "last 1"]
    assert by_name["ckpt-000003"].reasons == ["best val_loss=0.1"]
    assert by_name["ckpt-000001"].reasons == ["beyond the last 1"]


@pytest.mark.parametrize(
    ("partial_at", "expected"),
    [
        # leftovers older than the newest good checkpoint go
        ((0, 2), epochs(4)),
        # a partial one newer than the latest good may still be being written: kept
        ((3,), epochs(3, 4)),
        ((1, 3), epochs(3, 4)),
    ],
)
def test_partial_checkpoints_go_only_when_older_than_the_latest_good(
    partial_at: tuple[int, ...], expected: list[str]
) -> None:
    checkpoints = run(0.4, 0.3, 0.2, 0.1, partial_at=partial_at)
    assert kept(checkpoints, Retention(keep_last=1)) == expected


def test_without_any_good_checkpoint_nothing_is_deleted() -> None:
    checkpoints = run(0.4, 0.3, partial_at=(0, 1))
    decisions = plan(checkpoints, Retention(keep_last=1, monitor="val_loss"))
    assert all(d.keep for d in decisions)


def test_the_latest_good_checkpoint_is_kept_when_the_newest_is_partial() -> None:
    checkpoints = run(0.4, 0.3, 0.9, partial_at=(2,))
    decisions = {d.name: d for d in plan(checkpoints, Retention(keep_last=1))}
    assert decisions["ckpt-000002"].keep and "latest good" in decisions["ckpt-000002"].reasons
    assert not decisions["ckpt-000001"].keep


def test_an_empty_run_has_an_empty_plan() -> None:
    assert plan([], Retention(keep_last=1, monitor="val_loss")) == []


def test_best_ignores_missing_and_nan_metrics_and_prefers_the_newer_on_ties() -> None:
    checkpoints = run(0.3, None, math.nan, 0.3, 0.5)
    assert [c.name for c in best(checkpoints, "val_loss")] == epochs(4, 1, 5)
    # the plan keeps the newer of two equal bests
    assert kept(checkpoints, Retention(keep_last=1, monitor="val_loss")) == epochs(4, 5)


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("losses", [
    (0.3, None, math.nan, 0.3, 0.5), (), (None, math.nan), (math.inf, math.inf), (-math.inf, 1.0, -math.inf),
    (0.5,), (0.2, 0.1, 0.1, 0.3), (0.1, 0.9, 0.9, 0.1),
])
def test_best_one_is_the_first_of_best(losses: tuple[float | None, ...], mode: str) -> None:
    """The one-pass version `resumable list` uses agrees with the sorted ranking, ties included."""
    checkpoints = run(*losses, partial_at=(2,) if len(losses) > 2 else ())
    ranked = best(checkpoints, "val_loss", mode)
    assert best_one(checkpoints, "val_loss", mode) is (ranked[0] if ranked else None)


def test_keep_every_keeps_the_end_of_epoch_save_not_the_mid_epoch_ones() -> None:
    checkpoints = [
        Ckpt("ckpt-000002", epoch=2, step=20),
        Ckpt("ckpt-000002-step-000000025", epoch=2, step=25, batch=5),
        Ckpt("ckpt-000003", epoch=3, step=30),
        Ckpt("ckpt-000003-step-000000035", epoch=3, step=35, batch=5),
    ]
    expected = ["ckpt-000002", "ckpt-000003", "ckpt-000003-step-000000035"]
    assert kept(checkpoints, Retention(keep_last=1, keep_every=2)) == expected


def test_keep_every_falls_back_to_the_earliest_mid_epoch_save_when_the_end_of_epoch_one_is_gone() -> None:
    checkpoints = [
        Ckpt("ckpt-000002-step-000000025", epoch=2, step=25, batch=5),
        Ckpt("ckpt-000002-step-000000028", epoch=2, step=28, batch=8),
        Ckpt("ckpt-000003", epoch=3, step=30),
    ]
    expected = ["ckpt-000002-step-000000025", "ckpt-000003"]
    assert kept(checkpoints, Retention(keep_last=1, keep_every=2)) == expected


def with_mid_epoch_saves(epochs_done: int, per_epoch: int, *, then: int = 0) -> list[Ckpt]:
    """A run saved with save_freq: each epoch's end, then ``per_epoch`` saves during the next
    epoch (10 batches an epoch, a step a batch); ``then`` more saves during the epoch after the last."""
    made = []
    for epoch in range(1, epochs_done + 1):
        made.append(Ckpt(f"ckpt-{epoch:06d}", epoch=epoch, step=epoch * 10))
        count = per_epoch if epoch < epochs_done else then
        for k in range(1, count + 1):
            step = epoch * 10 + k * 3
            made.append(Ckpt(f"ckpt-{epoch:06d}-step-{step:09d}", epoch=epoch, step=step, batch=k * 3))
    return made


def test_keep_last_counts_epoch_ends_so_mid_epoch_saves_never_push_them_out() -> None:
    checkpoints = with_mid_epoch_saves(5, per_epoch=3)  # 5 epoch ends, 12 mid-epoch saves between them
    assert kept(checkpoints, Retention(keep_last=3)) == epochs(3, 4, 5)
    decisions = {d.name: d.reasons for d in plan(checkpoints, Retention(keep_last=3))}
    assert decisions["ckpt-000004-step-000000043"] == ["mid-epoch, an epoch end is newer"]
    assert decisions["ckpt-000002"] == ["beyond the last 3"]


def test_mid_epoch_saves_after_the_newest_epoch_end_are_kept_until_the_next_one() -> None:
    checkpoints = with_mid_epoch_saves(4, per_epoch=3, then=5)  # 5 saves into epoch 5 so far
    expected = [*epochs(2, 3, 4), "ckpt-000004-step-000000049", "ckpt-000004-step-000000052",
                "ckpt-000004-step-000000055"]
    assert kept(checkpoints, Retention(keep_last=3)) == expected
    reasons = {d.name: d.reasons for d in plan(checkpoints, Retention(keep_last=3))}
    assert reasons["ckpt-000004-step-000000055"] == ["latest good", "mid-epoch, after the last epoch end"]
    assert reasons["ckpt-000004-step-000000046"] == ["beyond the last 3"]
    # the epoch ends: the next end-of-epoch checkpoint sends them all
    checkpoints.append(Ckpt("ckpt-000005", epoch=5, step=50))
    assert kept(checkpoints, Retention(keep_last=3)) == epochs(3, 4, 5)


def test_a_run_of_mid_epoch_saves_only_keeps_the_newest_of_them() -> None:
    """save_interval on one long epoch: no epoch has ended yet."""
    checkpoints = [Ckpt(f"ckpt-000000-step-{s:09d}", epoch=0, step=s, batch=s) for s in (3, 6, 9, 12)]
    assert kept(checkpoints, Retention(keep_last=2)) == [
        "ckpt-000000-step-000000009", "ckpt-000000-step-000000012"]


def test_a_mid_epoch_save_is_never_the_best() -> None:
    """Its metrics are running averages over part of an epoch: the callback's best ignores them,
    and so do `best` (`resumable list`'s "best") and retention's keep_best."""
    checkpoints = with_mid_epoch_saves(3, per_epoch=2)
    checkpoints = [replace(c, metrics={"val_loss": 1.0 / (c.step or 1)}) for c in checkpoints]
    mid = checkpoints[1] = replace(checkpoints[1], metrics={"val_loss": 0.001})  # better than any epoch end
    assert best_one(checkpoints, "val_loss") is checkpoints[-1]  # the newest epoch end: the lowest of them
    assert mid.name not in [c.name for c in best(checkpoints, "val_loss")]
    assert mid.name not in kept(checkpoints, Retention(keep_last=1, keep_best=2, monitor="val_loss"))


def test_plan_is_linear_enough_for_thousands_of_checkpoints() -> None:
    checkpoints = [
        Ckpt(f"ckpt-{i:06d}", epoch=i, step=i, metrics={"val_loss": 1 / i}) for i in range(1, 5001)
    ]
    retention = Retention(keep_last=3, keep_best=2, monitor="val_loss", keep_every=1000)
    assert kept(checkpoints, retention) == epochs(1000, 2000, 3000, 4000, 4998, 4999, 5000)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"keep_last": 0}, "keep_last"),
        ({"keep_last": -1}, "keep_last"),
        ({"keep_last": True}, "keep_last"),
        ({"keep_every": 0}, "keep_every"),
        ({"keep_best": -1}, "keep_best"),
        ({"mode": "lowest"}, "mode"),
        ({"keep_best": 2}, "monitor"),
    ],
)
def test_invalid_retention_names_the_argument(kwargs: dict[str, object], argument: str) -> None:
    with pytest.raises(ValueError, match=f"argument `{argument}`"):
        Retention(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("monitor", "mode", "expected"),
    [
        ("val_loss", "auto", "min"),
        ("val_accuracy", "auto", "max"),
        ("acc", "auto", "max"),
        ("val_auc", "auto", "max"),
        ("val_loss", "max", "max"),
        ("val_accuracy", "min", "min"),
        (None, "auto", "min"),
    ],
)
def test_resolve_mode(monitor: str | None, mode: str, expected: str) -> None:
    assert resolve_mode(monitor, mode) == expected


@pytest.mark.parametrize(
    ("value", "best_so_far", "mode", "expected"),
    [
        (0.1, None, "min", True),
        (0.1, 0.2, "min", True),
        (0.3, 0.2, "min", False),
        (0.3, 0.2, "max", True),
        (0.2, 0.2, "min", False),
        (math.nan, None, "min", False),
        (0.5, math.nan, "max", True),
    ],
)
def test_is_better(value: float, best_so_far: float | None, mode: str, expected: bool) -> None:
    assert is_better(value, best_so_far, mode) is expected
