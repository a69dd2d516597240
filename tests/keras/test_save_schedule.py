"""`SaveSchedule`: "is a save due?" answered with plain numbers (no model, a clock passed in)."""

from __future__ import annotations

import math
import warnings

import pytest

from resumable.keras.callback.save_schedule import SaveSchedule


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def schedule(save_freq: str | int = "epoch", save_interval: float | None = None, *, mode: str = "min",
             save_best_only: bool = False, keep_best: int = 0, initial_best: float | None = None,
             clock: Clock | None = None) -> SaveSchedule:
    return SaveSchedule(save_freq, save_interval, "val_loss", mode, save_best_only=save_best_only,
                        keep_best=keep_best, initial_best=initial_best, clock=clock or Clock())


def test_save_freq_is_due_at_each_multiple_of_n_steps() -> None:
    s = schedule(save_freq=3)
    s.epoch_begins(0)
    assert [step for step in range(1, 11) if s.due_at_batch(step)] == [3, 6, 9]


def test_save_freq_counts_optimizer_steps_across_epochs_and_a_resumed_epoch() -> None:
    s = schedule(save_freq=4)
    s.epoch_begins(6)  # the rest of an epoch restored at step 6
    assert [step for step in range(7, 13) if s.due_at_batch(step)] == [8, 12]


def test_save_freq_is_due_when_several_steps_pass_a_multiple_at_once() -> None:
    s = schedule(save_freq=5)  # steps_per_execution=3: batch ends at steps 3, 6, 9, 12, 15
    s.epoch_begins(0)
    assert [step for step in (3, 6, 9, 12, 15) if s.due_at_batch(step)] == [6, 12, 15]


def test_epoch_saves_only_is_never_due_at_a_batch_end() -> None:
    s = schedule()
    s.epoch_begins(0)
    assert not any(s.due_at_batch(step) for step in range(1, 1000))


def test_save_interval_is_due_once_that_much_time_passed_since_the_last_save() -> None:
    clock = Clock()
    s = schedule(save_interval=60, clock=clock)
    s.epoch_begins(0)
    clock.now += 59.5
    assert not s.due_at_batch(1)
    clock.now += 0.5
    assert s.due_at_batch(2)
    s.restart_clock()  # the save
    clock.now += 30
    assert not s.due_at_batch(3)
    clock.now += 30
    assert s.due_at_batch(4)


def test_save_interval_combines_with_save_freq() -> None:
    clock = Clock()
    s = schedule(save_freq=10, save_interval=5, clock=clock)
    s.epoch_begins(0)
    due = []
    for step in range(1, 21):
        clock.now += 1
        if s.due_at_batch(step):
            due.append(step)
            s.restart_clock()
    assert due == [5, 10, 15, 20]


@pytest.mark.parametrize("mode, values, kept, best", [
    ("min", [0.5, 0.7, 0.4, 0.4, 0.3], [True, False, True, False, True], 0.3),
    ("max", [0.5, 0.7, 0.4, 0.7, 0.9], [True, True, False, False, True], 0.9),
])
def test_save_best_only_keeps_improvements_and_tracks_the_best(mode: str, values: list[float],
                                                                kept: list[bool], best: float) -> None:
    s = schedule(mode=mode, save_best_only=True)
    assert [s.keeps(i, {"val_loss": v}, mid_epoch=False) for i, v in enumerate(values)] == kept
    assert s.best == best


def test_without_save_best_only_every_epoch_is_kept_and_the_best_still_tracked() -> None:
    s = schedule(keep_best=1)
    assert all(s.keeps(i, {"val_loss": v}, mid_epoch=False) for i, v in enumerate([0.5, 0.9, 0.2]))
    assert s.best == 0.2


def test_a_mid_epoch_value_is_never_a_best_and_save_best_only_skips_it() -> None:
    s = schedule(save_best_only=True)
    assert not s.keeps(0, {"val_loss": 0.1}, mid_epoch=True)
    assert s.best is None
    assert schedule().keeps(0, {"val_loss": 0.1}, mid_epoch=True)


def test_initial_best_must_be_beaten_and_nan_never_improves() -> None:
    s = schedule(save_best_only=True, initial_best=0.3)
    assert not s.keeps(0, {"val_loss": 0.4}, mid_epoch=False)
    assert not s.keeps(1, {"val_loss": math.nan}, mid_epoch=False)
    assert s.keeps(2, {"val_loss": 0.2}, mid_epoch=False)
    assert s.best == 0.2


def test_save_best_only_with_a_monitor_never_logged_is_an_error_at_the_first_epoch() -> None:
    s = schedule(save_best_only=True)
    with pytest.raises(ValueError, match=r"monitor='val_loss', which fit did not log at the end of epoch 1.*"
                                         r"Expected one of: loss, val_accuracy\."):
        s.keeps(1, {"loss": 0.5, "val_accuracy": 0.7}, mid_epoch=False)


def test_save_best_only_without_validation_warns_and_saves_nothing() -> None:
    s = schedule(save_best_only=True)
    with pytest.warns(UserWarning, match="not logged without validation"):
        assert not s.keeps(0, {"loss": 0.5}, mid_epoch=False)


def test_keep_best_with_a_monitor_not_logged_warns_once() -> None:
    s = schedule(keep_best=2)
    with pytest.warns(UserWarning, match=r"keep_best=2 protects no checkpoint"):
        assert s.keeps(0, {"loss": 0.5}, mid_epoch=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert s.keeps(1, {"loss": 0.4}, mid_epoch=False)


def test_best_in_history_takes_the_monitor_over_the_epochs_from_the_initial_value() -> None:
    history = [{"val_loss": 0.6}, {"loss": 0.1}, {"val_loss": 0.45}, {"val_loss": 0.5}]
    assert schedule().best_in_history(history) == 0.45
    assert schedule(initial_best=0.4).best_in_history(history) == 0.4
    assert schedule(mode="max").best_in_history(history) == 0.6
    assert schedule().best_in_history([{"loss": 0.1}]) is None


def test_a_restored_best_of_the_same_monitor_is_taken_as_it_is() -> None:
    s = schedule()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.restore_best(0.25, [{"val_loss": 0.1}], "val_loss", "min", source="gs://b/run/ckpt-000002")
    assert s.best == 0.25


def test_a_restored_best_of_another_monitor_comes_from_the_history_said_once() -> None:
    s = schedule()
    with pytest.warns(UserWarning) as caught:
        s.restore_best(0.9, [{"val_loss": 0.5, "acc": 0.8}, {"val_loss": 0.3, "acc": 0.9}], "acc", "max",
                       source="gs://b/run/ckpt-000002")
    assert s.best == 0.3
    assert [str(w.message) for w in caught] == [
        "resumable: gs://b/run/ckpt-000002 tracked the best 'acc' (mode 'max'); this run monitors "
        "'val_loss' (mode 'min'), so its best is taken from the run's history: 0.3"]


def test_no_best_then_and_none_in_the_history_changes_nothing_and_says_nothing() -> None:
    s = schedule()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.restore_best(None, [{"acc": 0.8}], "acc", "max", source="ckpt-000001")
    assert s.best is None
