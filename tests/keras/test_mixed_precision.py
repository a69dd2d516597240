"""Mixed precision resumes exactly: the LossScaleOptimizer's scale and step counter, on TensorFlow and JAX.

The global dtype policy is process state, so each backend runs tests/jobs/mixed_precision_job.py
in a process of its own: every policy and checkpoint kind, a run stopped after epoch 1 and
resumed against one never stopped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "KERAS_BACKEND": backend,
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, str(JOB), str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env=env)
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
