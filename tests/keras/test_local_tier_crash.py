"""The local tier (#55) under real kills: a training process (tests/jobs/train_job.py, forked from
the job server) is SIGKILLed at random steps and started again, as a crashed Colab kernel is.

- The VM kept (the local tier intact): each restart resumes from the newest checkpoint committed in
  either tier (the local one, unless the durable tier's epoch end is as new), losing the local
  interval and what trained while its newest save committed, and the run ends bitwise equal to
  plain ``model.fit``.
- A new VM (the local tier deleted before each restart): each resumes from the durable tier, and
  the run ends bitwise equal.
- A local tier that is damaged, another run's, or older than the durable newest is never used.
- A local checkpoint resumed from is promoted (uploaded as the durable tier's next checkpoint) as
  the next fit starts: a lost VM after that resumes from it.

Each on a local folder standing for Drive and on gs:// (fake-gcs-server).
"""

from __future__ import annotations

import random
import shutil
import signal
import statistics
from pathlib import Path

import numpy as np
import pytest
from forked import WatchedJob, job_env, run_job
from paths import JOBS

from resumable import RunStorage

pytestmark = pytest.mark.slow

JOB = JOBS / "train_job.py"
EPOCHS = 40  # 12 batches an epoch: 480 steps, more than the kills below reach
EVERY = 3  # the local tier's interval, in steps
STEPS_PER_EPOCH = 12


def tier_args(url: str, local: Path, out: Path, epochs: int = EPOCHS) -> list[str]:
    return [url, "--local-tier", str(local), "--local-every-steps", str(EVERY), "--print-steps",
            "--batch-sleep", "0.01", "--epochs", str(epochs), "--out", str(out)]


def steps(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("STEP ")]


def committed_step(lines: list[str]) -> int:
    """The newest step a job logged as committed, in either tier (a commit killed before its log line
    is not counted: the resume may find it)."""
    found = [0]
    for line in lines:
        if line.startswith("LOG resumable: saved "):
            name = line.rsplit("/", 1)[1]
            epoch_end = int(name.split("-")[1]) * STEPS_PER_EPOCH
            found.append(int(name.rsplit("-", 1)[1]) if "-step-" in name else epoch_end)
    return max(found)


def resumed_step(job: WatchedJob) -> int:
    return int(job.line("READY").split("step=")[1])


def tier_line(job: WatchedJob) -> str:
    """The line resume() printed on which tier it took and why."""
    found = [line for line in job.lines if "resuming from the" in line]
    return found[0] if found else ""


def kill_after(argv: list[str], tmp: Path, more_steps: int) -> WatchedJob:
    """Start the job and SIGKILL it once it has trained ``more_steps`` steps past its start."""
    job = WatchedJob(JOB, argv, job_env(), tmp / "stderr.log")
    job.wait_for("READY", 120)
    start = resumed_step(job)
    while True:
        line = job.wait_for("STEP ", 120)
        if int(line.split()[1]) >= start + more_steps:
            break
    job.kill()
    assert job.finish(30) == -signal.SIGKILL, job.output
    return job


def kill_at_local_commit(argv: list[str], tmp: Path) -> WatchedJob:
    """Start the job and SIGKILL it as soon as it logs a local checkpoint committed past where it
    resumed: the local tier is then newer than the durable one, however far behind training the
    local commit ran (on a loaded machine it lands several steps after its save began)."""
    job = WatchedJob(JOB, argv, job_env(), tmp / "stderr.log")
    job.wait_for("READY", 120)
    job.wait_for("LOG resumable: local tier: committed ", 120)
    job.kill()
    assert job.finish(30) == -signal.SIGKILL, job.output
    return job


def finish(argv: list[str], tmp: Path) -> WatchedJob:
    job = WatchedJob(JOB, argv, job_env(), tmp / "stderr.log")
    assert job.finish(300) == 0, job.output
    assert any(line.startswith("DONE") for line in job.lines), job.output
    return job


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, np.ndarray]]:
    """The user's own baseline: plain model.fit, no resumable, by number of epochs."""
    found: dict[str, dict[str, np.ndarray]] = {}

    def weights(epochs: int) -> dict[str, np.ndarray]:
        if str(epochs) not in found:
            out = tmp_path_factory.mktemp("plain") / "plain.npz"
            done = run_job(JOB, ["--plain", "--epochs", str(epochs), "--out", str(out)], env=job_env())
            assert done.returncode == 0, done.stdout + done.stderr
            with np.load(out) as data:
                found[str(epochs)] = {key: data[key] for key in data.files}
        return found[str(epochs)]

    return weights  # type: ignore[return-value]


def assert_equal_to_plain(out: Path, expected: dict[str, np.ndarray]) -> None:
    with np.load(out) as data:
        assert data.files == list(expected)
        for key in data.files:
            assert np.array_equal(data[key], expected[key]), f"weights {key} differ from plain model.fit's"


def durable_url(where: str, tmp_path: Path, request: pytest.FixtureRequest, name: str = "run") -> str:
    if where == "drive":
        return str(tmp_path / "drive" / name)  # a local folder standing for the Drive mount
    return request.getfixturevalue("gcs_bucket") + f"/runs/{name}"


@pytest.mark.parametrize("where", ["drive", "gcs"])
def test_kernel_killed_vm_kept_resumes_from_the_local_tier_losing_at_most_its_interval(
        where: str, tmp_path: Path, request: pytest.FixtureRequest, plain) -> None:
    url, local, out = durable_url(where, tmp_path, request), tmp_path / "local", tmp_path / "final.npz"
    rng = random.Random(55)
    argv = tier_args(url, local, out, epochs=8)
    lost: list[int] = []
    durable_lost: list[int] = []  # what each kill would have cost with the durable tier alone
    from_local = 0
    last = kill_after(argv, tmp_path, rng.randint(8, 30))
    for _ in range(7):
        killed_at, committed = max(steps(last.lines)), committed_step(last.lines)
        durable_lost.append(killed_at - max([c.step for c in RunStorage(url).list() if c.ok], default=0))
        job = kill_after(argv, tmp_path, rng.randint(4, 20))
        at = resumed_step(job)
        # the newest checkpoint committed in either tier, never one past the kill
        assert committed <= at <= killed_at, job.output
        lost.append(killed_at - at)
        line = tier_line(job)
        print(f"killed at {killed_at}, resumed at {at}: {line}")
        if "from the local tier" in line:
            from_local += 1
        else:  # only when the durable tier's epoch-end save was as new
            durable = [c for c in RunStorage(url).list() if c.step == at]
            assert durable and "not newer" in line, job.output
        last = job
    final = finish(argv, tmp_path)
    lost.append(max(steps(last.lines)) - resumed_step(final))
    print(f"{where}: steps lost per kill {lost} (mean {statistics.mean(lost):.1f}, max {max(lost)}; "
          f"local interval {EVERY}, durable interval {STEPS_PER_EPOCH}); {from_local} of 7 from the local "
          f"tier; the durable tier alone would have lost {durable_lost} "
          f"(mean {statistics.mean(durable_lost):.1f})")
    # Lost: the local interval and what trained while the newest local save committed (a few
    # batches on a quiet machine, more under load); the durable tier alone loses half an epoch
    # (6 steps) on average. Compared on the same kills, so a loaded machine cannot fail it.
    assert from_local >= 2, lost
    assert sum(lost[:-1]) < sum(durable_lost), (lost, durable_lost)
    assert_equal_to_plain(out, plain(8))


@pytest.mark.parametrize("where", ["drive", "gcs"])
def test_new_vm_resumes_from_the_durable_tier(where: str, tmp_path: Path, request: pytest.FixtureRequest,
                                              plain) -> None:
    url, local, out = durable_url(where, tmp_path, request), tmp_path / "local", tmp_path / "final.npz"
    rng = random.Random(56)
    argv = tier_args(url, local, out, epochs=6)
    last = kill_after(argv, tmp_path, rng.randint(14, 30))
    lost = []
    for _ in range(3):
        assert any(local.iterdir()), "the local tier saved nothing"
        shutil.rmtree(local)  # a new VM: its disk is empty
        durable = [c.step for c in RunStorage(url).list() if c.ok]  # none yet: an upload killed in flight
        job = kill_after(argv, tmp_path, rng.randint(8, 20))
        assert resumed_step(job) == (durable[-1] if durable else 0), job.output
        assert "from the durable tier: no local tier" in tier_line(job), job.output
        lost.append(max(steps(last.lines)) - resumed_step(job))
        last = job
    shutil.rmtree(local)
    finish(argv, tmp_path)
    print(f"{where}: a new VM: steps lost per kill {lost} (durable interval {STEPS_PER_EPOCH})")
    assert_equal_to_plain(out, plain(6))


def newest_durable(url: str):
    """The durable tier's newest committed checkpoint (an upload killed in flight is not one)."""
    return [c for c in RunStorage(url).list() if c.ok][-1]


def newest_local(local: Path) -> tuple[Path, int]:
    """The newest committed checkpoint of the one local run folder under ``local``: its folder, its step."""
    (run,) = [p for p in local.iterdir() if p.is_dir() and not p.name.startswith(".")]
    good = [c for c in RunStorage(str(run)).list() if c.ok]
    return (run / good[-1].name, int(good[-1].step or 0)) if good else (run, -1)


@pytest.mark.parametrize("where", ["drive", "gcs"])
def test_a_damaged_foreign_or_older_local_tier_is_never_used(
        where: str, tmp_path: Path, request: pytest.FixtureRequest, plain) -> None:
    url, local, out = durable_url(where, tmp_path, request), tmp_path / "local", tmp_path / "final.npz"
    argv = tier_args(url, local, out, epochs=6)

    # damaged: the newest local checkpoint's weights flipped; its checksum fails, the durable one is used
    kill_after(argv, tmp_path, 14)  # past the first epoch end (step 12): a durable checkpoint is committed
    for _ in range(5):  # killed as a local commit past the durable one lands; again if an epoch end won
        kill_at_local_commit(argv, tmp_path)
        if newest_local(local)[1] > max([0, *(c.step or 0 for c in RunStorage(url).list() if c.ok)]):
            break
    newest, damaged_step = newest_local(local)
    payload = newest / "model.keras"
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    durable = newest_durable(url)
    job = kill_after(argv, tmp_path, 17)
    assert resumed_step(job) == durable.step and damaged_step > (durable.step or 0), job.output
    line = tier_line(job)
    assert "from the durable tier: the local tier's newer checkpoints are damaged" in line, job.output

    # older than the durable newest: a copy of the local tier put back after the run went on
    (run_folder,) = [p for p in local.iterdir() if p.is_dir() and not p.name.startswith(".")]
    old = tmp_path / "old-local"
    shutil.copytree(run_folder, old)
    old_step = max(int(c.step or 0) for c in RunStorage(str(old)).list())
    job = kill_after(argv, tmp_path, 2 * STEPS_PER_EPOCH)
    durable = newest_durable(url)
    assert durable.step is not None and durable.step > old_step
    shutil.rmtree(run_folder)
    shutil.copytree(old, run_folder)
    job = kill_after(argv, tmp_path, 5)
    assert resumed_step(job) == durable.step, job.output
    assert "is not newer than the durable" in tier_line(job), job.output

    # another run's: a run in another folder whose local tier is further on, put where ours is looked for
    other_url = durable_url(where, tmp_path, request, "other")
    other_local = tmp_path / "other-local"
    kill_after(tier_args(other_url, other_local, tmp_path / "other.npz", epochs=6), tmp_path, 60)
    (other_run,) = [p for p in other_local.iterdir() if p.is_dir() and not p.name.startswith(".")]
    durable = newest_durable(url)
    shutil.rmtree(run_folder)
    shutil.copytree(other_run, run_folder)
    assert max(int(c.step or 0) for c in RunStorage(str(run_folder)).list()) > (durable.step or 0)
    job = kill_after(argv, tmp_path, 5)
    assert resumed_step(job) == durable.step, job.output
    assert f"records run {other_run.name}, not this run's {run_folder.name}" in tier_line(job), job.output

    shutil.rmtree(run_folder)
    finish(argv, tmp_path)
    assert_equal_to_plain(out, plain(6))


@pytest.mark.parametrize("where", ["drive", "gcs"])
def test_a_local_checkpoint_resumed_from_is_promoted_and_survives_a_lost_vm(
        where: str, tmp_path: Path, request: pytest.FixtureRequest, plain) -> None:
    url, local, out = durable_url(where, tmp_path, request), tmp_path / "local", tmp_path / "final.npz"
    argv = tier_args(url, local, out, epochs=5)
    kill_after(argv, tmp_path, 14)  # past the first epoch end (step 12): a durable checkpoint is committed
    for _ in range(5):  # until a kill leaves a local checkpoint newer than the durable one
        kill_at_local_commit(argv, tmp_path)
        job = WatchedJob(JOB, argv, job_env(), tmp_path / "stderr.log")
        job.wait_for("READY", 120)
        if "from the local tier" in tier_line(job):
            break
        job.kill()
        job.finish(30)
    else:
        pytest.fail("no kill left a local checkpoint newer than the durable one")
    name = job.wait_for("RESUMED", 60).split()[1]
    step = resumed_step(job)
    job.wait_for(f"LOG resumable: saved {url}/{name}", 120)  # uploaded in the background as training goes on
    assert f"LOG resumable: promoting {name} from the local tier to {url}" in job.lines
    job.kill()
    job.finish(30)
    promoted = RunStorage(url).get(name)
    assert promoted.ok and promoted.step == step
    assert promoted.manifest is not None and promoted.manifest.batch > 0

    shutil.rmtree(local)  # a new VM: the promoted checkpoint is what is left of the crash's state
    job = kill_after(argv, tmp_path, 2)
    assert resumed_step(job) >= step, job.output
    shutil.rmtree(local)
    finish(argv, tmp_path)
    assert_equal_to_plain(out, plain(5))
