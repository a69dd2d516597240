"""train_job.py on a local folder standing for Drive, its OS calls into the run failing on purpose.

    RESUMABLE_FOLDER_FAULT='{"step": "fsync ckpt-N/manifest.json", "nth": 1, "errno": 28,
                             "kill": "right-after", "log": "/tmp/steps.json"}' \\
        python tests/jobs/faulty_folder_job.py RUN_DIR [train_job.py's arguments]

The calls go through tests/local_faults.py's patches (fsync, replace, link, flock, exclusive
creates, opens, writes, unlink, ftruncate). From the job's first save on (its first write into a
checkpoint's folder) each call into the run folder is a step, named ``"<op> <path in the run>"``
with the checkpoint's number left out (``ckpt-N``). The ``nth`` call of ``step`` fails with
``errno`` (EIO, ENOSPC, ENOTCONN: as Drive's mount fails), once. ``kill``: "right-after" SIGKILLs
the job at its next call into the run folder after that (nothing else has touched the run
since); "next-save" when the next checkpoint's first file is created (the fault handled);
"none" never. The job prints ``FAULT <error> at <step> in <checkpoint>`` on stdout when it fails the call.
``log``: where the steps seen are written (JSON) when the job ends by itself.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "jobs")]

import pytest  # noqa: E402
import train_job  # noqa: E402
from local_faults import Fault, LocalFaults, install  # noqa: E402

WRITES = ("create", "open_write", "write", "fsync", "replace", "link", "unlink", "ftruncate", "flock")


class StepFaults:
    """The fault, the kill and the log of one job (module docstring)."""

    def __init__(self, root: str, spec: dict) -> None:
        self.root = root
        self.step, self.nth, self.errno = spec.get("step", ""), spec.get("nth", 1), spec.get("errno", 5)
        self.kill = spec.get("kill", "none")
        self.armed, self.seen = False, 0
        self.faulted: str | None = None  # the checkpoint whose step failed
        self.log: list[str] = []

    def check(self, op: str, path: str) -> None:
        relative = os.path.relpath(path, self.root)
        named = re.sub(r"\.[0-9]+\.tmp$", ".PID.tmp", re.sub(r"ckpt-[0-9]{6}", "ckpt-N", relative))
        here = f"{op} {named}"
        checkpoint = re.match(r"ckpt-[0-9]{6}", relative)
        if not self.armed and op in WRITES and checkpoint:
            self.armed = True
        if not self.armed:
            return
        if self.faulted is not None and (self.kill == "right-after" or (
                self.kill == "next-save" and op in ("create", "open_write") and checkpoint
                and checkpoint.group(0) != self.faulted)):
            os.kill(os.getpid(), signal.SIGKILL)
        self.log.append(here)
        if here != self.step or self.faulted is not None:
            return
        self.seen += 1
        if self.seen == self.nth:
            self.faulted = checkpoint.group(0) if checkpoint else ""
            print(f"FAULT {os.strerror(self.errno)} at {here} in {self.faulted or '-'}", flush=True)
            raise OSError(self.errno, f"{os.strerror(self.errno)} (injected)", path)


def main(argv: list[str]) -> int:
    spec = json.loads(os.environ.get("RESUMABLE_FOLDER_FAULT", "{}"))
    root = os.path.realpath(argv[0])
    os.makedirs(root, exist_ok=True)
    steps = StepFaults(root, spec)
    faults = LocalFaults((root,))
    faults.faults.append(Fault("write", path="\0"))  # never hits, but sends writes through the patches
    checked = faults._check

    def check(op: str, path: str) -> None:
        if faults._inside(path):
            steps.check(op, path)
        checked(op, path)

    faults._check = check  # type: ignore[method-assign]
    install(faults, pytest.MonkeyPatch())
    if spec.get("log"):
        atexit.register(lambda: Path(spec["log"]).write_text(json.dumps(steps.log)))
    return train_job.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
