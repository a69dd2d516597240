"""Each fault class at each step of a save on gs://, with a SIGKILL after it (tests/soak.py).

A real training job (tests/jobs/train_job.py, resume() + run.fit, keep_last=1) behind the fault
proxy. A probe save records the steps of a save: each file's upload (its session's start, its
body), the lease read before the manifest, the manifest, the lease's renewal, the index,
retention's deletes, and the lease given back at the end of fit. Then one attempt per cell
(step, fault class): the fault at exactly that step of the attempt's first save, and the
attempt SIGKILLed right after that request ("right-after") or once the next save begins, the
fault handled ("next-save"); the next attempt is the rerun. The last attempt meets its fault
when it gives the lease back, and finishes. The same properties as the soak: final weights
bitwise those of an unbroken fault-free run, nothing corrupt, each restart from the newest
committed checkpoint, times within the retry budget, one line per problem.

CI runs one chain that puts every step and every class in some cell (the diagonal);
RESUMABLE_SOAK_FULL=1 runs every class at every step (11 chains, ~25 min).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import FaultProxy
from forked import job_env
from soak import (
    CLASSES,
    AtStep,
    Soak,
    check_output,
    cost_bound,
    equal_weights,
    newest_ok,
    steps_of_a_save,
    unbroken,
)

from resumable import RunStorage

pytestmark = pytest.mark.slow

BASE_SECONDS = 60.0  # a fault-free attempt here: 3-6 s; a loaded 2-CPU box, several times that
ARGV = ["--keep-last", "1", "--when-behind", "wait", "--warnings-on-stderr"]
KILLS = ("right-after", "next-save")
CHAINS = ["diagonal", *(CLASSES if os.environ.get("RESUMABLE_SOAK_FULL") else [])]


@pytest.fixture
def proxy(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server) as running:
        yield running


def cells(chain: str, steps: list[tuple[str, int]]) -> list[tuple[str, int, str, str]]:
    """(step, nth, fault class, kill) for each attempt of a chain."""
    if chain == "diagonal":
        count = max(len(steps), len(CLASSES))
        return [(*steps[i % len(steps)], CLASSES[i % len(CLASSES)], KILLS[i % 2]) for i in range(count)]
    return [(*step, chain, KILLS[i % 2]) for i, step in enumerate(steps)]


@pytest.mark.parametrize("chain", CHAINS)
def test_each_fault_at_each_step_of_a_save_then_a_kill(chain: str, proxy: FaultProxy, gcs_bucket: str,
                                                       tmp_path: Path) -> None:
    url = f"{gcs_bucket}/runs/steps"
    soak = Soak(url, ARGV, job_env(STORAGE_EMULATOR_HOST=proxy.url), tmp_path, newest=lambda: newest_ok(url),
                settle=lambda: settled(proxy))
    outcomes_before = 0

    def attempt(step: AtStep, epochs: int, where: str) -> None:
        nonlocal outcomes_before
        proxy.choose, proxy.after = step, step.after
        started = soak.start(argv=["--epochs", str(epochs), "--out", str(tmp_path / "final.npz")])
        step.attempt = started
        started.finish(300)
        outcomes = [o for _, _, o in proxy.seen[outcomes_before:]]
        outcomes_before = len(proxy.seen)
        assert started.status in (0, -9), f"{where}: ended {started.status}\n{started.output()}"
        check_output(started, where)
        bound = BASE_SECONDS + cost_bound(outcomes)
        assert started.seconds <= bound, f"{where}: took {started.seconds:.0f} s, bound {bound:.0f} s"

    attempt(AtStep(), 1, "the first epoch")
    probe = AtStep()
    attempt(probe, 2, "the probe")
    every = steps_of_a_save(probe.log)
    released = [s for s in every if s[0].startswith("DELETE") and "/lease.json" in s[0]]
    steps = [s for s in every if s not in released]
    assert len(steps) >= 10 and released, probe.log  # uploads, manifest, lease, index, deletes; the release
    chain_cells = cells(chain, steps)
    epochs = 2 + len(chain_cells) + 1
    missed = []
    for step, nth, kind, kill in chain_cells:
        cell = AtStep(step, nth, kind, kill)
        attempt(cell, epochs, f"{kind} at {step} #{nth}, {kill}")
        if cell.faulted is None:
            missed.append((step, nth, kind))
    last = AtStep(*released[-1], CLASSES[len(chain_cells) % len(CLASSES)] if chain == "diagonal" else chain)
    attempt(last, epochs, "the last attempt")
    final = soak.attempts[-1]
    assert final.status == 0 and any(line.startswith("DONE") for line in final.lines), final.output()
    assert missed == [], f"faults that never met their step: {missed}"
    proxy.choose = proxy.after = None
    reference = unbroken(tmp_path / "unbroken", [*ARGV, "--epochs", str(epochs)])
    assert equal_weights(tmp_path / "final.npz", reference), "final weights differ from the unbroken run's"
    storage = RunStorage(url)
    listing = storage.list()
    assert [c.name for c in listing if not c.ok and c.status.value != "partial"] == [], \
        [(c.name, c.status.value, c.problem) for c in listing]
    assert listing[-1].ok and listing[-1].epoch == epochs
    assert storage.verify(listing[-1].name) == []
    print("steps:", [(step.split(" ", 1)[0] + " " + step.rsplit("/", 1)[-1], nth) for step, nth in steps])
    print(f"{chain}: {len(chain_cells)} cells over {len(steps)} steps, "
          f"{sum(a.killed for a in soak.attempts)} kills, "
          f"resumed from {[a.expected for a in soak.attempts]}, "
          f"{sum(a.seconds for a in soak.attempts):.0f} s")


def settled(proxy: FaultProxy) -> None:
    assert proxy.wait_idle(30), "a request still in flight 30 s after the kill"
