"""What a resume holds in memory: its peak resident set, above the process' own after Keras and
resumable are imported, at most 1.3x the checkpoint (the model itself is about 1x), with and
without ``build_model``, from a local folder and from ``gs://`` (fake-gcs-server).

Each resume runs in a fresh process (tests/jobs/resume_memory_job.py) sampling its resident set
every millisecond: tracemalloc cannot see TensorFlow's, JAX's or HDF5's buffers. The checkpoint
(a 48-layer MLP with Adam, 0.6 GB) is large next to what a load costs once per process, so a
load that holds a second copy of the weights, or of the largest variables, shows.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from forked import job_env, run_job
from paths import JOBS

JOB = JOBS / "resume_memory_job.py"
LIMIT = 1.3  # peak growth of a resume, x the checkpoint's bytes

# Before each variable was assigned in place (compat.assigned_in_place): 1.53x on JAX (Keras'
# assign made the new array beside the old one, and glibc kept the freed reads), 1.30x on
# TensorFlow from gs:// (the download's pieces kept).


def job(backend: str, *argv: str) -> str:
    """The job in a process of its own: a fork of the test's job server shares its heap and
    threads, and a resume's memory is measured as a fresh notebook's (the save may be forked)."""
    env = job_env(backend, JAX_PLATFORMS="cpu")
    if argv[0] == "save":
        done = run_job(JOB, list(argv), env=env, timeout=600)
    else:
        done = subprocess.run([sys.executable, str(JOB), *argv], env=env, capture_output=True, text=True,
                              timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_resume_peaks_at_most_1_3x_the_checkpoint(backend: str, where: str, tmp_path: Path,
                                                    request: pytest.FixtureRequest) -> None:
    url = str(tmp_path / "run") if where == "local" else f"{request.getfixturevalue('gcs_bucket')}/run"
    saved = job(backend, "save", url)
    assert re.search(r"SAVED bytes=\d+", saved), saved
    ratios = {}
    for build in (True, False):
        out = job(backend, "resume", url, *(["--build"] if build else []))
        found = re.search(r"RESUMED peak_growth=(\d+) checkpoint=(\d+) initial_epoch=1", out)
        assert found, out
        growth, size = map(int, found.groups())
        assert size > 500 * 2**20  # the checkpoint dwarfs what a load costs once per process
        ratios["with build_model" if build else "without build_model"] = growth / size
    print(f"peak growth / checkpoint: {ratios}")  # shown with -rA: the margin
    assert all(ratio <= LIMIT for ratio in ratios.values()), ratios
