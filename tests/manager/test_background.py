"""The worker under Uploader, FileWriter and Arrival (resumable/manager/background.py), on real threads."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from resumable.manager.background import Worker


class Gate:
    """Jobs that run until the test lets them finish, recording where and in which order they ran."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.done: list[str] = []
        self.threads: set[str] = set()
        self.release = threading.Event()
        self.running = threading.Event()
        self.fail: set[str] = set()

    def run(self, job: str) -> None:
        self.started.append(job)
        self.threads.add(threading.current_thread().name)
        self.running.set()
        assert self.release.wait(10)
        if job in self.fail:
            raise OSError(f"{job} failed")
        self.done.append(job)


def test_jobs_run_one_at_a_time_in_order_in_the_named_thread() -> None:
    gate = Gate()
    gate.release.set()
    worker: Worker[str] = Worker("test-worker", gate.run)
    for job in ("a", "b", "c"):
        worker.enqueue(job)
        assert worker.join(timeout=10)
    assert gate.done == ["a", "b", "c"]
    assert gate.threads == {"test-worker"}


def test_the_newest_submission_replaces_the_waiting_job_never_the_running_one() -> None:
    gate = Gate()
    worker: Worker[str] = Worker("test-worker", gate.run)
    assert worker.enqueue("a") is None
    assert gate.running.wait(10)  # a is in flight
    assert worker.enqueue("b") is None
    assert worker.enqueue("c") == "b"  # b was waiting: replaced, handed back to its owner
    assert (worker.in_flight, worker.waiting) == ("a", "c")
    gate.release.set()
    assert worker.join(timeout=10)
    assert gate.done == ["a", "c"]


def test_a_job_submitted_while_nothing_runs_is_in_flight_before_the_thread_takes_it() -> None:
    """Two submissions back to back, before the new thread got the CPU (a loaded machine, or a
    GIL switch interval longer than the gap): the first must not be taken for a waiting job."""
    gate = Gate()
    worker: Worker[str] = Worker("test-worker", gate.run)
    with worker.cond:  # the thread takes nothing while the lock is held: as if it had not run yet
        assert worker.enqueue("a") is None
        assert worker.enqueue("b") is None  # a is in flight: b waits, nothing replaced
        assert (worker.in_flight, worker.waiting) == ("a", "b")
        assert worker.enqueue("c") == "b"  # the third replaces the waiting one, as documented
    gate.release.set()
    assert worker.join(timeout=10)
    assert gate.done == ["a", "c"]


def test_a_job_that_may_not_replace_the_waiting_one_waits_for_the_slot() -> None:
    gate = Gate()
    worker: Worker[str] = Worker("test-worker", gate.run)
    worker.enqueue("a")
    assert gate.running.wait(10)
    worker.enqueue("b")
    returned: list[str | None] = []
    def submit_c() -> None:
        returned.append(worker.enqueue("c", replaces=lambda waiting: waiting == "c"))

    submitter = threading.Thread(target=submit_c)
    submitter.start()
    submitter.join(0.3)
    assert submitter.is_alive() and worker.waiting == "b"  # blocked while b waits
    gate.release.set()  # a finishes, b is taken: the slot is free
    submitter.join(10)
    assert returned == [None]
    assert worker.join(timeout=10)
    assert gate.done == ["a", "b", "c"]


def test_the_same_job_saved_again_replaces_the_waiting_one_without_blocking() -> None:
    gate = Gate()
    worker: Worker[str] = Worker("test-worker", gate.run)
    worker.enqueue("a")
    assert gate.running.wait(10)
    worker.enqueue("b")
    assert worker.enqueue("b", replaces=lambda w: w == "b") == "b"
    gate.release.set()
    assert worker.join(timeout=10)
    assert gate.done == ["a", "b"]


def test_the_first_error_is_kept_and_raised_once_at_join_and_later_jobs_still_run() -> None:
    gate = Gate()
    gate.fail = {"a", "b"}
    gate.release.set()
    worker: Worker[str] = Worker("test-worker", gate.run)
    for job in ("a", "b", "c"):
        worker.enqueue(job)
        while not worker.idle():
            time.sleep(0.01)
    assert gate.done == ["c"]
    assert str(worker.error) == "a failed"
    with pytest.raises(OSError, match="^a failed$"):
        worker.join(timeout=10)
    assert worker.error is None
    assert worker.join(timeout=10)  # raised once


def test_join_returns_false_when_the_timeout_passes_first() -> None:
    gate = Gate()
    worker: Worker[str] = Worker("test-worker", gate.run)
    worker.enqueue("a")
    started = time.monotonic()
    assert worker.join(timeout=0.2) is False
    assert 0.15 < time.monotonic() - started < 5
    gate.release.set()
    assert worker.join(timeout=10)


def test_an_idle_worker_holds_no_thread_and_starts_one_for_the_next_job() -> None:
    gate = Gate()
    gate.release.set()
    worker: Worker[str] = Worker("test-worker", gate.run)
    assert worker.thread is None
    worker.enqueue("a")
    first = worker.thread
    assert first is not None
    worker.join(timeout=10)
    first.join(10)
    assert not first.is_alive() and worker.thread is None
    worker.enqueue("b")
    assert worker.join(timeout=10) and gate.done == ["a", "b"]


def test_in_worker_is_true_only_in_the_worker_thread() -> None:
    seen: list[bool] = []
    worker: Worker[str] = Worker("test-worker", lambda job: seen.append(worker.in_worker()))
    worker.enqueue("a")
    worker.join(timeout=10)
    assert seen == [True] and not worker.in_worker()


def test_first_runs_a_job_ahead_of_the_waiting_one() -> None:
    gate = Gate()
    retry = ["r"]
    worker: Worker[str] = Worker("test-worker", gate.run, first=lambda: retry.pop() if retry else None)
    with worker.cond:  # the worker takes nothing while the lock is held
        worker.enqueue("b")
    gate.release.set()
    assert worker.join(timeout=10)
    assert gate.done == ["r", "b"]


EXIT_SCRIPT = """
import sys, time
from resumable.manager.background import Worker, wait_at_exit

def slow(job):
    time.sleep(5 if job == "quiet" else 0.5)
    sys.stdout.write(f"landed {job}\\n")  # one write: the threads' lines never interleave
    sys.stdout.flush()

def waiting(name):
    workers = []
    def at_exit():
        sys.stdout.write(f"at_exit {name}\\n")  # one write, as the jobs' (print writes its parts apart)
        sys.stdout.flush()
        workers[0].join()
    workers.append(Worker("test-" + name, slow, at_exit=at_exit))
    return workers[0]

kept = [waiting("one"), waiting("two"), Worker("test-quiet", slow)]  # the last is not waited for
for worker, job in zip(kept, ("one", "two", "quiet")):
    worker.enqueue(job)
if sys.argv[1] == "twice":
    wait_at_exit()
print("END", flush=True)
"""


@pytest.mark.parametrize("how", ["once", "twice"])
def test_interpreter_exit_waits_for_each_live_worker_once(how: str) -> None:
    result = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, how], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(line for line in lines if line.startswith("at_exit")) == ["at_exit one", "at_exit two"]
    assert "landed one" in lines and "landed two" in lines
    assert "landed quiet" not in lines  # a daemon thread nobody waits for ends with the process
    if how == "twice":  # the hook, called before the end, waited; at exit it does nothing more
        assert lines.index("END") > lines.index("landed two")
    else:
        assert lines.index("END") < lines.index("landed one")


def test_a_ctrl_c_another_thread_receives_interrupts_a_wait_at_once(ctrl_c_as_in_a_notebook: None) -> None:
    """The kernel may hand a process' SIGINT to any of its threads; CPython runs the handler in
    the main thread, which a lock it blocks on does not let go: the wait must wake to see it."""
    import signal

    gate = Gate()
    worker: Worker[str] = Worker("test-worker", gate.run)
    worker.enqueue("a")
    assert gate.running.wait(10)
    bystander = threading.Thread(target=time.sleep, args=(2,), name="bystander")
    bystander.start()
    threading.Timer(0.3, signal.pthread_kill, (bystander.ident, signal.SIGINT)).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.join()  # no timeout: only the job's end or the interrupt ends it
        assert time.monotonic() - started < 2  # at once, not when the job ends (10 s)
    finally:
        gate.release.set()
        bystander.join()
    assert worker.join(timeout=10)
