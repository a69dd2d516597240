"""The inputs and callbacks people train with, stopped at an epoch end and mid-epoch, resumed in a
new process: each run ends bitwise equal to an unbroken one, or says once why it cannot.

tests/jobs/inputs_job.py runs every case in turn in one process per phase, on each backend: one
process trains them all unbroken; for each way to stop (after an epoch; Ctrl-C two batches into
the next), one process stops them all and a new one resumes them all. Five processes per
backend, not five per case. The cases are the job's; what each must give is here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import backends
import numpy as np
import pytest
from forked import ForkedJob, job_env, start_job
from keras_helpers import assert_equal_weights, saved_weights
from paths import JOBS

# The job builds tf.data pipelines and reads TensorBoard's files: a lane without TensorFlow (Colab's
# TPU runtime) has neither. Of the lanes, the third backend and the oldest Keras run it in CI (about
# 5 minutes each); Keras 3.10 and 3.13.2 passed it too (`scripts/lanes.py run colab -- FILE`).
LANES = ("torch", "colab-2025-07")
pytestmark = [pytest.mark.slow, pytest.mark.lanes, backends.needs_tensorflow,
              pytest.mark.skipif(os.environ.get("RESUMABLE_LANE", "newest") not in (*LANES, "newest"),
                                 reason="the matrix runs on the torch, colab-2025-07 and newest lanes")]

JOB = JOBS / "inputs_job.py"
# A lane runs the matrix on its own backend (torch's lane on torch); the README's command on both
# TensorFlow and JAX.
BACKENDS = [os.environ["KERAS_BACKEND"]] if os.environ.get("KERAS_BACKEND") else ["tensorflow", "jax"]
STOPS = ["epoch", "batch"]

# Bitwise equal to the unbroken run, with no warning about the input.
EXACT = [
    "arrays", "arrays-weights", "arrays-class-weight", "tf.data-shuffle", "tf.data-repeat",
    "tf.data-pipeline", "pydataset-threads", "pydataset-processes", "pydataset-state", "generator",
    "callbacks", "callbacks-stopped",
]
# Said once: the warning names the input and what to change.
SAID = {
    "tf.data-unseeded": "(tf.data.Dataset) cannot be replayed exactly: its .shuffle() has no seed: "
                        "pass seed=",
    "tf.data-random-layer": "(tf.data.Dataset) cannot be replayed exactly: a function in it changes a "
                            "variable (a Keras random layer such as RandomFlip",
    "tf.data-fewer-steps": "(tf.data.Dataset) cannot be replayed exactly: steps_per_epoch=4 is less than "
                           "its 6 batches",
    "pydataset-own-order": "(PyDataset OwnOrder) cannot be replayed exactly: its on_epoch_end may reorder "
                           "its batches, and resumable cannot save that: give it get_state() and set_state()",
    "generator-started": "(generator stream()) cannot be replayed exactly: resumable cannot tell where "
                         "this generator stream() starts",
}
CANNOT = "cannot be replayed exactly"


def phases(out: Path, backend: str) -> None:
    """Every case unbroken, beside: every case stopped, then resumed in a new process (each
    process forked from the backend's job server)."""

    def start(phase: str, cases: list[str]) -> ForkedJob:
        return start_job(JOB, [phase, str(out), *cases], env=job_env(backend), output=out / f"{phase}.log")

    def finish(phase: str, job: ForkedJob) -> None:
        code = job.wait(timeout=900)
        assert code == 0, f"{phase} exited with {code}:\n" + (out / f"{phase}.log").read_text()[-3000:]

    unbroken = start("unbroken", EXACT)
    for phase in ("stop", "resume"):
        finish(phase, start(phase, [*EXACT, *SAID]))
    finish("unbroken", unbroken)


@pytest.fixture(scope="module", params=BACKENDS)
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"inputs-{request.param}")
    phases(out, request.param)
    return out


def report(out: Path, case: str, phase: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((out / f"{case}-{phase}.json").read_text())
    assert "error" not in found, f"{case} ({phase}): {found['error']}\n{found.get('traceback', '')}"
    return found


def weights(out: Path, case: str, phase: str) -> list[np.ndarray]:
    return saved_weights(out / f"{case}-{phase}.npz")


def said(found: dict[str, Any]) -> list[str]:
    return [w for w in found["warnings"] if CANNOT in w or "restarts from its first batch" in w]


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("case", EXACT)
def test_resumed_run_equals_the_unbroken_run(results: Path, case: str, stop: str) -> None:
    unbroken, resumed = report(results, case, "unbroken"), report(results, case, f"resume-{stop}")
    report(results, case, f"stop-{stop}")

    assert_equal_weights(weights(results, case, f"resume-{stop}"), weights(results, case, "unbroken"), case)
    assert resumed["history"] == unbroken["history"]  # the resumed epoch's metrics too
    assert said(resumed) == []


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("case", ["callbacks", "callbacks-stopped"])
def test_callbacks_continue_as_in_the_unbroken_run(results: Path, case: str, stop: str) -> None:
    unbroken, resumed = report(results, case, "unbroken"), report(results, case, f"resume-{stop}")
    seen, expected = resumed["callbacks"], unbroken["callbacks"]

    assert seen["csv"] == expected["csv"]  # one row per epoch, none twice, the same values
    assert seen["counter"] == expected["counter"]  # get_state()/set_state() of a callback of one's own
    # every TensorBoard summary at the step and with the value the unbroken run wrote
    assert seen["tensorboard"] == expected["tensorboard"]
    assert any(tag == "batch_loss" for _, tag, _, _ in expected["tensorboard"])


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize(("case", "line"), [
    ("callbacks", "complete: 3 of 3 epochs done; run.model holds the weights of epoch "),
    ("callbacks-stopped", "stopped early after epoch 2; nothing to do; run.model holds the weights of "
                          "epoch 1, the best val_loss (EarlyStopping restore_best_weights=True)"),
])
def test_running_a_finished_run_again_gives_the_model_it_ended_with(results: Path, case: str, line: str,
                                                                    stop: str) -> None:
    resumed = report(results, case, f"resume-{stop}")

    assert line in resumed["rerun"]
    assert_equal_weights(weights(results, case, f"resume-{stop}-rerun"), weights(results, case, "unbroken"),
                        f"{case} run again")


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("case", list(SAID))
def test_an_input_that_cannot_be_replayed_is_said_once(results: Path, case: str, stop: str) -> None:
    resumed = report(results, case, f"resume-{stop}")

    assert len(said(resumed)) == 1, resumed["warnings"]
    assert SAID[case] in said(resumed)[0]
    assert f"resumable: the training input {SAID[case].split(' cannot')[0]}" in said(resumed)[0]
    # nothing said while the run was new
    assert said(report(results, case, f"stop-{stop}")) == []


def test_a_plain_model_fit_resuming_a_shuffled_dataset_says_once_to_use_run_fit(tmp_path: Path) -> None:
    import keras
    import tensorflow as tf

    import resumable

    def build() -> Any:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    data = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((data, data[:, :1])).shuffle(32, seed=1).batch(8)
    url = str(tmp_path / "run")
    resumable.resume(url, build_model=build).fit(dataset, epochs=1, verbose=0)
    run = resumable.resume(url, build_model=build)
    with pytest.warns(UserWarning) as caught:
        run.model.fit(dataset, epochs=2, initial_epoch=1, verbose=0, callbacks=[run.callback])
    said = [str(w.message) for w in caught if CANNOT in str(w.message)]
    assert said == ["resumable: the training input (tf.data.Dataset) cannot be replayed exactly: model.fit "
                    "reads its shuffle from the first epoch's order in a new session: use run.fit from "
                    "resumable.resume() for the order an unbroken run has"]
