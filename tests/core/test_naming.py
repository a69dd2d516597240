"""Checkpoint folder names: built from a template, parsed back with a strict regex."""

from __future__ import annotations

import math

import pytest

from resumable.core.naming import DEFAULT_TEMPLATE, NameTemplate


@pytest.mark.parametrize(
    ("template", "epoch", "step", "logs", "mid_epoch", "name", "parsed"),
    [
        (DEFAULT_TEMPLATE, 12, 0, None, False, "ckpt-000012", (12, -1)),
        (DEFAULT_TEMPLATE, 12, 3400, None, True, "ckpt-000012-step-000003400", (12, 3400)),
        (DEFAULT_TEMPLATE, 1234567, 0, None, False, "ckpt-1234567", (1234567, -1)),  # wider than the pad
        ("ckpt-{epoch}", 9, 0, None, False, "ckpt-9", (9, -1)),
        ("e{epoch:03d}-s{step:07d}", 4, 812, None, True, "e004-s0000812", (4, 812)),  # {step} in the template
        (
            "weights-{epoch:02d}-{val_accuracy:.3f}",
            3,
            0,
            {"val_accuracy": 0.9123},
            False,
            "weights-03-0.912",
            (3, -1),
        ),
        (
            "weights-{epoch:02d}-{val_accuracy:.3f}",
            3,
            90,
            {"val_accuracy": 0.9123},
            True,
            "weights-03-0.912-step-000000090",
            (3, 90),
        ),
        ("w-{epoch:02d}-{val_loss:.4f}", 5, 0, {}, False, "w-05-nan", (5, -1)),  # metric not logged yet
        ("w-{epoch:02d}-{loss:.2f}", 5, 0, {"loss": -1.5}, False, "w-05--1.50", (5, -1)),
        ("w-{epoch:02d}-{loss:.2e}", 5, 0, {"loss": 0.000123}, False, "w-05-1.23e-04", (5, -1)),
        ("w-{epoch:02d}-{loss:.2E}", 5, 0, {"loss": math.inf}, False, "w-05-INF", (5, -1)),
        ("w-{epoch:02d}-{acc:.1%}", 5, 0, {"acc": 0.912}, False, "w-05-91.2%", (5, -1)),
        ("run.{epoch}.(x)+", 2, 0, None, False, "run.2.(x)+", (2, -1)),  # regex characters are literal
    ],
)
def test_format_and_parse(
    template: str,
    epoch: int,
    step: int,
    logs: dict[str, float] | None,
    mid_epoch: bool,
    name: str,
    parsed: tuple[int, int],
) -> None:
    t = NameTemplate(template)
    assert t.format(epoch, step, logs, mid_epoch=mid_epoch) == name
    assert t.parse(name) == parsed


@pytest.mark.parametrize(
    "name",
    [
        "ckpt-12",
        "ckpt-000012.tmp",
        "ckpt-",
        "ckpt-00001x",
        "ckpt-000012-step-",
        "xckpt-000012",
        "ckpt-000012-step-12-step-13",
        "manifest.json",
        "",
    ],
)
def test_parse_rejects_other_names(name: str) -> None:
    t = NameTemplate("ckpt-{epoch:06d}")
    expected = (12, -1) if name == "ckpt-12" else None  # \d+: a shorter number still parses
    assert t.parse(name) == expected


def test_end_of_epoch_sorts_before_the_mid_epoch_saves_that_follow_it() -> None:
    t = NameTemplate()
    names = [
        "ckpt-000003",
        "ckpt-000002-step-000000250",
        "ckpt-000002",
        "ckpt-000010",
        "ckpt-000002-step-000000210",
    ]
    assert sorted(names, key=lambda n: t.parse(n) or (-1, -1)) == [
        "ckpt-000002",
        "ckpt-000002-step-000000210",
        "ckpt-000002-step-000000250",
        "ckpt-000003",
        "ckpt-000010",
    ]


def test_repeated_epoch_field_must_agree() -> None:
    t = NameTemplate("e{epoch}-again{epoch}")
    assert t.parse("e3-again3") == (3, -1)
    assert t.parse("e3-again4") is None


@pytest.mark.parametrize(
    "template", ["ckpt", "ckpt-{step}", "runs/ckpt-{epoch}", "a\\{epoch}", "{epoch", "", "ckpt-{epoch}\n"]
)
def test_invalid_templates_are_refused_with_the_argument_named(template: str) -> None:
    with pytest.raises(ValueError, match=r"Invalid value for argument `filename`\. Received: filename="):
        NameTemplate(template)


def test_round_trip_over_many_values() -> None:
    t = NameTemplate("weights-{epoch:02d}-{val_loss:.3f}")
    for epoch in (0, 1, 9, 10, 99, 100, 12345):
        for step in (0, 1, 999, 10**9 + 7):
            for loss in (0.0, 0.1234, -3.5, 1e9, math.nan):
                assert t.parse(t.format(epoch, step, {"val_loss": loss})) == (epoch, -1)
                assert t.parse(t.format(epoch, step, {"val_loss": loss}, mid_epoch=True)) == (epoch, step)


def test_batch_is_the_batch_within_the_epoch() -> None:
    template = NameTemplate("e{epoch:02d}-b{batch:04d}")
    name = template.format(2, 250, mid_epoch=True, batch=50)
    assert name == "e02-b0050-step-000000250"
    assert template.parse(name) == (2, 250)
    assert template.format(3, 300) == "e03-b0000"  # an epoch's end
    assert template.parse("e03-b0000") == (3, -1)
