"""The writer lease: one process at a time writes a run folder.

Two notebooks training into the same run folder would interleave their checkpoints, delete
each other's with retention and rewrite the run index in turn. So the writer takes a lease
first: ``<run>/lease.json``, created only if absent (``ifGenerationMatch=0`` on GCS, an
exclusive create locally), naming the holder's host, process and start time. The holder
renews it from a background thread every ``renew_interval`` (10 s by default); a lease not
renewed for its ``timeout`` (40 s by default: three missed renewals) is stale and is taken
over, as is one whose process is gone (same host, dead process id), or any lease with
``takeover=True``.

Staleness is never judged by comparing another machine's clock with ours: a contender whose
clock runs a minute ahead must not take a live writer's lease. A lease is stale when (a) this
process watched it unchanged for its ``timeout``, by its own monotonic clock; (b) the storage's
own clock says it was last written longer ago than that (GCS: the answer's ``Date`` minus the
object's ``updated`` time); or (c) it was renewed by this very machine, whose clock is ours,
longer ago than that. A renewal time in the future tells nothing (the lease is watched, as one
of another machine): a hostile lease "renewed in 2099" blocks for one ``timeout``, not until 2099.

So a contender that finds a fresh lease of another machine cannot ask whether its process still
runs, and watches the lease (`Lease.acquire`): one line on stderr says how long it waits
(a countdown on a terminal or in a notebook); if the holder renews meanwhile it is alive, and
the contender is refused with the one-line LeaseHeldError at that moment (on GCS within one
renewal interval; on a mount once renewals went on for a whole ``timeout``: Drive may show
another machine's last renewals after that machine died, so each one there restarts the watch);
if it stays unchanged for its ``timeout`` (less what GCS says has passed since its last write,
but never less than `MIN_WATCH` renewal intervals), the contender takes it over. A writer that
died with its Colab VM thus blocks the next session for about ``timeout`` (40 s), plus Drive's
delay in showing its last renewals.
A lease that would take longer than `MAX_WAIT` to watch (a long ``timeout``, or one written by
a version that renewed every minute) is refused at once, its message saying how long it takes
to go stale. A live process on this machine is refused at once.

Every change is a compare-and-swap (a GCS generation precondition; locally a
read-compare-replace under ``flock``), so two contenders never both win and a release never
deletes another holder's lease. A holder that finds its lease taken over stops writing
(`LeaseLostError`, naming the process that took it). Where a mount has no hard links, lease.json
exists for a moment before its bytes do: an unreadable lease younger than `TORN_GRACE` is
being written, and is waited for, never taken over (`lease_contest`). Readers (list,
inspect, verify, resume's loading) need no lease.

Here: `Lease`, one writer's lease (take, renew, fence, release, the renewal thread, the release
at exit). What lease.json says and the judgements of its holder: `lease_info.LeaseInfo`; a
contender facing a lease already there: `lease_contest.may_take`; this process and machine as
a lease names them: `this_machine` (the wall clock as lease.json stores it: `lease_info.wall_clock`).

Example:

```python
lease = Lease(RunStorage("gs://bucket/runs/exp1"), timeout=40)
lease.acquire()            # LeaseHeldError naming the holder if another process writes the run
lease.start_renewing()     # every timeout / 4 seconds (at most 60), in a daemon thread
...                        # lease.renew() before each commit: LeaseLostError once taken over
lease.release()            # deletes lease.json only if it is still ours
```
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime as dt
import logging
import math
import os
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from resumable.core.errors import LeaseHeldError, LeaseLostError, ResumableError
from resumable.storage import RunStorage, lease_info, this_machine
from resumable.storage.lease_contest import MAX_WAIT, TORN_GRACE, may_take
from resumable.storage.lease_info import (
    DEFAULT_TIMEOUT,
    LEASE_FORMAT,
    LEASE_NAME,
    MAX_RENEW_INTERVAL,
    MIN_WATCH,
    RENEWALS_PER_TIMEOUT,
    LeaseInfo,
    check_holder,
    read_lease,
)

logger = logging.getLogger("resumable")

ACQUIRE_TRIES = 5  # contenders racing on the file: each lost race re-reads it


class Lease:
    """The writer lease of one run folder, for one writer.

    Args:
        storage: The run folder.
        timeout: Seconds without renewal after which other processes may take the lease over;
            written into the lease, so every contender honours the holder's setting. Defaults
            to 40.
        renew_interval: Seconds between renewals by `start_renewing`; written into the lease
            too. Defaults to ``min(60, timeout / 4)``: stale after three missed renewals.
        before_exit: Run at interpreter exit before a held lease is released (the callback
            lands its last uploads there). Defaults to None.
    """

    def __init__(self, storage: RunStorage, *, timeout: float = DEFAULT_TIMEOUT,
                 renew_interval: float | None = None, before_exit: Callable[[], Any] | None = None) -> None:
        self.storage = storage
        self.before_exit = before_exit
        self.timeout = check_timeout(timeout)
        self.renew_interval = renew_interval or min(MAX_RENEW_INTERVAL, self.timeout / RENEWALS_PER_TIMEOUT)
        self.info: LeaseInfo | None = None  # ours, while held
        self.lost: str | None = None  # why we no longer hold it, once taken over
        self.given_back = False  # released by `release`: `fence` refuses until it is taken again
        self._version: Any = None  # what the storage last held from us
        self._taken_by: LeaseInfo | None = None  # another holder's lease seen in our place
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.announced: str | None = None  # the token of a lease whose takeover was said already

    def __repr__(self) -> str:
        return f"Lease({self.storage.url!r}, held={self.held})"

    @property
    def held(self) -> bool:
        return self.info is not None

    def acquire(self, *, takeover: bool = False) -> None:
        """Take the lease, or renew it if already held; raises LeaseHeldError naming the holder.

        A lease held by this same process (an earlier fit), by a process that no longer runs
        on this machine, or not renewed for its timeout is taken over (with a warning for the
        last two); any other lease only with ``takeover=True``, except a fresh one of another
        machine: that one is watched until it is renewed (LeaseHeldError then) or goes stale
        (taken over then), with one line on stderr saying so (see the module docstring).
        """
        with self._lock:
            if self.held:
                self.renew()
                return
            # A take that fails leaves nothing held and nothing given back: what is written next
            # is a one-off write forced past the holder (`RunWriter.writing(force=True)`), unfenced.
            self.lost, self._taken_by, self.given_back = None, None, False
            now = lease_info.wall_clock()
            info = LeaseInfo(token=uuid.uuid4().hex, host=this_machine.HOST, pid=os.getpid(), started=now,
                             renewed=now, timeout=self.timeout, renew_interval=self.renew_interval,
                             process_start=this_machine.own_process_start(), boot_id=this_machine.BOOT_ID)
            data = info.to_json()
            for _ in range(ACQUIRE_TRIES):
                version = self.storage.run_files.create_run_file(LEASE_NAME, data)
                if version is None:
                    found = self.storage.run_files.read_run_file(LEASE_NAME)
                    if found is None:
                        continue  # released in between: create again
                    blob, current = found
                    if blob == data:  # our create landed, and its retry saw it
                        version = current
                    else:
                        current = may_take(self.storage, LeaseInfo.from_json(blob), current, takeover,
                                           self.announced)
                        if current is None:
                            continue  # released, renewed by a new holder or torn while we watched: look again
                        version = self.storage.run_files.replace_run_file(LEASE_NAME, data, current)
                        if version is None:
                            version = self._landed(data)
                if version is not None:
                    self.info, self._version = info, version
                    _held.add(self)
                    _register_exit_hook()
                    logger.info("resumable: took the writer lease of %s", self.storage.url)
                    return
            raise LeaseHeldError(
                f"{self._url}: other processes keep changing the writer lease; make sure only one "
                "process trains into this run folder, then try again"
            )

    def renew(self) -> None:
        """Write a fresh renewal time, only if the lease is still ours; LeaseLostError if not."""
        with self._lock:
            self.check()
            if self.info is None:
                raise LeaseLostError(f"{self._url}: this process holds no writer lease; take it first")
            info = dataclasses.replace(self.info, renewed=lease_info.wall_clock())
            data = info.to_json()
            version = self.storage.run_files.replace_run_file(LEASE_NAME, data, self._version)
            if version is None:
                version = self._landed(data)
            if version is None:
                ours = self._still_ours()  # an earlier renewal landed, or tore the file, but raised
                if ours is not None:
                    version = self.storage.run_files.replace_run_file(LEASE_NAME, data, ours)
                    if version is None:
                        version = self._landed(data)
            if version is None:
                self._lose()
            self.info, self._version = info, version

    def check(self) -> None:
        """Raise LeaseLostError if a renewal found the lease taken over. Costs nothing."""
        if self.lost is not None:
            raise LeaseLostError(self.lost)

    def fence(self) -> None:
        """Read the lease afresh right before a write that must be ours alone (a manifest, a delete).

        The renewal thread notices a takeover only every ``renew_interval``; a writer frozen
        (a suspended VM, a long upload) past its timeout must not commit or delete in between.
        LeaseLostError once another process holds the run, and once this one gave the lease
        back (`release`): nothing is written into a run another process may hold by now
        without taking the lease again (`RunWriter` does, for a commit retried once fit ended).
        A no-op while no lease was taken: a one-off write forced past a live writer
        (`RunWriter.writing(force=True)`).
        """
        with self._lock:
            self.check()
            if self.info is None:
                if self.given_back:
                    raise LeaseLostError(f"{self.storage.url}: this process gave its writer lease back; "
                                         "it writes nothing more to this run folder until it takes it again")
                return
            if self._still_ours() is None:
                self._lose()

    def release(self) -> None:
        """Stop renewing and delete the lease, only if it is still ours. Never raises."""
        self.stop_renewing()
        with self._lock:
            if self.info is None:
                return
            version, self._version = self._version, None
            self.given_back = True
            _held.discard(self)
            try:
                deleted = self.storage.run_files.delete_run_file(LEASE_NAME, version)
                if not deleted:
                    ours = self._still_ours()
                    deleted = ours is not None and self.storage.run_files.delete_run_file(LEASE_NAME, ours)
                self.info = None
                if deleted:
                    logger.info("resumable: released the writer lease of %s", self.storage.url)
                else:
                    logger.info("resumable: the writer lease of %s was no longer ours; left as it is",
                                self.storage.url)
            except ResumableError as e:  # it goes stale by itself
                self.info = None
                logger.warning("resumable: could not release the writer lease of %s: %s", self.storage.url, e)

    def start_renewing(self) -> None:
        """Renew every ``renew_interval`` seconds from a daemon thread, until `release`.

        A thread, not batch ends: one batch, one validation pass or one save of a big model can
        take longer than the timeout, and the main thread may be blocked; the lease must stay
        fresh as long as this process lives. A renewal that fails on the storage is retried at
        the next tick (the lease only goes stale after ten failures in a row).
        """
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._renew_loop, name="resumable-lease", daemon=True)
            self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # ------------------------------------------------------------------ helpers

    @property
    def _url(self) -> str:
        return f"{self.storage.url}/{LEASE_NAME}"

    def _landed(self, data: bytes) -> Any | None:
        """After a failed swap: did our write land anyway (a retry after a lost reply)?"""
        found = self.storage.run_files.read_run_file(LEASE_NAME)
        self._note_taker(found)
        return found[1] if found is not None and found[0] == data else None

    def _still_ours(self) -> Any | None:
        """The stored version when the lease still has our token, or is torn (by a write of ours
        that failed half-way where writes are not atomic: a contender would take it over too)."""
        found = self.storage.run_files.read_run_file(LEASE_NAME)
        self._note_taker(found)
        if found is None or self.info is None:
            return None
        current = LeaseInfo.from_json(found[0])
        return found[1] if current is None or current.token == self.info.token else None

    def _note_taker(self, found: tuple[bytes, Any] | None) -> None:
        """Remember a lease of another holder seen in our place: the lost writer's message names it
        even if that holder has released it again by the time the message is written."""
        current = LeaseInfo.from_json(found[0]) if found is not None else None
        if current is not None and self.info is not None and current.token != self.info.token:
            self._taken_by = current

    def _lose(self) -> None:
        found = read_lease(self.storage)
        taker = found if found is not None and (self.info is None or found.token != self.info.token) \
            else self._taken_by
        if taker is not None:
            who = f"taken over by {taker.describe()}"
        else:
            who = "lease.json was deleted or made unreadable, by another process or by hand"
        self.lost = (f"{self.storage.url}: this process lost its writer lease ({who}); it stops writing to "
                     "this run folder. Another process took the run over: continue there, or call "
                     "resumable.resume(..., takeover=True) to take it back")
        self.info, self._version = None, None
        _held.discard(self)
        self._stop.set()
        raise LeaseLostError(self.lost)

    def _renew_loop(self) -> None:
        pause, failed = self.renew_interval, 0  # failed: renewals failed in a row (an outage)
        while not self._stop.wait(pause):
            pause = self.renew_interval
            try:
                self.renew()
            except LeaseLostError as e:  # training raises it at its next batch end or save: said once, there
                logger.info("resumable: %s", e)
                return
            except Exception as e:  # noqa: BLE001 - a storage hiccup: try again soon, before it goes stale
                pause, failed = self.renew_interval / 2, failed + 1
                # an outage is one event: its first failure warns, the retries during it are logged
                say = logger.warning if failed == 1 else logger.info
                say("resumable: could not renew the writer lease of %s (next try in %.0f s): %s",
                    self.storage.url, pause, e)
                continue
            if failed:
                logger.info("resumable: renewed the writer lease of %s again, after %d failed tries",
                            self.storage.url, failed)
                failed = 0


def check_timeout(timeout: Any, argument: str = "lease_timeout",
                  why: str = "another process may take the run over once the lease has not been renewed "
                  "for that long") -> float:
    """Seconds (a number or a ``datetime.timedelta``), positive and finite; ValueError otherwise
    (``why`` says what the number is for)."""
    seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) \
            and seconds > 0:
        return float(seconds)
    raise ValueError(
        f"Invalid value for argument `{argument}`. Received: {argument}={timeout!r}. Expected a positive "
        f"number of seconds or a datetime.timedelta, e.g. 600: {why}."
    )


# ---------------------------------------------------------------------- interpreter exit

_held: set[Lease] = set()  # strong: a held lease is released at exit even if nothing else keeps it
_hook_registered = False
# A process forked while holding a lease (a PyDataset's multiprocessing workers) holds none: its
# exit (which runs threading's exit hooks) must not release the lease of the process it came from.
os.register_at_fork(after_in_child=_held.clear)


def _register_exit_hook() -> None:
    """Run at exit while threads still work: before concurrent.futures shuts its executors down
    (then gcsfs can no longer open a connection: DNS lookups go through one), which happens
    before atexit hooks run. A lease's ``before_exit`` lands the last uploads first."""
    global _hook_registered
    if not _hook_registered:
        _hook_registered = True
        register = getattr(threading, "_register_atexit", None)
        try:
            (register or atexit.register)(_release_at_exit)
        except RuntimeError:  # already shutting down
            atexit.register(_release_at_exit)


def _release_at_exit() -> None:
    for lease in list(_held):
        try:
            if lease.before_exit is not None:
                lease.before_exit()
        except Exception as e:  # noqa: BLE001 - exiting anyway; release the lease all the same
            print(f"resumable: {e}", file=sys.stderr)
        try:
            lease.release()
        except Exception as e:  # noqa: BLE001 - exiting anyway; the lease goes stale by itself
            print(f"resumable: could not release the writer lease of {lease.storage.url}: {e}",
                  file=sys.stderr)


__all__ = ["DEFAULT_TIMEOUT", "LEASE_FORMAT", "LEASE_NAME", "MAX_WAIT", "MIN_WATCH", "TORN_GRACE", "Lease",
           "LeaseInfo", "check_holder", "check_timeout", "read_lease"]
