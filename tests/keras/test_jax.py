"""Keras 3 on JAX: resume, SIGKILL, keras.distribution and several jax.distributed processes.

The backend is chosen when Keras is imported and this process runs Keras on TensorFlow, so
every scenario runs tests/jobs/jax_job.py in processes of its own (KERAS_BACKEND=jax), as a
Colab TPU notebook re-run after a disconnect, each forked from the JAX job server: one that
sees other devices sets XLA_FLAGS, and the processes of one program start jax.distributed,
before JAX's backend exists in it.
Every job also reports whether anything imported TensorFlow: resumable must not, since Colab's
TPU runtimes have none (the JAX job server never imports it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest
from forked import WatchedJob, job_env, run_job
from keras_helpers import assert_equal_weights, saved_weights
from paths import JOBS

import resumable
from resumable import RunStorage
from resumable.core.errors import CorruptCheckpointError
from resumable.core.manifest import FileEntry, Manifest
from resumable.manager.run_manager import default_staging_dir

# Every test that runs a job: it trains, and needs jax (in the test extra).
jax_job = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")

JOB = JOBS / "jax_job.py"
STEPS_PER_EPOCH = 12  # 384 training samples, global batch 32


def session(url: str | Path, epochs: int, *extra: str) -> str:
    """One training session in a process of its own; returns its stdout after checking it went well."""
    done = run_job(JOB, [str(url), "--epochs", str(epochs), *extra], env=job_env("jax"))
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert_no_tensorflow(done.stdout)
    return done.stdout


def assert_no_tensorflow(stdout: str) -> None:
    assert "TENSORFLOW imported=False" in stdout.splitlines(), stdout


def assert_same_saved_weights(a: Path, b: Path) -> None:
    assert_equal_weights(saved_weights(a), saved_weights(b))


def line(stdout: str, prefix: str) -> str:
    return next(text for text in stdout.splitlines() if text.startswith(prefix))


# ----------------------------------------------------------------------------- in this process


def test_manifest_records_processes_and_devices_and_reads_older_manifests() -> None:
    written = Manifest(epoch=3, step=36, processes=2, devices=8, files={"a.bin": FileEntry(1, "00000000")})
    data = json.loads(written.to_json())
    assert (data["processes"], data["devices"]) == (2, 8)
    again = Manifest.from_json(written.to_json(), "here")
    assert (again.processes, again.devices) == (2, 8)
    # Written before the fields existed (or by a writer that does not know them): still format 1.
    del data["processes"], data["devices"]
    older = Manifest.from_dict(data, "older")
    assert (older.processes, older.devices, older.format_version) == (None, None, 1)
    assert "processes" not in json.loads(older.to_json())


@pytest.mark.parametrize("value", [0, -1, "2", 1.5, True])
def test_manifest_with_a_bad_device_count_is_corrupt(value: object) -> None:
    data = json.loads(Manifest(epoch=1, devices=2).to_json())
    data["devices"] = value
    with pytest.raises(CorruptCheckpointError, match="devices|positive integer"):
        Manifest.from_dict(data, "ckpt-000001")


def test_resume_refuses_a_strategy_and_a_distribution_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Invalid value for argument `strategy`.*Expected one of them"):
        resumable.resume(str(tmp_path / "run"), strategy=object(), distribution=_FakeDistribution())
    assert not (tmp_path / "run").exists()


def test_resume_refuses_what_is_not_a_keras_distribution(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Invalid value for argument `distribution`.*keras.distribution"):
        resumable.resume(str(tmp_path / "run"), distribution="DataParallel")


class _FakeDistribution:
    """Looks like a keras.distribution.Distribution to resume()'s argument check."""

    def get_variable_layout(self, variable: object) -> None:
        return None

    def scope(self) -> object:
        raise AssertionError("resume() must refuse before using the distribution")


# ----------------------------------------------------------------------------- one process


EPOCHS = 10
# model.fit shuffles (NumPy's RNG), Dropout draws (its SeedGenerator), saves also every 5 batches.
TRAINING = ["--shuffle", "--dropout", "--save-freq", "5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the final weights of the job never interrupted."""
    folder = tmp_path_factory.mktemp("jax-uninterrupted")
    session(folder / "run", EPOCHS, *TRAINING, "--out", str(folder / "final.npz"))
    return folder / "final.npz"


@pytest.mark.slow
@jax_job
@pytest.mark.parametrize("extra", [[], ["--weights-only"]], ids=["keras-file", "weights-only"])
def test_interrupted_equals_uninterrupted_on_jax(tmp_path: Path, extra: list[str],
                                                 uninterrupted: Path) -> None:
    first = session(tmp_path / "run", 3, *TRAINING, *extra)
    second = session(tmp_path / "run", EPOCHS, *TRAINING, *extra, "--out", str(tmp_path / "resumed.npz"))

    assert line(first, "READY") == "READY initial_epoch=0 step=0"
    assert line(second, "READY") == f"READY initial_epoch=3 step={3 * STEPS_PER_EPOCH}"
    lines = second.splitlines()
    assert "LOG resumable: saving ckpt-000004" in lines and "LOG resumable: saving ckpt-000003" not in lines
    assert_same_saved_weights(tmp_path / "resumed.npz", uninterrupted)
    latest = RunStorage(str(tmp_path / "run")).latest()
    assert latest is not None and latest.manifest is not None
    assert "jax" in latest.manifest.versions and "tensorflow" not in latest.manifest.versions
    assert (latest.manifest.processes, latest.manifest.devices) == (1, 1)


@pytest.mark.slow
@jax_job
def test_data_parallel_over_two_host_devices_save_resume_and_across(tmp_path: Path) -> None:
    url = tmp_path / "run"
    two = ("--host-devices", "2")
    # saved under DataParallel over two forced CPU devices, given to resume()
    first = session(url, 2, *two, "--distribution", "arg", "--out", str(tmp_path / "w2.npz"))
    assert "LAYOUT devices=2" in first and "saving ckpt-000002" in first
    # resumed under it, set globally this time: exact weights, laid out over both devices again
    second = session(url, 3, *two, "--distribution", "global", "--restored-out", str(tmp_path / "r2.npz"),
                     "--out", str(tmp_path / "w3.npz"))
    assert line(second, "READY") == f"READY initial_epoch=2 step={2 * STEPS_PER_EPOCH}"
    assert "LAYOUT devices=2" in second
    assert_same_saved_weights(tmp_path / "r2.npz", tmp_path / "w2.npz")
    manifest = RunStorage(str(url)).latest().manifest  # type: ignore[union-attr]
    assert manifest is not None and (manifest.processes, manifest.devices) == (1, 2)
    # across: two devices to one, without a distribution
    third = session(url, 4, "--restored-out", str(tmp_path / "r3.npz"))
    assert line(third, "READY") == f"READY initial_epoch=3 step={3 * STEPS_PER_EPOCH}"
    assert "LAYOUT devices=1" in third
    assert_same_saved_weights(tmp_path / "r3.npz", tmp_path / "w3.npz")
    latest = RunStorage(str(url)).latest()
    assert latest is not None and latest.manifest is not None
    assert (latest.epoch, latest.manifest.devices) == (4, 1)


# ----------------------------------------------------------------------------- SIGKILL

SLOW_BATCHES = ["--batch-sleep", "0.1"]  # time to kill between saves; no effect on the weights
KILLS = int(os.environ.get("RESUMABLE_TEST_JAX_KILLS", "3"))


def killed_attempt(url: str, log: Path, rng: random.Random) -> WatchedJob:
    """Start the job and SIGKILL it while training or just inside a save."""
    job = WatchedJob(JOB, [url, "--epochs", str(EPOCHS), *TRAINING, *SLOW_BATCHES], job_env("jax"), log)
    job.wait_for("READY", timeout=120)
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0.5, 4.0))  # the first epoch also compiles the train step
    else:
        for _ in range(rng.randint(1, 4)):
            job.wait_for("LOG resumable: saving", timeout=120)
        time.sleep(rng.uniform(0, 0.03))
    job.kill()
    code = job.finish()
    output = "\n".join(job.lines)
    assert code == -signal.SIGKILL, f"the job ended by itself ({code}); raise EPOCHS\n{output}"
    return job


@pytest.mark.slow
@jax_job
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_sigkill_then_resume_equals_uninterrupted_on_jax(where: str, tmp_path: Path, uninterrupted: Path,
                                                         request: pytest.FixtureRequest) -> None:
    url = str(tmp_path / "run") if where == "local" else request.getfixturevalue("gcs_bucket") + "/runs/jax"
    rng = random.Random(99 if where == "local" else 17)

    attempts = [killed_attempt(url, tmp_path / "stderr.log", rng) for _ in range(KILLS)]
    final = session(url, EPOCHS, *TRAINING, "--out", str(tmp_path / "resumed.npz"))

    resumed_at = [line("\n".join(a.lines), "READY") for a in attempts[1:]] + [line(final, "READY")]
    print("\n".join(resumed_at))
    assert any(not text.endswith("step=0") for text in resumed_at), resumed_at
    assert_same_saved_weights(tmp_path / "resumed.npz", uninterrupted)
    checkpoints = RunStorage(url).list()
    assert checkpoints[-1].epoch == EPOCHS
    assert all(c.ok for c in checkpoints), [(c.name, c.status, c.problem) for c in checkpoints]


# ----------------------------------------------------------------------------- several processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def program(url: str | Path, epochs: int, tmp_path: Path, tag: str, *extra: str) -> list[WatchedJob]:
    """Two processes of one JAX program, coordinated on 127.0.0.1."""
    coordinator = f"127.0.0.1:{free_port()}"
    return [
        WatchedJob(JOB, [str(url), "--epochs", str(epochs), "--processes", "2", "--process-id", str(i),
                         "--coordinator", coordinator, "--out", str(tmp_path / f"{tag}-p{i}.npz"), *extra],
                   job_env("jax"), tmp_path / f"{tag}-p{i}.log")
        for i in range(2)
    ]


def finish_program(jobs: list[WatchedJob], tmp_path: Path, tag: str) -> list[str]:
    outputs = []
    for i, job in enumerate(jobs):
        code = job.finish()
        stdout = "\n".join(job.lines)
        stderr = (tmp_path / f"{tag}-p{i}.log").read_text()[-3000:]
        assert code == 0, f"process {i} failed ({code}):\n{stdout}\n{stderr}"
        assert_no_tensorflow(stdout)
        outputs.append(stdout)
    return outputs


@pytest.mark.slow
@jax_job
def test_two_jax_processes_only_process_0_writes_and_both_resume_alike(tmp_path: Path) -> None:
    url = tmp_path / "run"
    straight = finish_program(program(tmp_path / "straight", 4, tmp_path, "straight"), tmp_path, "straight")
    assert all("READY initial_epoch=0 step=0" in out for out in straight)
    assert_same_saved_weights(tmp_path / "straight-p0.npz", tmp_path / "straight-p1.npz")

    # A first session, killed (both processes, SIGKILL) once process 0 has committed epoch 2.
    first = program(url, 4, tmp_path, "first", "--batch-sleep", "0.1")
    first[0].wait_for(f"LOG resumable: saved {url}/ckpt-000002", timeout=240)
    for job in first:
        job.kill()
    for job in first:
        job.finish()
    # Process 1 neither saved nor took the writer lease; process 0 did both.
    assert not [t for t in first[1].lines if "resumable: sav" in t or "lease" in t], "\n".join(first[1].lines)
    assert any("lease" in t for t in first[0].lines), "\n".join(first[0].lines)
    saved_by_0 = {t.split()[-1] for t in first[0].lines if t.startswith("LOG resumable: saving")}
    assert {p.name for p in url.iterdir() if p.is_dir()} <= saved_by_0

    # Both restart: the same checkpoint, epoch and step, the same weights as each other and as
    # a program never killed.
    second = finish_program(program(url, 4, tmp_path, "second"), tmp_path, "second")
    ready = [line(out, "READY") for out in second]
    assert ready[0] == ready[1] and not ready[0].endswith("step=0"), ready
    assert line(second[0], "RESUMED") == line(second[1], "RESUMED")
    assert not [t for t in second[1].split("\n") if "resumable: sav" in t or "lease" in t], second[1]
    assert_same_saved_weights(tmp_path / "second-p0.npz", tmp_path / "second-p1.npz")
    assert_same_saved_weights(tmp_path / "second-p0.npz", tmp_path / "straight-p0.npz")
    latest = RunStorage(str(url)).latest()
    assert latest is not None and latest.manifest is not None and latest.epoch == 4
    assert (latest.manifest.processes, latest.manifest.devices) == (2, 2)
    assert json.loads((url / latest.name / "manifest.json").read_text())["devices"] == 2
    # A local run folder: both processes loaded the checkpoint where it is, checked in place,
    # and neither copied it into a cache (process 1's, when it downloads, is its own: "-p1").
    resumed = line(second[1], "RESUMED").split()[1]
    staging = default_staging_dir(RunStorage(str(url)).url)
    for cache in (staging / "cache", Path(f"{staging}-p1") / "cache"):
        assert not (cache / resumed).exists()
