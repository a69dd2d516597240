"""SIGKILL a training process at random moments, some inside saves; every restart must succeed.

The job server (tests/forked.py) imports TensorFlow once and forks one training process
(tests/jobs/train_job.py) per attempt; the test kills that process with SIGKILL, as a Colab
runtime dies, and starts another until one finishes. The final weights must equal those of a
run never killed, in a fresh Python process.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from forked import ForkedJob, start_job
from paths import JOBS

from resumable import RunStorage

pytestmark = pytest.mark.slow

JOB = JOBS / "train_job.py"
# A killed attempt trains at most TRAINED_AT_MOST epochs past its start (4 with the save it may be
# killed in), however fast this machine is: 20 kills can never finish the run. (A time-bound alone let
# 17 kills reach epoch 80 on gs:// once saves got faster, 2026-11-29.)
EPOCHS = 100
TRAINED_AT_MOST = 3
KILLS = int(os.environ.get("RESUMABLE_TEST_KILLS", "20"))


@dataclass
class Attempt:
    """What one training process printed before it ended."""

    job: ForkedJob
    lines: list[str] = field(default_factory=list)
    status: int | None = None

    @property
    def inside_save(self) -> bool:
        saving = [i for i, line in enumerate(self.lines) if "resumable: saving" in line]
        saved = [i for i, line in enumerate(self.lines) if "resumable: saved" in line]
        return bool(saving) and (not saved or saving[-1] > saved[-1])

    @property
    def failed(self) -> bool:
        return self.status not in (0, -signal.SIGKILL)

    def output(self) -> str:
        return "\n".join(self.lines) + "\n" + self.job.stderr_text()[-3000:]

    def finish(self, timeout: float) -> None:
        """Read the rest of its output; its return code once it ended."""
        while (line := self.job.next_line(timeout)) is not None:
            self.lines.append(line)
        self.status = self.job.wait(timeout=30)


def run_attempt(argv: list[str], rng: random.Random) -> Attempt:
    """Start a job and SIGKILL it at a random moment: while starting, while training or inside a save."""
    attempt = Attempt(start_job(JOB, argv))
    mode = rng.choices(["starting", "training", "saving"], weights=[2, 4, 4])[0]
    saves = 0
    wanted_saves = rng.randint(1, 4)
    deadline = time.monotonic() + (rng.uniform(0, 1.0) if mode == "starting" else 60)
    while True:
        line = attempt.job.next_line(deadline - time.monotonic())
        if line is None:
            if attempt.job.output_ended:
                attempt.finish(30)
                return attempt  # it ended by itself
            break  # the moment to kill has come
        attempt.lines.append(line)
        if line.startswith("READY") and mode == "training":
            # the first epoch includes tracing the train step (about a second here)
            deadline = time.monotonic() + rng.uniform(0, 3.0)
        if "resumable: saving" in line and mode == "training":
            saves += 1
            if saves == TRAINED_AT_MOST:  # a fast machine: kill soon after this save starts
                deadline = min(deadline, time.monotonic() + 0.1)
        if "resumable: saving" in line and mode == "saving":
            saves += 1
            if saves == wanted_saves:
                # a save takes a few hundredths of a second locally, more on GCS: land inside it
                time.sleep(rng.uniform(0, 0.05))
                break
    os.kill(attempt.job.pid, signal.SIGKILL)
    attempt.finish(30)
    return attempt


def train_until_done(job: list[str], out: Path, seed: int, kills: int) -> tuple[list[Attempt], Attempt]:
    rng = random.Random(seed)
    argv = [*job, "--epochs", str(EPOCHS), "--out", str(out)]
    killed: list[Attempt] = []
    while len(killed) < kills:
        attempt = run_attempt(argv, rng)
        assert not attempt.failed, f"restart {len(killed) + 1} failed ({attempt.status}):\n{attempt.output()}"
        if attempt.status == 0:
            pytest.fail(f"the run finished after only {len(killed)} kills; raise EPOCHS\n{attempt.output()}")
        killed.append(attempt)
    final = Attempt(start_job(JOB, argv))
    final.finish(300)
    return killed, final


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The reference: the same job in a fresh Python process, never killed, checked equal to plain
    model.fit in another."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    out = folder / "final.npz"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, str(JOB), str(folder / "run"), "--epochs", str(EPOCHS), "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(out) as data:
        weights = {key: data[key] for key in data.files}
    # ... which is what the user's own model.fit gives: a killed run ends as plain Keras would have
    plain = folder / "plain.npz"
    done = subprocess.run([sys.executable, str(JOB), "--plain", "--epochs", str(EPOCHS), "--out", str(plain)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(plain) as data:
        assert data.files == list(weights)
        for key in data.files:
            assert np.array_equal(data[key], weights[key]), f"run.fit's weights {key} differ from model.fit's"
    return weights


# Shards of 2 KiB: the model's weights and Adam's state in several shards (each variable in one).
SHARDED = ["--max-shard-size", "2e-6"]


@pytest.mark.parametrize(("where", "options", "kills"), [
    ("local", [], KILLS), ("gcs", [], KILLS), ("gcs", SHARDED, KILLS // 2),
], ids=["local", "gcs", "gcs-sharded"])
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(
    where: str, options: list[str], kills: int, uninterrupted: dict[str, np.ndarray],
    tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    url = str(tmp_path / "run") if where == "local" else request.getfixturevalue("gcs_bucket") + "/runs/crash"
    url += "-sharded" if options else ""
    out = tmp_path / "final.npz"

    seed = 1234 if where == "local" else 4321
    killed, final = train_until_done([url, *options], out, seed=seed, kills=kills)

    output = final.output()
    assert final.status == 0 and any(line.startswith("DONE") for line in final.lines), output
    assert len(killed) >= kills
    resumed_at = [
        int(line.split("=")[1].split()[0]) for a in killed for line in a.lines if line.startswith("READY")
    ]
    assert max(resumed_at) > 0, "no restart ever found a checkpoint"
    inside_saves = sum(a.inside_save for a in killed)
    print(f"{len(killed)} kills, {inside_saves} inside a save, resumed at epochs {resumed_at}")
    assert inside_saves >= max(1, kills // 7), "too few kills landed inside a save"
    with np.load(out) as data:
        final_weights = {key: data[key] for key in data.files}
    assert final_weights.keys() == uninterrupted.keys()
    for key in uninterrupted:
        assert np.array_equal(final_weights[key], uninterrupted[key]), f"weights {key} differ"
    checkpoints = RunStorage(url).list()
    assert all(c.ok for c in checkpoints), [(c.name, c.status, c.problem) for c in checkpoints]
    assert checkpoints[-1].epoch == EPOCHS
    last = checkpoints[-1].manifest
    if options:
        assert last is not None and last.payload == "model.weights.json"
        assert len([f for f in last.files if f.endswith(".weights.h5")]) > 2
