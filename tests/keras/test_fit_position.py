"""`FitPosition`: the epoch and batch a fit is at, and what it owes, with a real (untrained) model."""

from __future__ import annotations

import signal

import keras
import numpy as np
import pytest

from resumable.keras.callback.fit_position import FitPosition, RestoredState
from resumable.keras.checkpoint import training_state


def model_at_step(step: int) -> keras.Model:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(step)
    return model


def test_an_epoch_counts_its_batches_from_the_step_it_began_at() -> None:
    position = FitPosition()
    assert position.epoch_begins(model_at_step(10), RestoredState()) == 10
    assert position.in_epoch and position.batches_in_epoch == 0
    assert position.batch_ends(0, 0) == 11
    assert position.batch_ends(3, 0) == 14  # steps_per_execution=4: the last batch of a block
    assert position.batches_in_epoch == 4
    assert position.batch_at(16) == 6  # an interrupt two steps later
    position.epoch_ends()
    assert not position.in_epoch and position.batches_in_epoch == 0


def test_the_rest_of_a_restored_epoch_counts_the_batches_done_before() -> None:
    model = model_at_step(23)
    restored = RestoredState()
    restored.begin_partial_epoch(3, model)  # the checkpoint was taken 3 batches into its epoch
    position = FitPosition()
    assert position.epoch_begins(model, restored) == 23
    assert position.start_step == 20 and position.batches_in_epoch == 3
    assert position.batch_ends(0, restored.batch_offset) == 24  # this fit's first batch is the 4th
    assert position.batches_in_epoch == 4


def test_a_new_epoch_takes_the_rng_states_that_order_its_data() -> None:
    keras.utils.set_random_seed(5)
    position = FitPosition()
    position.epoch_begins(model_at_step(0), RestoredState())
    first = np.random.random()  # the epoch's data order draws from here on
    training_state.set_rng_state(position.epoch_rng)
    assert np.random.random() == first


def test_the_rest_of_a_restored_epoch_takes_its_saved_rng_states() -> None:
    model = model_at_step(5)
    restored = RestoredState()
    restored.epoch_rng = {"numpy": ["saved"]}  # the states at the start of the checkpoint's epoch
    restored.begin_partial_epoch(2, model)
    position = FitPosition()
    position.epoch_begins(model, restored)
    assert position.epoch_rng == {"numpy": ["saved"]}


def test_what_is_owed_is_handed_out_once() -> None:
    position = FitPosition()
    logs = {"loss": 1.0}
    position.pending_logs = logs
    position.witnessed = ("batch", 4, logs)
    position.request_stop(15)
    assert position.take_pending() is logs and position.take_pending() is None
    assert position.take_witnessed() == ("batch", 4, logs) and position.take_witnessed() is None
    assert position.take_stop_request() == 15 and position.take_stop_request() is None


def test_a_stop_request_stops_as_its_signal_would_have_once() -> None:
    position = FitPosition()
    position.stop_if_asked()  # none asked: nothing happens
    position.request_stop(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        position.stop_if_asked()
    assert exited.value.code == 128 + signal.SIGTERM
    position.stop_if_asked()  # acted on: asked no more
    position.request_stop(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        position.stop_if_asked()


def test_a_batch_end_or_an_epoch_end_reached_clears_what_the_witness_saw() -> None:
    position = FitPosition()
    position.epoch_begins(model_at_step(0), RestoredState())
    position.witnessed = ("batch", 0, {})
    position.batch_ends(0, 0)
    assert position.witnessed is None
    position.witnessed = ("epoch", 0, {})
    position.epoch_ends()
    assert position.witnessed is None


def test_a_new_fit_forgets_the_last_ones_epoch_and_debts_but_not_a_stop_request() -> None:
    position = FitPosition()
    position.epoch_begins(model_at_step(0), RestoredState())
    position.first_epoch = False
    position.pending_logs = {}
    position.witnessed = ("epoch", 0, {})
    position.request_stop(2)
    position.fit_begins()
    assert position.first_epoch and not position.in_epoch
    assert position.pending_logs is None and position.witnessed is None
    assert position.stop_signal == 2
