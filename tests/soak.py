"""Training jobs killed and rerun while their storage fails: the harness of tests/storage/test_soak_*.py.

A `Soak` runs tests/jobs/train_job.py (forked, tests/forked.py) on one run folder again and
again, from the top, as a user reruns a notebook after each death: each `Attempt` is killed
(SIGKILL) where the test says or runs to its end. Before each attempt the run folder is listed
(`newest`): the job's one resume line on stderr must name that newest committed checkpoint.
Each attempt's output is checked as a user reads it (`check_output`): no traceback, each
problem on one line.

The faults themselves come from a chooser the test hands the proxy (`Chaos`: seeded random
faults of every class; `AtStep`: one fault at the Nth request of a save) or from the job's own
wrapper (tests/jobs/faulty_folder_job.py, for a local folder).
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fault_proxy import Rule
from forked import ForkedJob, start_job

# The line resume() prints on stderr, once (keras/run.py `_resumed_line`, or a new run's)
RESUME_LINE = re.compile(r"^resumable: (?:resumed \S+ from (ckpt-\d+)|starting a new run in )")

# What train_job.py prints on stdout: its markers, resumable's log records, resumable's prints
JOB_LINES = ("READY ", "RESUMED ", "LOG ", "DONE ", "resumable: ", "FAULT ")

# The fault classes of issue #51, each as a proxy rule (`rule`)
CLASSES = ("500", "503", "429", "500-applied", "503-applied", "reset", "lost-answer", "truncate",
           "late-answer", "stall", "outage")
STALL_SECONDS = 1.5  # a stall or a late answer: this long, then a reset
OUTAGE_SECONDS = (1.0, 4.0)  # every request fails with 503 for this long (seeded within)

# What one fault may cost, derived from the training retry budget (docs/reliability.md,
# guarantee 14): gcsfs' first retry waits up to 2 s, resumable's own up to 8 s; a stall or a
# late answer adds its length, an outage its length and the retries' waits across it (1+2+4+8).
FAULT_COST = 10.0
OUTAGE_COST = OUTAGE_SECONDS[1] + 15.0 + FAULT_COST


def rule(kind: str, rng: random.Random | None = None) -> Rule:
    """The proxy rule of one fault class (`CLASSES`), for the one request it is chosen for."""
    if kind.endswith("-applied"):
        return Rule(int(kind.split("-")[0]), applied=True)
    if kind in ("500", "503", "429"):
        return Rule(int(kind))
    if kind == "stall":
        return Rule("stall", after=(rng or random.Random(0)).choice([0, 1, 100]), seconds=STALL_SECONDS)
    if kind == "late-answer":
        return Rule("late-answer", seconds=STALL_SECONDS)
    if kind == "outage":
        return Rule(503, message="outage")
    return Rule(kind)


def cost_bound(outcomes: list[str]) -> float:
    """The most time the faults seen (the proxy's outcomes) may add to an attempt."""
    extra = 0.0
    for outcome in outcomes:
        if outcome == "forwarded":
            continue
        extra += FAULT_COST + (STALL_SECONDS if outcome in ("stall", "late-answer") else 0.0)
    return extra


class Chaos:
    """Seeded random faults: each request fails with probability ``rate``, its class drawn from
    `CLASSES`; an outage fails every request for a seeded 1-4 s. The proxy's `choose`."""

    def __init__(self, seed: int, rate: float) -> None:
        self.rng, self.rate = random.Random(seed), rate
        self.outage_until = 0.0
        self.outages = 0
        self.enabled = True

    def __call__(self, method: str, path: str, content_range: str) -> Rule | None:
        if not self.enabled:
            return None
        now = time.monotonic()
        if now < self.outage_until:
            return rule("outage")
        if self.rng.random() >= self.rate:
            return None
        kind = self.rng.choice(CLASSES)
        if kind == "outage":
            self.outages += 1
            self.outage_until = now + self.rng.uniform(*OUTAGE_SECONDS)
        return rule(kind, self.rng)


def shape(method: str, path: str) -> str:
    """A request with what changes from run to run left out (upload ids, generations, which
    checkpoint): the same step of a save has the same shape in every save."""
    parsed = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(parsed.query)
    words = [method, urllib.parse.unquote(parsed.path)]
    if "name" in query:
        words.append("name=" + query["name"][0])
    if "upload_id" in query:
        words.append("data")  # the upload's body, not its start
    if "ifGenerationMatch" in query:
        words.append("create-only" if query["ifGenerationMatch"][0] == "0" else "if-generation")
    if "alt" in query:
        words.append("media")
    if "prefix" in query:
        words.append("prefix=" + query["prefix"][0])
    return re.sub(r"ckpt-\d{6}", "ckpt-N", " ".join(words))


def starts_a_save(method: str, path: str) -> bool:
    """The first upload of a checkpoint's file begins (its session's start)."""
    return method == "POST" and "/upload/" in path and "ckpt-" in path and "upload_id=" not in path


@dataclass
class AtStep:
    """One fault at one step of a save, and a SIGKILL after it: the proxy's `choose` and `after`.

    The step is the ``nth`` request of shape ``step`` (`shape`) once the attempt's first save
    began (`starts_a_save`). ``kill``: "right-after" SIGKILLs the attempt right after that
    request was handled; "next-save" once the next save begins (the fault handled, the save
    committed or given up); "none" never. Without ``step``, records the shapes (``log``)."""

    step: str = ""
    nth: int = 1
    kind: str = ""
    kill: str = "none"
    attempt: Attempt | None = None
    armed: bool = False
    seen: int = 0
    faulted: tuple[str, str] | None = None
    log: list[str] = field(default_factory=list)  # the shapes of the requests since armed

    def __call__(self, method: str, path: str, content_range: str) -> Rule | None:
        if not self.armed and starts_a_save(method, path):
            self.armed = True
        if not self.armed:
            return None
        here = shape(method, path)
        self.log.append(here)
        if here != self.step or self.faulted is not None:
            return None
        self.seen += 1
        if self.seen != self.nth:
            return None
        self.faulted = (method, path)
        return rule(self.kind)

    def after(self, method: str, path: str, outcome: str) -> None:
        if self.attempt is None or self.faulted is None:
            return
        right_after = (method, path) == self.faulted and outcome != "forwarded"
        next_save = starts_a_save(method, path) and _ckpt(path) != _ckpt(self.faulted[1])
        if (self.kill == "right-after" and right_after) or (self.kill == "next-save" and next_save):
            self.attempt.kill()


def _ckpt(path: str) -> str:
    found = re.search(r"ckpt-\d{6}", urllib.parse.unquote(path))
    return found.group(0) if found else ""


def steps_of_a_save(log: list[str]) -> list[tuple[str, int]]:
    """The steps to fail, from the shapes a save's requests had (``AtStep.log``): every write and
    delete, and the first lease read (the fence before the manifest), each with its ``nth``."""
    steps: list[tuple[str, int]] = []
    counts: dict[str, int] = {}
    for here in log:
        counts[here] = counts.get(here, 0) + 1
        if not here.startswith("GET") or (here.endswith("lease.json media") and counts[here] == 1):
            steps.append((here, counts[here]))
    return steps


@dataclass
class Attempt:
    """One training process, from start to its end or its SIGKILL."""

    job: ForkedJob
    expected: str | None  # the newest committed checkpoint when it started
    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    status: int | None = None
    seconds: float = 0.0
    killed: bool = False

    def finish(self, timeout: float) -> None:
        while (line := self.job.next_line(timeout)) is not None:
            self.lines.append(line)
        self.status = self.job.wait(timeout=30)
        self.seconds = time.monotonic() - self.started
        self.killed = self.killed or self.status == -signal.SIGKILL  # by itself, too (faulty_folder_job)

    def kill(self) -> None:
        """SIGKILL, unless it ended already (its pid may be another process' by now)."""
        if not self.killed and self.job.poll() is None:
            self.killed = True
            self.job.send_signal(signal.SIGKILL)

    @property
    def stderr(self) -> str:
        return self.job.stderr_text()

    def output(self) -> str:
        return "\n".join(self.lines) + "\n--- stderr ---\n" + self.stderr[-4000:]


def check_output(attempt: Attempt, where: str) -> list[str]:
    """What the user saw: no traceback; each problem on one line; one resume line on stderr,
    naming the newest committed checkpoint. Returns the problem lines (stdout's warnings and
    stderr's lines other than the resume line)."""
    stderr = attempt.stderr
    assert "Traceback" not in stderr and "Traceback" not in "\n".join(attempt.lines), \
        f"{where}: a traceback\n{attempt.output()}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    # Python's warnings show the warning's source line under it, indented: the same problem
    lines = [line for i, line in enumerate(lines)
             if not (line[:1].isspace() and i > 0 and re.search(r":\d+: \w*Warning: ", lines[i - 1]))]
    continued = [line for line in lines if line[:1].isspace()]
    assert continued == [], f"{where}: a problem on more than one line: {continued}\n{attempt.output()}"
    resumes = [line for line in lines if RESUME_LINE.match(line)]
    if resumes or not attempt.killed:
        assert len(resumes) == 1, f"{where}: {len(resumes)} resume lines\n{attempt.output()}"
        found = RESUME_LINE.match(resumes[0])
        resumed = found.group(1) if found else None
        assert resumed == attempt.expected, (
            f"{where}: resumed from {resumed}, the newest committed checkpoint was {attempt.expected}\n"
            f"{attempt.output()}")
    strays = [line for line in attempt.lines if not line.startswith(JOB_LINES)]
    assert strays == [], f"{where}: lines the job does not print (a message on several lines?): {strays}"
    warnings = [line for line in attempt.lines if line.startswith("resumable:")]
    return [line for line in lines if not RESUME_LINE.match(line)] + warnings


class Soak:
    """Runs the job on ``url`` from the top, attempt after attempt (module docstring)."""

    def __init__(self, url: str, argv: list[str], env: dict[str, str], logs: Path,
                 newest: Callable[[], str | None], settle: Callable[[], None] = lambda: None,
                 script: Path | None = None) -> None:
        from paths import JOBS

        self.url, self.argv, self.env, self.logs = url, argv, env, logs
        self.newest, self.settle = newest, settle
        self.script = script or JOBS / "train_job.py"
        self.attempts: list[Attempt] = []

    def start(self, env: dict[str, str] | None = None, argv: list[str] | None = None) -> Attempt:
        """Start the next attempt (``argv``, ``env``: more arguments and variables for this one)."""
        self.settle()  # a killed job's last request may still be on its way
        expected = self.newest()
        log = self.logs / f"attempt-{len(self.attempts)}.stderr"
        job = start_job(self.script, [self.url, *self.argv, *(argv or [])], env={**self.env, **(env or {})},
                        stderr=log)
        attempt = Attempt(job, expected)
        self.attempts.append(attempt)
        return attempt

    def run(self, kill_after: float | None = None, timeout: float = 300,
            env: dict[str, str] | None = None, argv: list[str] | None = None) -> Attempt:
        """One attempt: SIGKILLed ``kill_after`` s after it started (None: not by time)."""
        attempt = self.start(env, argv)
        timer = kill_later(attempt, kill_after) if kill_after is not None else None
        try:
            attempt.finish(timeout)
        finally:
            if timer:
                timer.cancel()
        return attempt


def kill_later(attempt: Attempt, seconds: float) -> threading.Timer:
    """SIGKILL ``attempt`` ``seconds`` from now (cancel the timer once it ended)."""
    timer = threading.Timer(seconds, attempt.kill)
    timer.daemon = True
    timer.start()
    return timer


def newest_ok(url: str) -> str | None:
    """The newest committed checkpoint of the run (as `resumable list` says: status ok)."""
    from resumable import RunStorage

    if url.startswith("gs://"):
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()
    ok = [c.name for c in RunStorage(url).list() if c.ok]
    return ok[-1] if ok else None


def unbroken(folder: Path, argv: list[str]) -> Path:
    """The job's final weights (a .npz) from one run on a local folder, never killed, no fault."""
    from forked import run_job
    from paths import JOBS

    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "final.npz"
    if not out.exists():
        done = run_job(JOBS / "train_job.py", [str(folder / "run"), *argv, "--out", str(out)])
        assert done.returncode == 0, done.stdout + done.stderr
    return out


def weights(path: Path) -> list[Any]:
    import numpy as np

    with np.load(path) as data:
        return [data[key] for key in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


def equal_weights(path: Path, reference: Path) -> bool:
    import numpy as np

    mine, theirs = weights(path), weights(reference)
    return len(mine) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
