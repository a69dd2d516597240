"""A save within its memory budget (#54), in a real memory cgroup: a VM with a quarter of the
checkpoint to spare beyond what plain training takes.

Each job (tests/jobs/memory_budget_job.py, forked from a server that imported Keras) moves itself
into a cgroup of its own first. The plain ``model.fit``'s peak is measured in one without a
limit (the cgroup's own peak: what the kernel counts against a limit); every other job runs
with the limit at that peak + 0.25x the checkpoint (weights and Adam's moments, 0.28 GB). A
save copied whole to host memory is killed there (the control: the test can fail); with the
default ``snapshot_memory="auto"``, resume() + run.fit (weights-only and ``.keras``) and
``resumable.ModelCheckpoint`` finish, and a run killed mid-way resumes to the same bits as
the plain fit, and a budget the user set (0.15x) copies part of each save and finishes. On
TensorFlow and JAX (each job a process of its own; torch is not installed here). Runs as root
where a memory cgroup can be made (v1 or v2); skipped otherwise.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from forked import job_env, run_job
from paths import JOBS

JOB = JOBS / "memory_budget_job.py"
V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")
_names = itertools.count()


class MemoryCgroup:
    """A memory cgroup of this test's, v1 or v2: a limit, the peak of what was charged to it."""

    def __init__(self, limit: int | None) -> None:
        name = f"resumable-test-{os.getpid()}-{next(_names)}"
        self.v1 = V1.is_dir()
        self.path = (V1 if self.v1 else V2) / name
        self.path.mkdir()
        if limit is not None:
            if self.v1:
                (self.path / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):  # swap accounting, where the kernel has it
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit))
            else:
                (self.path / "memory.max").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (self.path / "memory.swap.max").write_text("0")

    def peak(self) -> int:
        return int((self.path / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak")).read_text())

    def oom_kills(self) -> int | None:
        """How many of its processes the kernel killed for want of memory (None: not reported)."""
        events = _read(self.path / ("memory.oom_control" if self.v1 else "memory.events"))
        found = re.search(r"^oom_kill (\d+)$", events, re.M)
        return int(found.group(1)) if found else None

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def cgroups_unavailable() -> str | None:
    """Why no memory cgroup can be made here, or None."""
    if os.geteuid() != 0:
        return "memory cgroups need root"
    if not (V1.is_dir() or "memory" in _read(V2 / "cgroup.controllers").split()):
        return "no memory cgroup controller mounted"
    try:
        probe = MemoryCgroup(2**30)
    except OSError as e:
        return f"a memory cgroup cannot be made here ({e})"
    try:
        probe.peak()
    except OSError:
        return "this kernel's cgroup reports no peak (memory.peak)"
    finally:
        probe.remove()
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def cgroup(limit: int | None) -> Iterator[MemoryCgroup]:
    made = MemoryCgroup(limit)
    try:
        yield made
    finally:
        made.remove()


def job(group: MemoryCgroup, *argv: str, backend: str = "tensorflow") -> tuple[int, str]:
    done = run_job(JOB, [*argv, "--cgroup", str(group.path)], env=job_env(backend, JAX_PLATFORMS="cpu"),
                   cwd=JOBS, timeout=300)
    return done.returncode, done.stdout + done.stderr[-3000:]


def digest(out: str) -> str:
    found = re.search(r"DIGEST (\w+)", out)
    assert found, out
    return found.group(1)


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_saves_fit_where_plain_training_has_a_quarter_checkpoint_to_spare(tmp_path: Path,
                                                                           backend: str) -> None:
    why = cgroups_unavailable()
    if why is not None:
        pytest.skip(why)
    with cgroup(None) as plain:
        code, out = job(plain, "plain", str(tmp_path / "plain"), backend=backend)
        assert code == 0, out
        plain_peak = plain.peak()
    found = re.search(r"CHECKPOINT bytes=(\d+)", out)
    assert found, out
    limit = plain_peak + int(found.group(1)) // 4
    expected = digest(out)

    def limited(*argv: str) -> tuple[int, str]:
        with cgroup(limit) as group:
            code, out = job(group, *argv, backend=backend)
            if code == -9 and group.oom_kills():  # the kernel's kill, not the job's own SIGKILL
                out += "\nOOM: the kernel killed the job for want of memory"
            return code, out

    # The control: a save copied whole (a budget of 4 GB) does not fit.
    code, out = limited("resume", str(tmp_path / "copied"), "--weights-only",
                        "--snapshot-memory", str(4 * 2**30))
    assert code == -9, f"a whole copy fit in the limit: the limit tests nothing\n{out}"

    run = str(tmp_path / "weights")
    code, out = limited("resume", run, "--weights-only", "--kill-at-epoch", "2")
    assert code == -9 and "DIGEST" not in out and "OOM:" not in out, out
    assert any(Path(run).glob("ckpt-*/manifest.json")), f"no checkpoint committed before the kill\n{out}"
    code, out = limited("resume", run, "--weights-only")
    assert code == 0, out
    assert digest(out) == expected  # killed, resumed: the bits of an unbroken model.fit

    code, out = limited("resume", str(tmp_path / "keras"))
    assert code == 0, out
    assert digest(out) == expected

    # A budget the user set copies what fits: 0.15x here, written in the background
    code, out = limited("resume", str(tmp_path / "part"), "--snapshot-memory",
                        str(int(found.group(1)) * 15 // 100))
    assert code == 0, out
    assert digest(out) == expected

    code, out = limited("dropin", str(tmp_path / "dropin"))
    assert code == 0, out
    assert (tmp_path / "dropin" / "model.weights.h5").is_file()
