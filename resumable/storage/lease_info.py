"""What ``lease.json`` says about its holder (`LeaseInfo`), read by writers and readers alike.

`LeaseInfo.from_json` refuses anything that is not a lease (too large, not strict JSON, a
field of the wrong type or size); the judgements a contender and a reader make of a holder
(`stale`, `process_gone`, `mine`, `blocks`) trust only clocks that can be trusted (see
`resumable.storage.lease`). `read_lease` and `check_holder` read the file without a lease.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
from typing import Any

from resumable.core import safe_json
from resumable.core.errors import LeaseLostError
from resumable.storage import RunStorage, this_machine

LEASE_NAME = "lease.json"
LEASE_FORMAT = "resumable.lease"
DEFAULT_TIMEOUT = 40.0  # seconds without renewal after which a lease is stale: 3 missed renewals
RENEWALS_PER_TIMEOUT = 4  # the holder renews every timeout / 4 seconds by default ...
MAX_RENEW_INTERVAL = 60.0  # ... and at least this often
OLD_RENEWALS_PER_TIMEOUT = 10  # leases that do not record their interval renewed every timeout / 10 s (<= 60)
MIN_WATCH = 1.5  # a contender watches a lease at least this many of its renewal intervals (a live one renews)
CLOCK_TOLERANCE = 5.0  # seconds a renewal by this machine may lie "ahead" (its clock stepped back meanwhile)


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
        return max(0.0, ((now or wall_clock()) - self.renewed).total_seconds())

    def clock_is_ours(self, now: dt.datetime | None = None) -> bool:
        """Renewed on this machine, at a time that is not in our future: its age can be trusted."""
        ahead = (self.renewed - (now or wall_clock())).total_seconds()
        return self.on_this_machine() and ahead <= CLOCK_TOLERANCE

    @property
    def interval(self) -> float:
        """Seconds between the holder's renewals: as recorded, else as older versions renewed."""
        return self.renew_interval or min(MAX_RENEW_INTERVAL, self.timeout / OLD_RENEWALS_PER_TIMEOUT)

    def stale(self, now: dt.datetime | None = None, server_age: float | None = None) -> bool:
        """Not renewed for its timeout (its holder is gone, frozen or cut off from the storage), by a
        clock that can be trusted: the storage's (``server_age``: seconds since the lease was
        last written, `RunFiles.run_file_server_age`) or ours, for a lease of this machine.
        Another machine's renewal time alone never makes a lease stale: it is watched instead."""
        if server_age is not None and server_age > self.timeout:
            return True
        return self.clock_is_ours(now) and self.age(now) > self.timeout

    def on_this_machine(self) -> bool:
        """Held from this host name since its last boot: whether its process runs can be asked."""
        return self.host == this_machine.HOST and not (
            self.boot_id and this_machine.BOOT_ID and self.boot_id != this_machine.BOOT_ID)

    def process_gone(self) -> bool:
        """True only when the holder ran on this machine and its process no longer exists."""
        if not self.on_this_machine():
            return False
        start = this_machine.process_start(self.pid)
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
        return self.host == this_machine.HOST and self.pid == os.getpid() and (
            self.process_start is None or self.process_start == this_machine.own_process_start()
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

    def left_behind(self, server_age: float | None = None) -> str | None:
        """Why a writer takes this lease over without asking, in a few words ("of a process that
        is gone", "not renewed for 5 min"); None when it is this process' own or blocks."""
        if self.mine():
            return None
        if self.process_gone():
            return "of a process that is gone"
        if self.stale(server_age=server_age):
            return f"not renewed for {ago(server_age if server_age is not None else self.age())}"
        return None

    def describe(self, now: dt.datetime | None = None) -> str:
        """``host 'a', process 12, since 2026-11-22 06:10:03 UTC, renewed 35 s ago``."""
        return (f"host {self.host!r}, process {self.pid}, since {show_moment(self.started)}, "
                f"renewed {ago(self.age(now))} ago")


def read_lease(storage: RunStorage) -> LeaseInfo | None:
    """The run folder's lease, or None when nobody holds one (or it is unreadable). For readers."""
    found = storage.run_files.read_run_file(LEASE_NAME)
    return LeaseInfo.from_json(found[0]) if found else None


def check_holder(storage: RunStorage, token: str) -> None:
    """The fence of a process writing for the holder of lease ``token`` (another process of the
    same multi-host job): LeaseLostError unless ``lease.json`` still names that holder."""
    holder = read_lease(storage)
    if holder is None or holder.token != token:
        who = f"now held by {holder.describe()}" if holder else "it was removed"
        raise LeaseLostError(f"{storage.url}: the writer lease of this job's process 0 was taken over "
                             f"({who}); this process stops writing to this run folder")


def wall_clock() -> dt.datetime:
    """The wall clock, as lease.json stores it (UTC, to the millisecond). Tests that play a
    machine whose clock is off change it here; everything reads it from this module."""
    moment = dt.datetime.now(dt.timezone.utc)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


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


def show_moment(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = ["DEFAULT_TIMEOUT", "LEASE_FORMAT", "LEASE_NAME", "LeaseInfo", "ago", "check_holder", "read_lease",
           "show_moment", "wall_clock"]
