"""A seeded soak on gs://: a real training job SIGKILLed 2-4 times and rerun from the top while
the storage fails at random with every fault class of issue #51 (tests/soak.py).

fake-gcs-server behind tests/fault_proxy.py; tests/jobs/train_job.py (resume() + run.fit)
forked per attempt, pointed at the proxy. The seed draws the faults (each request fails with
probability RATE, its class drawn from `soak.CLASSES`: 500/503/429 before and after the
request was applied, resets both ways, a reply cut short, a late reply, a stall, an outage of
1-4 s) and the kills (after a random number of requests of the attempt, or a random time after
it started). What must hold, for every seed:

- the final weights are bitwise those of the same job run once, unbroken, without faults;
- no checkpoint is corrupt, every committed one verifies;
- each restart resumed from the newest checkpoint committed when it started (its one resume
  line on stderr against the listing just before);
- each attempt ended within the time the faults it met may cost (`soak.cost_bound`, from the
  documented retry budget) plus a fault-free attempt's worst time here;
- no traceback anywhere, each problem on one line.

    RESUMABLE_SOAK_SEEDS=25 pytest tests/keras/test_fault_soak.py     # a long soak: seeds 0-24
    RESUMABLE_SOAK_SEED=17 pytest tests/keras/test_fault_soak.py      # replay one seed

A failing seed says so in its message, with the line that replays it.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import FaultProxy
from forked import job_env, run_job
from paths import JOBS
from soak import Attempt, Chaos, Soak, check_output, cost_bound, equal_weights, kill_later, newest_ok

from resumable import RunStorage

pytestmark = pytest.mark.slow

EPOCHS = 6
RATE = 0.04  # of requests failing: about 10 faults a seed over ~250 requests
BASE_SECONDS = 60.0  # a fault-free attempt here takes 4-8 s; a loaded 2-CPU box, several times that
ARGV = ["--epochs", str(EPOCHS), "--keep-last", "2", "--when-behind", "wait", "--warnings-on-stderr"]


def seeds() -> list[int]:
    if os.environ.get("RESUMABLE_SOAK_SEED"):
        return [int(os.environ["RESUMABLE_SOAK_SEED"])]
    return list(range(int(os.environ.get("RESUMABLE_SOAK_SEEDS", "3"))))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job on a local folder, once, never killed, no fault."""
    folder = tmp_path_factory.mktemp("reference")
    done = run_job(JOBS / "train_job.py", [str(folder / "run"), *ARGV, "--out", str(folder / "final.npz")])
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / "final.npz"


@pytest.fixture
def proxy(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server) as running:
        yield running


class Killer:
    """The proxy's `after` hook: SIGKILLs the current attempt right after its Nth request."""

    def __init__(self) -> None:
        self.attempt: Attempt | None = None
        self.requests = 0
        self.at: int | None = None

    def arm(self, attempt: Attempt | None, at: int | None) -> None:
        self.attempt, self.requests, self.at = attempt, 0, at

    def __call__(self, method: str, path: str, outcome: str) -> None:
        self.requests += 1
        if self.attempt is not None and self.at is not None and self.requests >= self.at:
            self.attempt.kill()


@pytest.mark.parametrize("seed", seeds())
def test_seeded_faults_and_kills_end_as_an_unbroken_run(
    seed: int, proxy: FaultProxy, gcs_bucket: str, reference: Path, tmp_path: Path,
) -> None:
    try:
        soak_one_seed(seed, proxy, gcs_bucket, reference, tmp_path)
    except AssertionError as e:
        raise AssertionError(f"seed {seed} failed (replay: RESUMABLE_SOAK_SEED={seed} "
                             f"pytest tests/keras/test_fault_soak.py): {e}") from None


def soak_one_seed(seed: int, proxy: FaultProxy, bucket: str, reference: Path, tmp_path: Path) -> None:
    rng = random.Random(seed)
    chaos = Chaos(seed, RATE)
    killer = Killer()
    proxy.choose, proxy.after = chaos, killer
    url = f"{bucket}/runs/soak-{seed}"
    out = tmp_path / "final.npz"
    soak = Soak(url, [*ARGV, "--out", str(out)], job_env(STORAGE_EMULATOR_HOST=proxy.url), tmp_path,
                newest=lambda: newest_ok(url), settle=lambda: proxy_settled(proxy))
    kills = rng.randint(2, 4)
    seen_before = [0]
    problems: list[str] = []

    def attempt(kill: bool) -> Attempt:
        by_requests = kill and rng.random() < 0.7
        kill_after = rng.uniform(0.5, 8.0) if kill and not by_requests else None
        started = soak.start()
        killer.arm(started, rng.randint(3, 120) if by_requests else None)
        timer = kill_later(started, kill_after) if kill_after is not None else None
        started.finish(300)
        if timer is not None:
            timer.cancel()
        killer.arm(None, None)
        outcomes = [o for _, _, o in proxy.seen[seen_before[0]:]]
        seen_before[0] = len(proxy.seen)
        where = f"attempt {len(soak.attempts)}"
        assert started.status in (0, -9), f"{where} ended {started.status}\n{started.output()}"
        problems.extend(check_output(started, where))
        bound = BASE_SECONDS + cost_bound(outcomes)
        assert started.seconds <= bound, f"{where} took {started.seconds:.0f} s, bound {bound:.0f} s"
        return started

    for _ in range(kills):
        if attempt(kill=True).status == 0:
            break  # it finished before its moment came
    final = attempt(kill=False)
    assert final.status == 0 and any(line.startswith("DONE") for line in final.lines), final.output()
    assert equal_weights(out, reference), "final weights differ from the unbroken run's"
    chaos.enabled = False
    storage = RunStorage(url)
    listing = storage.list()
    assert [c.status.value for c in listing if not c.ok and c.status.value != "partial"] == [], \
        [(c.name, c.status.value, c.problem) for c in listing]
    assert listing and listing[-1].ok and listing[-1].epoch == EPOCHS
    for checkpoint in listing:
        if checkpoint.ok:
            assert storage.verify(checkpoint.name) == [], checkpoint.name
    faults = Counter(o for _, _, o in proxy.seen if o != "forwarded")
    killed = sum(a.killed for a in soak.attempts)
    print(f"seed {seed}: {len(soak.attempts)} attempts, {killed} killed, resumed from "
          f"{[a.expected for a in soak.attempts]}, faults {dict(faults)}, "
          f"{len(problems)} problem lines {problems[:6]}, {sum(a.seconds for a in soak.attempts):.0f} s")
    assert sum(faults.values()) > 0, "no fault was injected"
    assert killed >= 1


def proxy_settled(proxy: FaultProxy) -> None:
    """A killed job's requests still in the proxy reach the server before the listing."""
    assert proxy.wait_idle(30), "a request still in flight 30 s after the kill"
    time.sleep(0.05)
