"""How long a writer that died on another machine blocks the next session (a recycled Colab VM).

Real processes (tests/jobs/lease_job.py, a tiny Keras training), on a local folder and on
``gs://`` (fake-gcs-server), with the default ``lease_timeout``:

1. the writer (host name "vm-a") commits epoch 1, then holds the run, renewing its lease;
2. a second session on host "vm-b" starts meanwhile: it must be refused (LeaseHeldError);
   timed from its ``resume()`` returning to the refusal;
3. the writer is SIGKILLed (no release, no last renewal) and a new session on host "vm-c" is
   started at once, with no flag: timed from the SIGKILL to its fit beginning (it holds the
   lease then), and from its ``resume()`` returning to that moment (the wait for the lease).

Usage::

    python benchmarks/bench_takeover.py                       # local and gcs, 3 kills each
    python benchmarks/bench_takeover.py --backends local --repeat 1

On a local folder the new session watches the lease unchanged for its whole timeout (40 s)
from its first look; on GCS the storage's clock says how long the lease has been silent and
only the rest is watched (at least 15 s), so there the time to continue varies with the point
of the writer's 10 s renewal cycle the kill fell on; the table shows each run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fake_gcs import fake_gcs_server, point_gcs_clients_at  # noqa: E402

from resumable.core.display import format_table  # noqa: E402

JOB = ROOT / "tests" / "jobs" / "lease_job.py"


class Job:
    """lease_job.py in a subprocess; each stdout line with the monotonic time it arrived."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        self.proc = subprocess.Popen([sys.executable, str(JOB), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
        self.lines: list[str] = []
        self._queue: queue.Queue[tuple[float, str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put((time.monotonic(), line.rstrip("\n")))
        self._queue.put((time.monotonic(), "EOF"))

    def expect(self, prefix: str, timeout: float = 300) -> float:
        """The time the first line starting with ``prefix`` arrived."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                when, line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            self.lines.append(line)
            if line.startswith(prefix):
                return when
            if line == "EOF":
                break
        self.proc.kill()
        raise SystemExit(f"no {prefix!r} line; output:\n" + "\n".join(self.lines[-30:]))

    def finish(self) -> int:
        self.expect("EOF")
        return self.proc.wait(60)


def one_kill(url: str) -> dict[str, float]:
    holder = Job(url, "--epochs", "3", "--hold", "600", "--as-host", "vm-a")
    holder.expect("LOG resumable: saved")
    live = Job(url, "--epochs", "3", "--as-host", "vm-b")
    ready = live.expect("READY")
    refused = live.expect("LEASE_HELD")
    if live.finish() != 3:
        raise SystemExit("the live writer's contender was not refused")
    time.sleep(random.uniform(0, 10))  # anywhere in the writer's renewal cycle
    killed = time.monotonic()
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait()
    after = Job(url, "--epochs", "2", "--as-host", "vm-c")
    resumed = after.expect("READY")
    training = after.expect("TRAINING")
    after.expect("DONE")
    if after.finish() != 0:
        raise SystemExit("the new session did not finish")
    return {"refused": refused - ready, "continue": training - killed, "wait": training - resumed,
            "start": resumed - killed}


@contextlib.contextmanager
def run_folders(backend: str) -> Iterator[Iterator[str]]:
    if backend == "local":
        with tempfile.TemporaryDirectory() as folder:
            yield (f"{folder}/run-{i}" for i in range(1000))
        return
    import gcsfs

    with fake_gcs_server() as endpoint:
        point_gcs_clients_at(endpoint)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        gcsfs.GCSFileSystem(token="anon").mkdir(bucket)
        yield (f"gs://{bucket}/run-{i}" for i in range(1000))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["local", "gcs"], choices=["local", "gcs"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    for backend in args.backends:
        with run_folders(backend) as urls:
            for i in range(args.repeat):
                took = one_kill(next(urls))
                rows.append([backend, str(i + 1), f"{took['refused']:.1f}", f"{took['continue']:.1f}",
                             f"{took['start']:.1f}", f"{took['wait']:.1f}"])
                print(f"{backend} #{i + 1}: continued {took['continue']:.1f} s after the SIGKILL",
                      file=sys.stderr)
    headers = ["BACKEND", "RUN", "LIVE WRITER: REFUSED AFTER (s)", "KILL -> CONTINUES (s)",
               "OF WHICH: START (s)", "WAIT FOR THE LEASE (s)"]
    print("\n".join(format_table(headers, rows, right={1, 2, 3, 4, 5})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
