"""A keras-hub LoRA fine-tune killed with SIGKILL and resumed, on TensorFlow and on JAX.

Each session is a fresh process running tests/jobs/lora_job.py (a 2-layer Gemma causal LM with
``enable_lora(rank=4)``, built from a config with seeded random weights: nothing is downloaded),
as a Colab notebook re-run after a disconnect. The killed run saves trainable-only checkpoints;
after its resume, every weight and optimizer variable must equal those of a run never killed
(which saves full checkpoints, so their sizes can be compared too).

keras-hub is installed without its dependencies (they would pull full TensorFlow beside
tensorflow-cpu): ``pip install --no-deps -r requirements/keras-hub.txt``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from forked import job_env, run_job, start_job
from paths import JOBS

from resumable import RunStorage
from resumable.keras.replay.positioning import rest_of_epoch

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("keras_hub") is None,
        reason="keras-hub is not installed: pip install --no-deps -r requirements/keras-hub.txt"),
]

JOB = JOBS / "lora_job.py"
EPOCHS = 3
SAVE_FREQ = "4"  # 6 batches an epoch: mid-epoch saves at steps 4, 8, 16
BACKENDS = [
    "tensorflow",
    pytest.param("jax", marks=pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                                 reason="jax is not installed")),
]


def arguments(url: Path, *extra: str) -> list[str]:
    return [str(url), "--epochs", str(EPOCHS), "--save-freq", SAVE_FREQ, *extra]


def session(backend: str, url: Path, *extra: str) -> str:
    done = run_job(JOB, arguments(url, *extra), env=job_env(backend), preload=("keras_hub",))
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


def killed_session(backend: str, url: Path) -> list[str]:
    """Train until the first mid-epoch checkpoint of epoch 2 is committed, then SIGKILL."""
    job = start_job(JOB, arguments(url, "--trainable-only", "--batch-sleep", "0.3"), env=job_env(backend),
                    preload=("keras_hub",))
    lines = []
    assert job.stdout is not None
    try:
        for line in job.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("LOG resumable: saved") and "ckpt-000001-step-" in line:
                os.kill(job.pid, signal.SIGKILL)
                break
    finally:
        job.kill()  # the test failed before the kill: never leave it running
        job.wait(timeout=60)
    assert job.returncode == -signal.SIGKILL, "\n".join(lines)
    assert not any(line.startswith("DONE") for line in lines)
    return lines


def final_state(path: Path) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    return arrays, json.loads(Path(str(path) + ".json").read_text())


def checkpoint_size(url: Path) -> int:
    latest = RunStorage(str(url)).latest()
    assert latest is not None and latest.manifest is not None
    return latest.manifest.total_size


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lora_fine_tune_killed_and_resumed_from_trainable_only_checkpoints_equals_one_never_killed(
    backend: str, tmp_path: Path,
) -> None:
    session(backend, tmp_path / "straight", "--out", str(tmp_path / "straight.npz"))

    killed_session(backend, tmp_path / "run")
    resumed = session(backend, tmp_path / "run", "--trainable-only", "--out", str(tmp_path / "resumed.npz"))

    ready = next(line for line in resumed.splitlines() if line.startswith("READY"))
    assert ready == "READY initial_epoch=1 batch=2", resumed  # the mid-epoch checkpoint at step 8
    straight, names = final_state(tmp_path / "straight.npz")
    ours, _ = final_state(tmp_path / "resumed.npz")
    assert straight.keys() == ours.keys()
    assert sum(names["trainable"]) == 8 and len(names["optimizer"]) == 2 + 2 * 8  # LoRA's A and B, 4 layers
    for key, value in straight.items():
        index = int(key[1:])
        name = names["weights"][index] if key[0] == "w" else names["optimizer"][index]
        assert np.array_equal(ours[key], value), f"{name} differs after the resume"

    files = RunStorage(str(tmp_path / "run")).latest().manifest.files  # type: ignore[union-attr]
    assert "trainable.npz" in files and "model.keras" not in files
    trainable_only, full = checkpoint_size(tmp_path / "run"), checkpoint_size(tmp_path / "straight")
    # 2,048 of 67,904 weights train; with Adam's two moments each, 9% of the model's numbers
    print(f"{backend}: trainable-only checkpoint {trainable_only} bytes, full {full} bytes "
          f"({trainable_only / full:.1%})")
    assert trainable_only < 0.15 * full


def test_the_rest_of_an_epoch_of_a_keras_hub_task_is_its_samples_from_the_batch_on() -> None:
    """keras-hub's fit batches arrays and lists of prompts in order, whatever ``shuffle`` says."""
    sys.path.insert(0, str(JOBS))
    try:
        from lora_job import build_model, data
    finally:
        sys.path.remove(str(JOBS))
    model = build_model()
    x, y = data()

    rest = rest_of_epoch(model, (x, y), {"batch_size": 8, "epochs": 3, "shuffle": True}, 2, {})
    assert isinstance(rest, dict)
    assert all(np.array_equal(rest["x"][key], x[key][16:]) for key in ("token_ids", "padding_mask"))
    assert np.array_equal(rest["y"], y[16:]) and rest["batch_size"] == 8 and "shuffle" not in rest

    prompts = [f"prompt {i}" for i in range(40)]  # what a Colab fine-tune passes to GemmaCausalLM.fit
    rest = rest_of_epoch(model, (prompts,), {"epochs": 1}, 1, {})  # keras-hub's default batch: 32
    assert isinstance(rest, dict) and rest["x"] == prompts[32:] and rest["y"] is None
    assert rest_of_epoch(model, (prompts,), {"epochs": 1, "batch_size": 4}, 10, {}) == (
        "the arrays hold only 10 batches")
