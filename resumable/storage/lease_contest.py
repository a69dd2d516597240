"""A contender for the writer lease facing one already there: take it over, watch it, or refuse.

`may_take` decides (see `resumable.storage.lease` for why): a lease of this very process, of a
process gone from this machine, a stale one, or any with ``takeover=True`` is taken over; a
live one of this machine is refused at once; a fresh one of another machine is watched until it
is renewed (refused) or stays unchanged for its timeout (taken over), one line on stderr saying
so. A lease.json not readable yet may be one being written: it is given `TORN_GRACE` first.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from resumable.core.errors import LeaseHeldError
from resumable.storage import RunStorage
from resumable.storage.lease_info import LEASE_NAME, MIN_WATCH, LeaseInfo, ago, show_moment
from resumable.storage.progress import WaitLine

logger = logging.getLogger("resumable")

MAX_WAIT = 120.0  # a contender waits for another machine's silent lease to go stale at most this long
TORN_GRACE = 10.0  # an unreadable lease.json this young (by its mtime) may still be being written
TORN_POLL = 0.2  # seconds between reads while one is watched


def may_take(storage: RunStorage, holder: LeaseInfo | None, version: Any, takeover: bool,
             announced: str | None = None) -> Any | None:
    """Decide whether the lease found (at ``version``) may be taken over; LeaseHeldError if not.

    Returns the version to replace, or None when the lease changed while another machine's
    was watched (`_watch`) and must be looked at again. ``announced``: the token of a lease
    whose takeover the user was told of already (`resume`'s line): logged, not warned again.
    """
    warn = logger.info if holder is not None and holder.token == announced else logger.warning
    if holder is None:
        if not takeover and not _torn_settled(storage, version):
            return None  # written meanwhile: look again
        logger.warning("resumable: %s is not a readable lease; taking it over", _url(storage))
    elif holder.mine():
        logger.info("resumable: taking over the writer lease an earlier fit of this process held")
    elif holder.process_gone():
        warn("resumable: taking over the writer lease of %s: that process no longer runs",
                       holder.describe())
    elif takeover:
        warn("resumable: takeover=True: taking over the writer lease of %s; that process "
                       "stops writing at its next save", holder.describe())
    else:
        server_age = storage.run_files.run_file_server_age(LEASE_NAME)
        if holder.stale(server_age=server_age):
            clock = "the storage's clock" if server_age is not None else "this machine's clock"
            warn("resumable: taking over the stale writer lease of %s (not renewed for %s by "
                           "%s; stale after %s)", holder.describe(),
                           ago(server_age if server_age is not None else holder.age()), clock,
                           ago(holder.timeout))
            return version
        if holder.on_this_machine() and holder.clock_is_ours():  # its process runs: no need to watch
            raise held_error(storage, holder)
        # Unchanged for its timeout, as this process watches it (what the storage's clock says
        # has passed already counted), and long enough to see a live writer renew.
        wait = max(holder.timeout - (server_age or 0.0), MIN_WATCH * holder.interval)
        if wait > MAX_WAIT:
            raise held_error(storage, holder)
        return _watch(storage, holder, version, wait)
    return version

def _torn_settled(storage: RunStorage, version: Any) -> bool:
    """Whether an unreadable lease.json (at ``version``) may be replaced: False when it changed.

    Where the mount has no hard links, `create_whole` creates the file, then writes it: a
    contender may read it empty or half-written for a moment, and must not take over a lease
    that is being taken. So one younger than `TORN_GRACE` (by its mtime; one dated in the
    future counts as just written) is watched until it is that old; GCS objects appear whole.
    """
    age = storage.run_files.run_file_age(LEASE_NAME)
    if age is None or age >= TORN_GRACE:
        return True
    deadline = time.monotonic() + TORN_GRACE - max(age, 0.0)
    logger.info("resumable: %s is not a readable lease yet; waiting up to %.0f s for it to be written",
                _url(storage), deadline - time.monotonic())
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(TORN_POLL, left))
        found = storage.run_files.read_run_file(LEASE_NAME)
        if found is None or found[1] != version:
            return False
    return True

def _watch(storage: RunStorage, holder: LeaseInfo, version: Any, wait: float) -> Any | None:
    """Watch another machine's lease for up to ``wait`` seconds, saying so on stderr.

    Renewed meanwhile: its writer is alive, LeaseHeldError. Still the same at the end: its
    writer is gone (a recycled Colab VM), the version to replace. Released or changed hands:
    None, to look again. Where writes may show late (a mount: Drive shows another machine's
    writes seconds later), the renewals seen may be a dead writer's last ones still arriving:
    each restarts the watch for the lease's timeout, and only renewals that go on for a whole
    timeout prove the writer alive (a delay shorter than the timeout has run out by then).
    """
    line = (f"resumable: waiting up to {wait:.0f} s for the writer lease of {storage.url} held by "
            f"{holder.describe()}: taken over if not renewed meanwhile")
    started = time.monotonic()
    poll = min(1.0, max(0.05, holder.interval / 4))
    began = started
    with WaitLine(line) as shown:
        while (left := wait - (time.monotonic() - started)) > 0:
            shown.left(left)
            time.sleep(min(poll, left))
            found = storage.run_files.read_run_file(LEASE_NAME)
            if found is None:
                return None
            if found[1] != version:
                now = LeaseInfo.from_json(found[0])
                if now is None or now.token != holder.token:
                    return None
                # GCS shows every write at once: one renewal proves life. A mount may be late.
                if storage.is_gcs or time.monotonic() - began >= holder.timeout:
                    shown.end("renewed, so its writer is alive")
                    raise held_error(storage, now)
                holder, version = now, found[1]  # gone once unchanged for its timeout from now
                started, wait = time.monotonic(), max(holder.timeout, MIN_WATCH * holder.interval)
        shown.end("not renewed, taking it over")
    logger.warning("resumable: taking over the writer lease of %s: unchanged for the %s watched (its "
                   "process is gone, e.g. with a recycled VM)", holder.describe(), ago(wait))
    return version

def held_error(storage: RunStorage, holder: LeaseInfo) -> LeaseHeldError:
    when = f", at {show_moment(holder.expires)}" if holder.clock_is_ours() else ""
    return LeaseHeldError(
        f"{storage.url} is being written by another process ({holder.describe()}; stale after "
        f"{ago(holder.timeout)} without renewal{when}): two writers would "
        "corrupt the run. Stop that process, wait until its lease is stale, or pass takeover=True "
        "to take the run over (the other process then stops at its next save)"
    )


def _url(storage: RunStorage) -> str:
    return f"{storage.url}/{LEASE_NAME}"


__all__ = ["MAX_WAIT", "TORN_GRACE", "may_take", "held_error"]
