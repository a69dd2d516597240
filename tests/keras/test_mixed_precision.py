"""Mixed precision resumes exactly: the LossScaleOptimizer's scale and step counter, on TensorFlow and JAX.

The global dtype policy is process state, so each backend runs tests/jobs/mixed_precision_job.py
in a process of its own (forked from the backend's job server): every policy and checkpoint
kind, a run stopped after epoch 1 and resumed against one never stopped.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from forked import job_env, run_job
from paths import JOBS

pytestmark = pytest.mark.slow

JOB = JOBS / "mixed_precision_job.py"
STEPS = 18  # 3 epochs of 6 batches


@pytest.mark.parametrize("backend", [
    "tensorflow",
    pytest.param("jax", marks=pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                                 reason="jax is not installed")),
])
def test_mixed_precision_runs_resume_exactly(backend: str, tmp_path: Path) -> None:
    done = run_job(JOB, [str(tmp_path)], env=job_env(backend))
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]

    cases = {tuple(line.split()[1:3]): dict(field.split("=", 1) for field in line.split()[3:])
             for line in done.stdout.splitlines() if line.startswith("CASE ")}
    assert len(cases) == 6, done.stdout
    for (policy, kind), case in cases.items():
        assert case["differ"] == "", f"{policy}, {kind} checkpoints: {case['differ']} differ after the resume"
        if policy == "mixed_float16":
            # float16 overflowed: the LossScaleOptimizer skipped steps, halving its scale each time
            assert int(case["steps"]) < STEPS, case
        else:
            assert int(case["steps"]) == STEPS, case
