"""Two writers on a Drive folder whose writes reach the other machine late (`drive_visibility`).

Each writer is a real process (tests/jobs/drive_writer_job.py) with its own host name, writing
its own machine's view of the folder. The lease's timeout is 2 s (renewed every 0.5 s) and the
views sync 0.4 s or 1.2 s late: within the timeout less one renewal interval, the delay the
lease tolerates (docs/reliability.md). What must hold: a live writer is never taken over; a dead
one is, by the next session, which continues after its last commit; after the views settle,
every checkpoint is intact, committed by exactly one writer, and none is lost.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from drive_visibility import DelayedDrive
from paths import JOBS

from resumable import RunStorage

JOB = JOBS / "drive_writer_job.py"
TIMEOUT = "2.0"  # the writers' lease_timeout: renewed every 0.5 s


class Writer:
    """drive_writer_job.py in a process; its marker lines as they come."""

    def __init__(self, view: Path, host: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(JOB), str(view), "--host", host, "--lease-timeout",
                                      TIMEOUT, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put("EOF")

    def expect(self, prefix: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            self.lines.append(line)
            if line.startswith(prefix):
                return line
            if line == "EOF":
                break
        raise AssertionError(f"no {prefix!r} line; got {self.lines}")

    def committed(self) -> list[str]:
        return [line.split()[1] for line in self.lines if line.startswith("COMMITTED ")]

    def exit_code(self) -> int:
        return self.proc.wait(timeout=60)


def writers_of(view: Path) -> dict[str, str]:
    """Each checkpoint in ``view`` with the host that wrote its model file; every one intact."""
    storage = RunStorage(str(view))
    infos = storage.list()
    assert all(info.ok for info in infos), [(i.name, i.problem) for i in infos]
    assert all(storage.verify(info) == [] for info in infos)
    found = {}
    for info in infos:
        data = (view / info.name / "model.keras").read_bytes().rstrip(b"\0").decode()
        host, _, epoch = data.split()
        manifest = json.loads((view / info.name / "manifest.json").read_text())
        assert int(epoch) == info.epoch == manifest["epoch"]
        found[info.name] = host
    return found


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.4, 1.2])
def test_a_live_writer_is_never_taken_over_by_a_machine_that_sees_it_late(tmp_path: Path,
                                                                         delay: float) -> None:
    with DelayedDrive(tmp_path, delay) as drive:
        live = Writer(drive.a, "vm-a", "--commits", "12", "--every", "0.4")
        live.expect("COMMITTED ckpt-000002")
        time.sleep(delay)  # the lease has reached machine b
        late = Writer(drive.b, "vm-b", "--commits", "3")
        assert "host 'vm-a'" in late.expect("LEASE_HELD")
        assert late.exit_code() == 3
        live.expect("DONE")
        assert live.exit_code() == 0
        drive.settle()
    assert writers_of(drive.a) == writers_of(drive.b) == {name: "vm-a" for name in live.committed()}
    assert len(live.committed()) == 12


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.4, 1.2])
def test_a_dead_writer_is_taken_over_and_the_run_continues_after_its_last_commit(
        tmp_path: Path, delay: float) -> None:
    with DelayedDrive(tmp_path, delay) as drive:
        dead = Writer(drive.a, "vm-a", "--commits", "100", "--every", "0.3")
        dead.expect("COMMITTED ckpt-000003")
        time.sleep(delay + 0.2)  # it has run a while: machine b has seen its lease (commits go on)
        dead.proc.send_signal(signal.SIGKILL)  # the VM goes away: no release, no last renewal
        dead.proc.wait()
        # What it committed: every manifest on its own machine; the last ones still on their way to b.
        by_a = sorted(p.parent.name for p in drive.a.glob("ckpt-*/manifest.json"))
        started = time.monotonic()
        after = Writer(drive.b, "vm-b", "--commits", "3")
        held = after.expect("HELD")
        took = time.monotonic() - started
        after.expect("DONE")
        assert after.exit_code() == 0
        drive.settle()
    assert len(by_a) >= 3
    assert held == f"HELD after={int(by_a[-1][-6:])}"  # continued after the dead writer's last commit
    assert float(TIMEOUT) <= took < float(TIMEOUT) + delay + 5  # one lease timeout, as for a recycled VM
    expected = {name: "vm-a" for name in by_a} | {name: "vm-b" for name in after.committed()}
    assert writers_of(drive.a) == writers_of(drive.b) == expected  # nothing lost, none written twice
