"""A run started on one Keras backend continues on the other: TensorFlow (a Colab GPU runtime)
and JAX (a TPU VM), both ways, each session a process of its own (tests/jobs/backend_job.py,
forked from that backend's job server) on CPU.

Resuming on the other backend loads the same weights, optimizer state (iterations, Adam's
moments), layers' RNG states, epoch, best value and history; training goes on to the planned
epochs; one line says so. Floating point is not compared across backends: only the state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from forked import job_env, run_job
from paths import JOBS

from resumable import RunStorage

JOB = JOBS / "backend_job.py"
NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}


def session(backend: str, url: Path, epochs: int, *extra: str) -> str:
    done = run_job(JOB, [str(url), "--epochs", str(epochs), *extra],
                   env=job_env(backend, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert f"DONE epochs={epochs}" in done.stdout
    if backend == "jax":
        assert "TENSORFLOW imported=False" in done.stdout  # a TPU VM's JAX runtime has no TensorFlow
    return done.stdout + done.stderr  # resume()'s line is on stderr


def state(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    return arrays, json.loads(Path(f"{path}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [("tensorflow", "jax"), ("jax", "tensorflow")],
                         ids=["tensorflow-then-jax", "jax-then-tensorflow"])
def test_a_run_continues_on_the_other_backend(first: str, then: str, tmp_path: Path) -> None:
    url = tmp_path / "run"
    before = session(first, url, 2, "--dump", str(tmp_path / "saved.npz"))
    assert "written with" not in before
    after = session(then, url, 4, "--resumed", str(tmp_path / "resumed.npz"))

    notice = [line for line in after.splitlines() if "written with" in line]
    assert len(notice) == 1 and re.fullmatch(
        rf"resumable: resumed {re.escape(str(url))} from ckpt-000002 \(val_loss [0-9.e-]+\): training "
        rf"continues at epoch 3 \(written with {NAMES[first]}, on {NAMES[then]}: epochs and state continue "
        r"exactly, floating point does not\)", notice[0]), notice
    assert "READY initial_epoch=2" in after
    saved, saved_run = state(tmp_path / "saved.npz")
    resumed, resumed_run = state(tmp_path / "resumed.npz")
    assert sorted(resumed) == sorted(saved)
    for key, value in saved.items():  # weights, optimizer variables, seed generators: the same values
        assert np.array_equal(resumed[key], value), key
    assert resumed_run == saved_run  # epochs, best, history, iterations, optimizer variable names
    assert saved_run["epochs"] == 2 and saved_run["iterations"] == 10 and len(saved_run["optimizer"]) == 10

    infos = RunStorage(str(url)).list()
    assert [c.epoch for c in infos] == [1, 2, 3, 4]
    written = [c.manifest.state["backend"] for c in infos if c.manifest is not None]
    assert written == [first, first, then, then]  # each manifest records the backend it was written with
    last = infos[-1].manifest
    assert last is not None and then in last.versions and last.step == 20
    assert last.state["best"] == min(c.metrics["val_loss"] for c in infos)
