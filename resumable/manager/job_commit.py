"""`JobCommit`: one checkpoint written by every process of a multi-host job, committed once.

When a model's variables are split across hosts (Keras' ``ModelParallel`` over the devices of
several processes), no process holds the whole model, so each process writes and uploads the
files of the parts it holds. The checkpoint is still committed once, by the one manifest,
written last, listing every file's size and CRC32C (the protocol of `resumable.storage.commit`,
its steps taken apart). The processes exchange small messages through a `JobChannel` (on the
Keras side, JAX's distributed key-value store), and every wait is bounded by ``timeout``:

1. process 0 renews its writer lease, clears an interrupted commit of the same name, and says
   **ready**, with its lease's token;
2. every process checks that ``lease.json`` still names that holder (the job's fence: a job
   taken over writes nothing more), uploads its files and reports their sizes and CRC32Cs
   (**part**), or the error that stopped it;
3. process 0 waits for every part, then writes the manifest (fenced by its lease) and says
   **committed**, with the manifest, or why it did not commit.

At the start of each fit, process 0 takes the writer lease and every process learns whether it
could (`start`): a job whose process 0 may not write stops on every process, in one line.
Every process learns the outcome of each commit: all keep the same `last_checkpoint` and raise the same
error; only process 0 applies retention (`RunManager`). A process that died is noticed when a
wait runs out: BarrierTimeoutError names the processes waited for, the checkpoint stays
uncommitted (its manifest is only written once every part is in, so a half-written one is
never listed) and the one before it stays the newest. Every process commits the same
checkpoints in the same order: in such a job no save is skipped, and one that failed is dropped
on every process, never tried again (`RunManager`). A round is named by its checkpoint, so that
processes that ever disagreed would time out, never commit one's files under another name.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from resumable.core.display import printable
from resumable.core.errors import (
    BarrierTimeoutError,
    CheckpointExistsError,
    LeaseHeldError,
    LeaseLostError,
    ResumableError,
)
from resumable.core.manifest import FileEntry, Manifest, is_safe_relative
from resumable.storage import CheckpointInfo, RunStorage
from resumable.storage.lease import check_holder
from resumable.storage.records import committed_info

logger = logging.getLogger("resumable")

DEFAULT_BARRIER_TIMEOUT = 600.0  # seconds one process waits for the others at a save or a resume
# What stops process 0 from writing at a fit's start, raised as the same kind on the other processes.
_START_ERRORS: dict[str, type[ResumableError]] = {
    error.__name__: error for error in (LeaseHeldError, LeaseLostError, CheckpointExistsError)}
_CRC32C = re.compile("[0-9a-f]{8}")


class JobChannel(Protocol):
    """Small messages between the processes of one job, by key; each key is written once."""

    @property
    def process_index(self) -> int: ...

    @property
    def process_count(self) -> int: ...

    def put(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key`` for every process."""

    def get(self, key: str, timeout: float) -> str | None:
        """The value under ``key`` once published; None when ``timeout`` seconds pass first."""

    def delete(self, key: str) -> None:
        """Forget ``key`` (no process reads it again)."""


class JobCommit:
    """Commit checkpoints whose files every process of a job writes (see the module docstring).

    Args:
        storage: The run folder.
        channel: The job's messages.
        timeout: Seconds a process waits for another at each step.
        prepare: Process 0's step 1 for a checkpoint name (renew the lease, clear leftovers;
            raises to refuse the commit).
        token: Process 0's writer lease token, or None when it holds none.
    """

    def __init__(self, storage: RunStorage, channel: JobChannel, *, timeout: float = DEFAULT_BARRIER_TIMEOUT,
                 prepare: Callable[[str], None] = lambda name: None,
                 token: Callable[[], str | None] = lambda: None) -> None:
        self.storage = storage
        self.channel = channel
        self.timeout = timeout
        self._prepare = prepare
        self._token = token
        self._attempts: dict[str, int] = {}  # commits of each name so far: every process counts alike
        self._previous: str | None = None  # the last round committed, dropped after the next one
        self._unwritten: dict[Path, BaseException] = {}  # staged folders whose files could not be written
        self._starts = 0  # fits started so far: every process counts alike

    def __repr__(self) -> str:
        return (f"JobCommit({self.storage.url!r}, process {self.channel.process_index} of "
                f"{self.channel.process_count})")

    @property
    def chief(self) -> bool:
        """Process 0: it prepares, writes the manifest and applies retention."""
        return self.channel.process_index == 0

    def start(self, begin: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """At the start of each fit: process 0 runs ``begin()`` (takes the writer lease, checks the
        run folder); every process gets what it returned, or raises what stopped it, so that no
        process trains on alone into a run folder its job may not write.

        ``begin``'s result must be JSON; on the other processes ``begin`` is not called.
        """
        self._starts += 1
        key = f"start/{self._starts}"
        if self.chief:
            try:
                said = begin()
            except BaseException as e:
                self._put(key, {"error": _said(e), "kind": type(e).__name__})
                raise
            self._put(key, {"said": said})
            return said
        message = self._wait(key, "process 0 to start writing to the run folder")
        if "error" in message:
            error = _START_ERRORS.get(str(message.get("kind")), ResumableError)
            raise error(f"process 0 could not start writing: {message['error']}")  # it names the folder
        answer = message.get("said")
        return dict(answer) if isinstance(answer, dict) else {}

    def write_part(self, staging: Path, write: Callable[[], dict[str, FileEntry]]) -> None:
        """``write()`` this process's files into ``staging``, its error kept for `commit`: a process
        that cannot write its files (a full disk) still takes part in the round, and every process
        fails it alike."""
        self._unwritten.pop(Path(staging), None)
        try:
            write()
        except Exception as e:  # said in the round: one process skipping it would stall the others
            self._unwritten[Path(staging)] = e

    def commit(self, staging: Path, name: str, manifest: Manifest, *, progress: bool = False,
               between_chunks: Callable[[], None] | None = None) -> CheckpointInfo:
        """Upload this process's files of ``name`` from ``staging``; the committed checkpoint's info.

        Called by every process for the same checkpoints in the same order. Raises what
        stopped the commit, on every process: BarrierTimeoutError when a process did not
        answer in time, LeaseLostError when the run was taken over, the error a process met.
        """
        # A round is named by the checkpoint and the how-many-th commit of that name it is: were
        # the processes ever to disagree on which checkpoint comes next, a round would time out,
        # never commit one process's files under another checkpoint's name.
        self._attempts[name] = self._attempts.get(name, 0) + 1
        key = f"commit/{name}/{self._attempts[name]}"
        if self.chief:
            return self._lead(key, staging, name, manifest, progress, between_chunks)
        return self._follow(key, staging, name, progress, between_chunks)

    # ------------------------------------------------------------------ process 0

    def _lead(self, key: str, staging: Path, name: str, manifest: Manifest, progress: bool,
              between_chunks: Callable[[], None] | None) -> CheckpointInfo:
        try:
            self._raise_unwritten(staging)
            self._prepare(name)
            token = self._token()
        except BaseException as e:
            self._put(f"{key}/ready", {"error": _said(e), "lost": isinstance(e, LeaseLostError)})
            raise
        self._put(f"{key}/ready", {"token": token})
        try:
            files = dict(self.storage.committer.upload(staging, name, progress=progress,
                                                  between_chunks=between_chunks))
            for index, part in self._parts(key, name):
                shared = sorted(set(part) & set(files))
                if shared:
                    raise ResumableError(f"{self.storage.url}/{name}: process {index} wrote {shared[0]}, "
                                         "which another process wrote too; not committed")
                files.update(part)
            info = self.storage.committer.finish(name, replace(manifest, files=files))
        except BaseException as e:
            self._put(f"{key}/committed", {"error": _said(e), "lost": isinstance(e, LeaseLostError)})
            raise
        assert info.manifest is not None
        self._put(f"{key}/committed", {"manifest": info.manifest.to_dict()})
        if self._previous is not None:  # every process has read it: they all sent this round's part
            self._forget(self._previous)
        self._previous = key
        return info

    def _parts(self, key: str, name: str) -> list[tuple[int, dict[str, FileEntry]]]:
        """Every other process's files of this round, waited for together (one deadline)."""
        others = range(1, self.channel.process_count)
        answers = gather(self.channel, [f"{key}/part/{i}" for i in others], self.timeout,
                         what=f"the processes' parts of {name}", processes=list(others))
        parts = []
        for index, raw in zip(others, answers, strict=True):
            message = _message(raw, f"process {index}'s part of {name}")
            if "error" in message:
                error = LeaseLostError if message.get("lost") else ResumableError
                raise error(f"{self.storage.url}/{name} not committed: process {index}: {message['error']}")
            parts.append((index, _entries(message.get("files"), f"process {index}'s part of {name}")))
        return parts

    def _forget(self, key: str) -> None:
        """Drop a finished round's messages: a long run must not grow the store without end."""
        for suffix in ("ready", "committed", *(f"part/{i}" for i in range(1, self.channel.process_count))):
            try:
                self.channel.delete(f"{key}/{suffix}")
            except Exception as e:  # noqa: BLE001 - only memory; the next round goes on
                logger.debug("resumable: could not drop %s/%s: %s", key, suffix, e)

    # ------------------------------------------------------------------ the other processes

    def _follow(self, key: str, staging: Path, name: str, progress: bool,
                between_chunks: Callable[[], None] | None) -> CheckpointInfo:
        index = self.channel.process_index
        ready = self._wait(f"{key}/ready", f"process 0 to start committing {name}")
        self._raise_if_error(ready, name)
        try:
            self._raise_unwritten(staging)
            if ready.get("token"):
                check_holder(self.storage, str(ready["token"]))
            files = self.storage.committer.upload(staging, name, progress=progress,
                                                  between_chunks=between_chunks)
        except BaseException as e:
            self._put(f"{key}/part/{index}", {"error": _said(e), "lost": isinstance(e, LeaseLostError)})
            raise
        self._put(f"{key}/part/{index}", {"files": {rel: [e.size, e.crc32c] for rel, e in files.items()}})
        outcome = self._wait(f"{key}/committed", f"process 0 to commit {name}")
        self._raise_if_error(outcome, name)
        url = f"{self.storage.url}/{name}"
        return committed_info(name, url, Manifest.from_dict(outcome.get("manifest"), url))

    def _raise_unwritten(self, staging: Path) -> None:
        """The error that kept this process from writing ``staging``: a retried round fails again,
        never uploads half the files."""
        error = self._unwritten.get(Path(staging))
        if error is not None:
            raise error

    def _raise_if_error(self, message: dict[str, Any], name: str) -> None:
        if "error" in message:
            error = LeaseLostError if message.get("lost") else ResumableError
            raise error(f"{self.storage.url}/{name} not committed: process 0: {message['error']}")

    # ------------------------------------------------------------------ messages

    def _put(self, key: str, message: dict[str, Any]) -> None:
        self.channel.put(key, json.dumps(message))

    def _wait(self, key: str, what: str) -> dict[str, Any]:
        raw = gather(self.channel, [key], self.timeout, what=what, processes=[0])[0]
        return _message(raw, what)


def gather(channel: JobChannel, keys: Sequence[str], timeout: float, *, what: str,
           processes: Sequence[int]) -> list[str]:
    """The values of ``keys`` (published by ``processes``, in that order), within one deadline.

    BarrierTimeoutError naming every process still missing when ``timeout`` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    values: list[str | None] = []
    for key in keys:
        values.append(channel.get(key, max(0.0, deadline - time.monotonic())))
    missing = [p for p, value in zip(processes, values, strict=True) if value is None]
    if missing:
        who = "process" if len(missing) == 1 else "processes"
        raise BarrierTimeoutError(
            f"waited {timeout:g} s for {what}: no word from {who} {', '.join(map(str, missing))} "
            f"of {channel.process_count}; a process of this job has stopped or hangs (its own output "
            "says why); every process must run until the end of training")
    return [value for value in values if value is not None]


def all_gather(channel: JobChannel, key: str, value: str, timeout: float, *, what: str) -> list[str]:
    """Every process's ``value`` for ``key``, in process order; a collective over the channel."""
    channel.put(f"{key}/{channel.process_index}", value)
    count = channel.process_count
    return gather(channel, [f"{key}/{i}" for i in range(count)], timeout, what=what, processes=range(count))


def _message(raw: str, what: str) -> dict[str, Any]:
    try:
        message = json.loads(raw)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise ResumableError(f"{what}: not a message of resumable's ({printable(raw[:60])!r})")
    return message


def _entries(files: Any, what: str) -> dict[str, FileEntry]:
    """A part's files as `FileEntry`s, each checked as a manifest's entries are when read back."""
    if not isinstance(files, dict):
        raise ResumableError(f"{what}: lists no files")
    entries = {}
    for rel, entry in files.items():
        if not (is_safe_relative(rel) and isinstance(entry, list) and len(entry) == 2
                and type(entry[0]) is int and entry[0] >= 0
                and isinstance(entry[1], str) and _CRC32C.fullmatch(entry[1])):
            raise ResumableError(f"{what}: {printable(repr(rel)[:60])} is not a file entry of resumable's")
        entries[rel] = FileEntry(entry[0], entry[1])
    return entries


def _said(error: BaseException) -> str:
    """An error as one line for the other processes."""
    text = str(error) or type(error).__name__
    return printable(text.splitlines()[0] if text.splitlines() else text)


__all__ = ["DEFAULT_BARRIER_TIMEOUT", "JobChannel", "JobCommit", "all_gather", "gather"]
