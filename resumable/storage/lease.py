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
being written, and is waited for, never taken over (`Lease._torn_settled`). Readers (list,
inspect, verify, resume's loading) need no lease.

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
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from resumable.core import safe_json
from resumable.core.errors import LeaseHeldError, LeaseLostError, ResumableError
from resumable.storage import RunStorage
from resumable.storage.progress import WaitLine

logger = logging.getLogger("resumable")

LEASE_NAME = "lease.json"
LEASE_FORMAT = "resumable.lease"
DEFAULT_TIMEOUT = 40.0  # seconds without renewal after which a lease is stale: 3 missed renewals
RENEWALS_PER_TIMEOUT = 4  # the holder renews every timeout / 4 seconds by default ...
MAX_RENEW_INTERVAL = 60.0  # ... and at least this often
OLD_RENEWALS_PER_TIMEOUT = 10  # leases that do not record their interval renewed every timeout / 10 s (<= 60)
MAX_WAIT = 120.0  # a contender waits for another machine's silent lease to go stale at most this long
MIN_WATCH = 1.5  # and watches it for at least this many of its renewal intervals (a live one renews)
CLOCK_TOLERANCE = 5.0  # seconds a renewal by this machine may lie "ahead" (its clock stepped back meanwhile)
ACQUIRE_TRIES = 5  # contenders racing on the file: each lost race re-reads it
TORN_GRACE = 10.0  # an unreadable lease.json this young (by its mtime) may still be being written
TORN_POLL = 0.2  # seconds between reads while one is watched


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    """What ``lease.json`` says about its holder."""

    token: str  # unique per acquisition: tells this holder's writes from any other's
    host: str
    pid: int
    started: dt.datetime  # when the lease was taken (UTC)
    renewed: dt.datetime  # last renewal (UTC), by the holder's clock
    timeout: float  # the holder's own lease_timeout: stale after this long without renewal
    process_start: int | None = None  # /proc start time of the process: tells a reused pid
    boot_id: str | None = None  # /proc boot id: the same host name after a reboot is another machine
    renew_interval: float | None = None  # the holder's seconds between renewals; None: an older version's

    def to_json(self) -> bytes:
        return json.dumps({
            "format": LEASE_FORMAT, "token": self.token, "host": self.host, "pid": self.pid,
            "started": _iso(self.started), "renewed": _iso(self.renewed), "timeout": self.timeout,
            "process_start": self.process_start, "boot_id": self.boot_id,
            "renew_interval": self.renew_interval,
        }, indent=1).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> LeaseInfo | None:
        """The lease, or None when the bytes are not a lease (a torn write, a stray file, a
        hand-edited or hostile one: too large, not strict JSON, a field of the wrong type)."""
        try:
            raw = safe_json.loads(blob, safe_json.LEASE_LIMIT)
            if type(raw) is not dict or raw.get("format") != LEASE_FORMAT:
                return None
            timeout = _lease_number(raw["timeout"])
            info = cls(
                token=_lease_text(raw["token"]), host=_lease_text(raw["host"]), pid=_lease_pid(raw["pid"]),
                started=_parse_iso(raw["started"]), renewed=_parse_iso(raw["renewed"]),
                timeout=timeout if timeout > 0 else DEFAULT_TIMEOUT,
                process_start=_optional_int(raw.get("process_start")),
                boot_id=_lease_text(raw["boot_id"]) if raw.get("boot_id") else None,
                renew_interval=_positive_or_none(raw.get("renew_interval")),
            )
            info.expires  # noqa: B018 - a renewal time or timeout no datetime holds (OverflowError)
            return info
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            return None

    @property
    def expires(self) -> dt.datetime:
        return self.renewed + dt.timedelta(seconds=self.timeout)

    def age(self, now: dt.datetime | None = None) -> float:
        """Seconds since the last renewal by the holder's clock read on ours (0 when ahead of
        ours): shown in messages; trusted only where `clock_is_ours`."""
        return max(0.0, ((now or _now()) - self.renewed).total_seconds())

    def clock_is_ours(self, now: dt.datetime | None = None) -> bool:
        """Renewed on this machine, at a time that is not in our future: its age can be trusted."""
        ahead = (self.renewed - (now or _now())).total_seconds()
        return self.on_this_machine() and ahead <= CLOCK_TOLERANCE

    @property
    def interval(self) -> float:
        """Seconds between the holder's renewals: as recorded, else as older versions renewed."""
        return self.renew_interval or min(MAX_RENEW_INTERVAL, self.timeout / OLD_RENEWALS_PER_TIMEOUT)

    def stale(self, now: dt.datetime | None = None, server_age: float | None = None) -> bool:
        """Not renewed for its timeout (its holder is gone, frozen or cut off from the storage), by a
        clock that can be trusted: the storage's (``server_age``: seconds since the lease was
        last written, `RunStorage.run_file_server_age`) or ours, for a lease of this machine.
        Another machine's renewal time alone never makes a lease stale: it is watched instead."""
        if server_age is not None and server_age > self.timeout:
            return True
        return self.clock_is_ours(now) and self.age(now) > self.timeout

    def on_this_machine(self) -> bool:
        """Held from this host name since its last boot: whether its process runs can be asked."""
        return self.host == _HOST and not (self.boot_id and _BOOT_ID and self.boot_id != _BOOT_ID)

    def process_gone(self) -> bool:
        """True only when the holder ran on this machine and its process no longer exists."""
        if not self.on_this_machine():
            return False
        start = _process_start(self.pid)
        if start == -1:  # no such process, or a zombie
            return True
        if start is not None and self.process_start is not None:
            return start != self.process_start  # the pid was reused by another process
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # alive, owned by someone else
            return False
        return False

    def mine(self) -> bool:
        """Held by this very process (an earlier fit or an earlier `resume()` in this kernel)."""
        return self.host == _HOST and self.pid == os.getpid() and (
            self.process_start is None or self.process_start == _own_process_start()
        )

    def blocks(self, server_age: float | None = None) -> bool:
        """Would stop a writer without ``takeover=True``: fresh, held by another process that still runs.

        Advice only (a warning at `resume`, `prune`'s refusal): a writer decides by `Lease.acquire`.
        Another machine's process is taken as running while it renews on time (within
        `MIN_WATCH` renewal intervals, by the storage's clock where it tells, else by the
        lease's own renewal time); a lease silent for longer is most likely its dead writer's,
        which a writer waits for and takes over.
        """
        if self.mine() or self.process_gone() or self.stale(server_age=server_age):
            return False
        silent = server_age if server_age is not None else self.age()
        return self.on_this_machine() or silent <= MIN_WATCH * self.interval

    def describe(self, now: dt.datetime | None = None) -> str:
        """``host 'a', process 12, since 2026-11-22 06:10:03 UTC, renewed 35 s ago``."""
        return (f"host {self.host!r}, process {self.pid}, since {_show(self.started)}, "
                f"renewed {_ago(self.age(now))} ago")


def read_lease(storage: RunStorage) -> LeaseInfo | None:
    """The run folder's lease, or None when nobody holds one (or it is unreadable). For readers."""
    found = storage.read_run_file(LEASE_NAME)
    return LeaseInfo.from_json(found[0]) if found else None


def check_holder(storage: RunStorage, token: str) -> None:
    """The fence of a process writing for the holder of lease ``token`` (another process of the
    same multi-host job): LeaseLostError unless ``lease.json`` still names that holder."""
    holder = read_lease(storage)
    if holder is None or holder.token != token:
        who = f"now held by {holder.describe()}" if holder else "it was removed"
        raise LeaseLostError(f"{storage.url}: the writer lease of this job's process 0 was taken over "
                             f"({who}); this process stops writing to this run folder")


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
        self._version: Any = None  # what the storage last held from us
        self._taken_by: LeaseInfo | None = None  # another holder's lease seen in our place
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            self.lost, self._taken_by = None, None
            now = _now()
            info = LeaseInfo(token=uuid.uuid4().hex, host=_HOST, pid=os.getpid(), started=now, renewed=now,
                             timeout=self.timeout, process_start=_own_process_start(), boot_id=_BOOT_ID,
                             renew_interval=self.renew_interval)
            data = info.to_json()
            for _ in range(ACQUIRE_TRIES):
                version = self.storage.create_run_file(LEASE_NAME, data)
                if version is None:
                    found = self.storage.read_run_file(LEASE_NAME)
                    if found is None:
                        continue  # released in between: create again
                    blob, current = found
                    if blob == data:  # our create landed, and its retry saw it
                        version = current
                    else:
                        current = self._may_take(LeaseInfo.from_json(blob), current, takeover)
                        if current is None:
                            continue  # released, renewed by a new holder or torn while we watched: look again
                        version = self.storage.replace_run_file(LEASE_NAME, data, current)
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
            info = dataclasses.replace(self.info, renewed=_now())
            data = info.to_json()
            version = self.storage.replace_run_file(LEASE_NAME, data, self._version)
            if version is None:
                version = self._landed(data)
            if version is None:
                ours = self._still_ours()  # an earlier renewal landed, or tore the file, but raised
                if ours is not None:
                    version = self.storage.replace_run_file(LEASE_NAME, data, ours)
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
        LeaseLostError once another process holds the run. A no-op while no lease is held:
        a one-off write forced past a live writer (`RunManager.writing(force=True)`).
        """
        with self._lock:
            self.check()
            if self.info is None:
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
            _held.discard(self)
            try:
                deleted = self.storage.delete_run_file(LEASE_NAME, version)
                if not deleted:
                    ours = self._still_ours()
                    deleted = ours is not None and self.storage.delete_run_file(LEASE_NAME, ours)
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

    def _may_take(self, holder: LeaseInfo | None, version: Any, takeover: bool) -> Any | None:
        """Decide whether the lease found (at ``version``) may be taken over; LeaseHeldError if not.

        Returns the version to replace, or None when the lease changed while another machine's
        was watched (`_watch`) and must be looked at again.
        """
        if holder is None:
            if not takeover and not self._torn_settled(version):
                return None  # written meanwhile: look again
            logger.warning("resumable: %s is not a readable lease; taking it over", self._url)
        elif holder.mine():
            logger.info("resumable: taking over the writer lease an earlier fit of this process held")
        elif holder.process_gone():
            logger.warning("resumable: taking over the writer lease of %s: that process no longer runs",
                           holder.describe())
        elif takeover:
            logger.warning("resumable: takeover=True: taking over the writer lease of %s; that process "
                           "stops writing at its next save", holder.describe())
        else:
            server_age = self.storage.run_file_server_age(LEASE_NAME)
            if holder.stale(server_age=server_age):
                clock = "the storage's clock" if server_age is not None else "this machine's clock"
                logger.warning("resumable: taking over the stale writer lease of %s (not renewed for %s by "
                               "%s; stale after %s)", holder.describe(),
                               _ago(server_age if server_age is not None else holder.age()), clock,
                               _ago(holder.timeout))
                return version
            if holder.on_this_machine() and holder.clock_is_ours():  # its process runs: no need to watch
                raise self._held(holder)
            # Unchanged for its timeout, as this process watches it (what the storage's clock says
            # has passed already counted), and long enough to see a live writer renew.
            wait = max(holder.timeout - (server_age or 0.0), MIN_WATCH * holder.interval)
            if wait > MAX_WAIT:
                raise self._held(holder)
            return self._watch(holder, version, wait)
        return version

    def _torn_settled(self, version: Any) -> bool:
        """Whether an unreadable lease.json (at ``version``) may be replaced: False when it changed.

        Where the mount has no hard links, `create_whole` creates the file, then writes it: a
        contender may read it empty or half-written for a moment, and must not take over a lease
        that is being taken. So one younger than `TORN_GRACE` (by its mtime; one dated in the
        future counts as just written) is watched until it is that old; GCS objects appear whole.
        """
        age = self.storage.run_file_age(LEASE_NAME)
        if age is None or age >= TORN_GRACE:
            return True
        deadline = time.monotonic() + TORN_GRACE - max(age, 0.0)
        logger.info("resumable: %s is not a readable lease yet; waiting up to %.0f s for it to be written",
                    self._url, deadline - time.monotonic())
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(TORN_POLL, left))
            found = self.storage.read_run_file(LEASE_NAME)
            if found is None or found[1] != version:
                return False
        return True

    def _watch(self, holder: LeaseInfo, version: Any, wait: float) -> Any | None:
        """Watch another machine's lease for up to ``wait`` seconds, saying so on stderr.

        Renewed meanwhile: its writer is alive, LeaseHeldError. Still the same at the end: its
        writer is gone (a recycled Colab VM), the version to replace. Released or changed hands:
        None, to look again. Where writes may show late (a mount: Drive shows another machine's
        writes seconds later), the renewals seen may be a dead writer's last ones still arriving:
        each restarts the watch for the lease's timeout, and only renewals that go on for a whole
        timeout prove the writer alive (a delay shorter than the timeout has run out by then).
        """
        line = (f"resumable: waiting up to {wait:.0f} s for the writer lease of {self.storage.url} held by "
                f"{holder.describe()}: taken over if not renewed meanwhile")
        started = time.monotonic()
        poll = min(1.0, max(0.05, holder.interval / 4))
        began = started
        with WaitLine(line) as shown:
            while (left := wait - (time.monotonic() - started)) > 0:
                shown.left(left)
                time.sleep(min(poll, left))
                found = self.storage.read_run_file(LEASE_NAME)
                if found is None:
                    return None
                if found[1] != version:
                    now = LeaseInfo.from_json(found[0])
                    if now is None or now.token != holder.token:
                        return None
                    # GCS shows every write at once: one renewal proves life. A mount may be late.
                    if self.storage.is_gcs or time.monotonic() - began >= holder.timeout:
                        shown.end("renewed, so its writer is alive")
                        raise self._held(now)
                    holder, version = now, found[1]  # gone once unchanged for its timeout from now
                    started, wait = time.monotonic(), max(holder.timeout, MIN_WATCH * holder.interval)
            shown.end("not renewed, taking it over")
        logger.warning("resumable: taking over the writer lease of %s: unchanged for the %s watched (its "
                       "process is gone, e.g. with a recycled VM)", holder.describe(), _ago(wait))
        return version

    def _held(self, holder: LeaseInfo) -> LeaseHeldError:
        when = f", at {_show(holder.expires)}" if holder.clock_is_ours() else ""
        return LeaseHeldError(
            f"{self.storage.url} is being written by another process ({holder.describe()}; stale after "
            f"{_ago(holder.timeout)} without renewal{when}): two writers would "
            "corrupt the run. Stop that process, wait until its lease is stale, or pass takeover=True "
            "to take the run over (the other process then stops at its next save)"
        )

    def _landed(self, data: bytes) -> Any | None:
        """After a failed swap: did our write land anyway (a retry after a lost reply)?"""
        found = self.storage.read_run_file(LEASE_NAME)
        self._note_taker(found)
        return found[1] if found is not None and found[0] == data else None

    def _still_ours(self) -> Any | None:
        """The stored version when the lease still has our token, or is torn (by a write of ours
        that failed half-way where writes are not atomic: a contender would take it over too)."""
        found = self.storage.read_run_file(LEASE_NAME)
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
        pause = self.renew_interval
        while not self._stop.wait(pause):
            pause = self.renew_interval
            try:
                self.renew()
            except LeaseLostError as e:  # training raises it at its next batch end or save: said once, there
                logger.info("resumable: %s", e)
                return
            except Exception as e:  # noqa: BLE001 - a storage hiccup: try again soon, before it goes stale
                pause = self.renew_interval / 2
                logger.warning("resumable: could not renew the writer lease of %s (next try in %.0f s): %s",
                               self.storage.url, pause, e)


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


# ---------------------------------------------------------------------- this process and machine


def _process_start(pid: int) -> int | None:
    """The process' start time in clock ticks since boot; -1 if it is gone or a zombie; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return -1 if os.path.isdir("/proc/self") else None
    except (OSError, IndexError):
        return None
    try:
        return -1 if fields[0] == b"Z" else int(fields[19])  # state, then starttime (field 22)
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


_HOST = socket.gethostname()
_BOOT_ID = _boot_id()
_own_start: tuple[int, int | None] = (-1, None)


def _own_process_start() -> int | None:
    """This process' start time, per pid: a process forked after import has its own."""
    global _own_start
    pid = os.getpid()
    if _own_start[0] != pid:
        start = _process_start(pid)
        _own_start = (pid, None if start == -1 else start)
    return _own_start[1]


def _now() -> dt.datetime:
    now = dt.datetime.now(dt.timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)  # as lease.json stores it


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds")


def _parse_iso(text: Any) -> dt.datetime:
    moment = dt.datetime.fromisoformat(_lease_text(text).replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _optional_int(value: Any) -> int | None:
    return value if type(value) is int and abs(value) <= MAX_LEASE_INT else None


# Checks of lease.json's fields (`LeaseInfo.from_json`): each raises TypeError or ValueError.

MAX_LEASE_INT = 2**63 - 1  # process ids and start times are far smaller


def _lease_text(value: Any) -> str:
    if type(value) is not str or len(value) > 1024:
        raise TypeError("a lease field must be a short string")
    return value


def _lease_pid(value: Any) -> int:
    if type(value) is not int or not 0 < value < 2**31:  # os.kill() takes nothing else
        raise ValueError("a lease's pid must be a positive integer")
    return value


def _lease_number(value: Any) -> float:
    """A finite number (strict JSON holds no NaN or infinity; 1e400 is refused while parsing)."""
    if type(value) not in (int, float) or not math.isfinite(value):
        raise TypeError("a lease's timeout must be a number")
    return float(value)


def _positive_or_none(value: Any) -> float | None:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        return None  # absent in leases of older versions
    return float(value)


def _show(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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


__all__ = ["DEFAULT_TIMEOUT", "LEASE_NAME", "Lease", "LeaseInfo", "check_holder", "check_timeout",
           "read_lease"]
