"""`Worker`: one background thread that runs jobs one at a time, and the one exit hook that waits for them.

Two slots: the job in flight and the job waiting. A submission while nothing runs is in flight
at once, whether or not the thread has started; a newer submission replaces the job still
waiting (never the one in flight), or waits for the slot when it may not replace it. A job that
raises does not stop the worker: the first such error is kept and raised by `join`. The thread
is a daemon, started at the first submission and ended when nothing is left to do, so that an
idle worker holds no thread.

At interpreter exit one hook (registered with the first thread started) runs each live
worker's ``at_exit`` once: the uploads and files still pending land before the process ends.
The hook is registered then, not at import: atexit runs hooks last-in first-out, and ours must
run before the hooks that close gcsfs' HTTP sessions (weakref finalizers). A non-daemon thread
would be joined (silently) before atexit runs, and would keep a notebook kernel's shutdown waiting.

Used by `Uploader` (checkpoints), `FileWriter` (ModelCheckpoint's files) and `Arrival` (a
checkpoint's files coming down). Whoever waits for them waits with `wait_for`, which a Ctrl-C
interrupts.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

J = TypeVar("J")

# A waiting thread wakes this often to look at the signals that came meanwhile. CPython runs a
# signal's handler in the main thread, but a SIGINT the kernel hands to another thread does not
# wake the main thread from a lock it blocks on: Ctrl-C in a cell that waits for an upload would
# do nothing until the upload lands.
SIGNAL_POLL = 0.25


def wait_for(cond: threading.Condition, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
    """``cond.wait_for(predicate, timeout)`` (``cond`` held), waking every `SIGNAL_POLL` seconds so
    that a KeyboardInterrupt is raised at once, whichever thread the signal reached."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not predicate():
        left = SIGNAL_POLL if deadline is None else min(SIGNAL_POLL, deadline - time.monotonic())
        if left <= 0:
            return False
        cond.wait(left)
    return True


class Worker(Generic[J]):
    """Runs ``run(job)`` for each submitted job in a daemon thread named ``name``.

    Args:
        name: The thread's name (``resumable-uploader``, ...).
        run: Runs one job in the worker thread; what it raises is kept for `join`.
        first: Called under the lock before each job is taken: a job to run ahead of the one
            waiting (the uploader's retry of a failed job), or None. Defaults to None.
        at_exit: Called once at interpreter exit while this worker lives (it says what it
            waits for, and waits). Defaults to None: the exit does not wait for this worker.

    ``cond`` is the lock of the two slots; an owner may guard its own state with it, and wait
    on it (it is notified whenever a job is taken or done).
    """

    def __init__(self, name: str, run: Callable[[J], object], *, first: Callable[[], J | None] | None = None,
                 at_exit: Callable[[], object] | None = None) -> None:
        self.name = name
        self._run = run
        self._first = first
        self.at_exit = at_exit
        self.cond = threading.Condition()  # reentrant: an owner holding it may call enqueue
        self.in_flight: J | None = None
        self.waiting: J | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._handed: J | None = None  # put in flight by `enqueue`, not yet run by the thread
        if at_exit is not None:
            _live.add(self)

    def __repr__(self) -> str:
        return f"Worker({self.name!r}, in_flight={self.in_flight!r}, waiting={self.waiting!r})"

    @property
    def thread(self) -> threading.Thread | None:
        """The worker thread while it runs, else None."""
        return self._thread

    @property
    def error(self) -> BaseException | None:
        """The first error a job raised, until `join` raises it."""
        with self.cond:
            return self._error

    def in_worker(self) -> bool:
        """True in the worker thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def idle(self) -> bool:
        """Nothing in flight or waiting."""
        with self.cond:
            return self.in_flight is None and self.waiting is None

    def enqueue(self, job: J, *, replaces: Callable[[J], bool] | None = None) -> J | None:
        """Put ``job`` in the waiting slot and return at once with the job it replaced (or None).

        ``replaces(waiting)`` says whether ``job`` may replace the job waiting; when it may not,
        this blocks until that job is taken. Defaults to None: the newest always replaces.
        """
        with self.cond:
            self._start_if_idle()  # a job the thread has not taken yet is not one to replace
            if replaces is not None:
                wait_for(self.cond, lambda: self.waiting is None or replaces(self.waiting))
                self._start_if_idle()
            replaced, self.waiting = self.waiting, job
            self._start_if_idle()
            self.wake()
            return replaced

    def _start_if_idle(self) -> None:
        """Under the lock, when nothing is in flight: the next job (``first``'s, else the one
        waiting) is in flight from now on, before the thread gets the CPU to take it. A
        submission that follows at once then finds it running, not waiting to be replaced."""
        if self.in_flight is None:
            self._handed = self._take()

    def wake(self) -> None:
        """Start the thread if it is not running, and let it look for work (``first`` included)."""
        with self.cond:
            if self._thread is None or not self._thread.is_alive():
                _register_exit_hook()
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self.cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Block until nothing is in flight or waiting; then raise the first error a job raised
        (once: it is cleared). Returns False when ``timeout`` seconds passed first."""
        with self.cond:
            done = wait_for(self.cond, lambda: self.in_flight is None and self.waiting is None, timeout)
            error, self._error = self._error, None
        if error is not None:
            raise error
        return done

    def close(self) -> None:
        """No longer waited for at interpreter exit (its owner waited, or gave up)."""
        _live.discard(self)

    def _take(self) -> J | None:
        """Under the lock: the job to run next, moved in flight; None when there is none."""
        job = self._first() if self._first is not None else None
        if job is None:
            job, self.waiting = self.waiting, None
        self.in_flight = job
        return job

    def _work(self) -> None:
        while True:
            with self.cond:
                job, self._handed = self._handed, None
                if job is None:
                    job = self._take()
                if job is None:
                    self._thread = None
                    self.cond.notify_all()
                    return
                self.cond.notify_all()  # the waiting slot is free
            try:
                self._run(job)
            except BaseException as e:  # noqa: BLE001 - kept for join(), never lost
                with self.cond:
                    if self._error is None:
                        self._error = e
            finally:
                with self.cond:
                    self.in_flight = None
                    self.cond.notify_all()


_live: weakref.WeakSet[Worker] = weakref.WeakSet()  # workers that wait at exit
_hook_registered = False
_exited = False


def _register_exit_hook() -> None:
    global _hook_registered
    if not _hook_registered:
        _hook_registered = True
        atexit.register(wait_at_exit)


def wait_at_exit() -> None:
    """Run each live worker's ``at_exit`` once, the first time this is called in the process
    (the exit hook, or a writer lease's ``before_exit`` that runs earlier: the uploads land
    before the lease is released); later calls return at once."""
    global _exited
    if _exited:
        return
    _exited = True
    for worker in list(_live):
        if worker.at_exit is None:
            continue
        try:
            worker.at_exit()
        except Exception as e:  # noqa: BLE001 - exiting anyway; the other workers still finish
            print(f"resumable: {e}", file=sys.stderr)


__all__ = ["Worker", "wait_at_exit", "wait_for"]
