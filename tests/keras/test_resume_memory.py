"""What a resume holds in memory: its peak resident set, above the process' own after Keras and
resumable are imported, at most 1.3x the checkpoint (the model itself is about 1x), with and
without ``build_model``, from ``gs://`` (fake-gcs-server) and from a local folder.

Each resume runs in a fresh process (tests/jobs/resume_memory_job.py) sampling its resident set
every millisecond: tracemalloc cannot see TensorFlow's, JAX's or HDF5's buffers. The checkpoint
(a 48-layer MLP with Adam, 0.6 GB) is large next to what a load costs once per process, so a
load that holds a second copy of the weights, or of the largest variables, shows. A model whose
one big kernel is a third of its checkpoint resumes at about the model's size: no value is read
beside it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from forked import job_env, run_job
from paths import JOBS

JOB = JOBS / "resume_memory_job.py"
LIMIT = 1.3  # peak growth of a resume, x the checkpoint's bytes
WIDE_LIMIT = 1.1  # the same, where one variable is a third of the checkpoint

# Before each variable was assigned in place (compat.assigned_in_place): 1.53x on JAX (Keras'
# assign made the new array beside the old one, and glibc kept the freed reads), 1.30x on
# TensorFlow from gs:// (the download's pieces kept).


def job(backend: str, *argv: str) -> str:
    """The job in a process of its own: a fork of the test's job server shares its heap and
    threads, and a resume's memory is measured as a fresh notebook's (the save may be forked).
    A resume runs as on a new VM: a temporary folder of its own, so no copy downloaded before
    (`RunReader`'s cache) stands in for the download."""
    env = job_env(backend, JAX_PLATFORMS="cpu")
    if argv[0] == "save":
        done = run_job(JOB, list(argv), env=env, timeout=600)
    else:
        with tempfile.TemporaryDirectory() as fresh:
            done = subprocess.run([sys.executable, str(JOB), *argv], env={**env, "TMPDIR": fresh},
                                  capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


def save(backend: str, url: str, *model: str) -> None:
    saved = job(backend, "save", url, *model)
    assert re.search(r"SAVED bytes=\d+", saved), saved


def growth(backend: str, url: str, build: bool, *model: str) -> float:
    """One resume's peak growth over the checkpoint's size."""
    out = job(backend, "resume", url, *(["--build"] if build else []), *model)
    found = re.search(r"RESUMED peak_growth=(\d+) checkpoint=(\d+) initial_epoch=1", out)
    assert found, out
    grown, size = map(int, found.groups())
    assert size > 500 * 2**20  # the checkpoint dwarfs what a load costs once per process
    return grown / size


def peak_ratios(backend: str, url: str, *model: str, limits: dict[str, float]) -> dict[str, float]:
    """Resume the checkpoint at ``url`` with and without ``build_model``: each resume's peak
    growth over the checkpoint's size. ``limits``: each way's, by the same names.

    A peak is timing: this checkpoint's resume on TensorFlow peaked at 1.07 to 1.27x in two dozen
    tries (from gs:// and from the copy a download left, on a quiet machine and beside two busy
    CPUs) and once at 1.33x in a whole suite; on JAX with build_model at 1.27 to 1.30x (building
    the model alone: 1.21 to 1.23x). One over its limit is measured once more in a new process and
    the lower counts: a second copy of the weights, or of the largest variables, is there both times.
    """
    ratios = {}
    for build, way in ((True, "with build_model"), (False, "without build_model")):
        tries = [growth(backend, url, build, *model)]
        if tries[0] > limits[way]:
            tries.append(growth(backend, url, build, *model))
            print(f"{way}, measured twice: {tries}")
        ratios[way] = min(tries)
    print(f"peak growth / checkpoint: {ratios}")  # shown with -rA: the margin
    return ratios


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_resume_from_gcs_peaks_at_most_1_3x_the_checkpoint(backend: str, gcs_bucket: str) -> None:
    """From ``gs://``: the download, then the load a local folder gets (`RunReader.fetch` hands
    both a local folder). A local folder alone is the wide model's test below, at a lower limit."""
    url = f"{gcs_bucket}/run"
    save(backend, url)
    ratios = peak_ratios(backend, url, limits={"with build_model": LIMIT, "without build_model": LIMIT})
    assert all(ratio <= LIMIT for ratio in ratios.values()), ratios


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_variable_a_third_of_the_checkpoint_is_never_held_beside_the_model(backend: str,
                                                                            tmp_path: Path) -> None:
    """Its 256 MiB kernel and Adam slots are read straight into their variables' buffers
    (TensorFlow), or once the variable's old array is let go (JAX; `in_place_reads.UnreadValue`), and on
    JAX a model built from the checkpoint's config draws no initial values (`deferred_init`).
    Before: 1.34x on TensorFlow, 1.45x on JAX, the biggest value beside the model and JAX's
    initializer's temporaries. With ``build_model`` the peak is that function's own: a resume
    adds nothing to it (on JAX, building this model alone peaks at about 1.43x)."""
    url = str(tmp_path / "run")
    save(backend, url, "--wide")
    built = re.search(r"BUILT peak_growth=(\d+) checkpoint=(\d+)", job(backend, "build", url, "--wide"))
    assert built, "no BUILT line"
    build_alone = int(built[1]) / int(built[2])
    print(f"building the model alone: {build_alone:.2f}x")
    limits = {"with build_model": max(WIDE_LIMIT, build_alone + 0.05), "without build_model": WIDE_LIMIT}
    ratios = peak_ratios(backend, url, "--wide", limits=limits)
    assert ratios["without build_model"] <= limits["without build_model"], ratios
    assert ratios["with build_model"] <= limits["with build_model"], (ratios, build_alone)
