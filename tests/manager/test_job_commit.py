"""JobCommit: a checkpoint every process of a multi-host job writes part of, committed once by
process 0. The processes are threads here, talking through an in-memory channel with the same
contract as the Keras side's (JAX's key-value store); tests/keras/test_multihost.py runs real
JAX processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from resumable import RunStorage
from resumable.core.checksum import crc32c_of_file
from resumable.core.errors import (
    BarrierTimeoutError,
    CheckpointExistsError,
    LeaseHeldError,
    LeaseLostError,
    ResumableError,
)
from resumable.core.manifest import MANIFEST_NAME, Manifest
from resumable.core.policy import Retention
from resumable.manager.job_commit import JobCommit, all_gather
from resumable.manager.run_manager import RunManager
from resumable.storage import CheckpointInfo
from resumable.storage.lease import Lease


class Channel:
    """`JobChannel` for processes that are threads: a shared dict under a condition."""

    def __init__(self, shared: dict[str, str], cond: threading.Condition, index: int, count: int) -> None:
        self.shared, self.cond = shared, cond
        self.process_index, self.process_count = index, count

    def put(self, key: str, value: str) -> None:
        with self.cond:
            self.shared[key] = value
            self.cond.notify_all()

    def get(self, key: str, timeout: float) -> str | None:
        with self.cond:
            self.cond.wait_for(lambda: key in self.shared, timeout)
            return self.shared.get(key)

    def delete(self, key: str) -> None:
        with self.cond:
            self.shared.pop(key, None)


def channels(count: int) -> list[Channel]:
    shared: dict[str, str] = {}
    cond = threading.Condition()
    return [Channel(shared, cond, i, count) for i in range(count)]


def part(folder: Path, index: int, size: int = 1000) -> Path:
    """Process ``index``'s files of a checkpoint: its own chunk, and process 0's listing."""
    (folder / "variables" / "0").mkdir(parents=True, exist_ok=True)
    (folder / "variables" / "0" / f"0.{index}").write_bytes(bytes([index + 1]) * size)
    if index == 0:
        (folder / "variables.json").write_text('{"variables": []}')
    return folder


def in_threads(work: list[Callable[[], Any]]) -> list[Any]:
    """Run each in a thread of its own; each one's result or the exception it raised."""
    results: list[Any] = [None] * len(work)

    def run(i: int) -> None:
        try:
            results[i] = work[i]()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def jobs(url: str, count: int, timeout: float = 10.0, **kwargs: Any) -> list[JobCommit]:
    storage = RunStorage(url)
    prepare = kwargs.pop("prepare", storage.committer.prepare)
    return [JobCommit(RunStorage(url), channel, timeout=timeout, prepare=prepare, **kwargs)
            for channel in channels(count)]


def test_every_process_uploads_its_part_and_process_0_commits_one_manifest(run_url: str,
                                                                           tmp_path: Path) -> None:
    committers = jobs(run_url, 3)
    staged = [part(tmp_path / f"p{i}", i) for i in range(3)]
    infos = in_threads([lambda i=i: committers[i].commit(staged[i], "ckpt-000001", Manifest(epoch=1, step=5))
                        for i in range(3)])
    assert all(isinstance(info, CheckpointInfo) for info in infos), infos
    storage = RunStorage(run_url)
    (listed,) = storage.list()
    assert listed.ok and listed.epoch == 1 and listed.step == 5
    assert listed.manifest is not None
    expected = {"variables.json", "variables/0/0.0", "variables/0/0.1", "variables/0/0.2"}
    assert set(listed.manifest.files) == expected
    for i in range(3):  # each process's own file, checksummed by that process
        entry = listed.manifest.files[f"variables/0/0.{i}"]
        assert (entry.size, entry.crc32c) == (1000, crc32c_of_file(staged[i] / "variables" / "0" / f"0.{i}"))
    assert storage.verify(listed) == []
    # every process learns the same commit
    assert {info.manifest.to_json() for info in infos} == {listed.manifest.to_json()}


def test_a_process_that_never_answers_times_out_in_one_line_and_nothing_is_committed(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    committers = jobs(url, 3, timeout=0.5)
    started = time.monotonic()
    results = in_threads([lambda i=i: committers[i].commit(part(tmp_path / f"p{i}", i), "ckpt-000001",
                                                           Manifest(epoch=1))
                          for i in range(2)])  # process 2 never comes
    assert time.monotonic() - started < 10
    chief, follower = results
    assert isinstance(chief, BarrierTimeoutError)
    assert "no word from process 2 of 3" in str(chief) and "\n" not in str(chief)
    assert isinstance(follower, ResumableError) and "process 0" in str(follower)
    assert not (tmp_path / "run" / "ckpt-000001" / MANIFEST_NAME).exists()
    assert [c.status.value for c in RunStorage(url).list()] == ["partial"]


def test_a_follower_that_fails_fails_the_commit_on_every_process(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    committers = jobs(url, 3)
    staged = [part(tmp_path / "p0", 0), tmp_path / "missing", part(tmp_path / "p2", 2)]
    results = in_threads([lambda i=i: committers[i].commit(staged[i], "ckpt-000001", Manifest(epoch=1))
                          for i in range(3)])
    assert isinstance(results[1], ResumableError) and "no such folder" in str(results[1])
    for i in (0, 2):
        assert isinstance(results[i], ResumableError), results[i]
        assert "not committed" in str(results[i]) and "no such folder" in str(results[i])
    assert "process 1" in str(results[0])
    assert not RunStorage(url).list() or not any(c.ok for c in RunStorage(url).list())


def test_process_0_refusing_stops_every_process_before_it_uploads(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    storage = RunStorage(url)
    storage.commit(part(tmp_path / "old", 0), "ckpt-000001", Manifest(epoch=1))
    committers = jobs(url, 2)
    results = in_threads([lambda i=i: committers[i].commit(part(tmp_path / f"p{i}", i), "ckpt-000001",
                                                           Manifest(epoch=1))
                          for i in range(2)])
    assert isinstance(results[0], CheckpointExistsError)
    assert isinstance(results[1], ResumableError) and "already committed" in str(results[1])
    assert not (tmp_path / "run" / "ckpt-000001" / "variables" / "0" / "0.1").exists()  # never uploaded
    assert storage.verify(storage.get("ckpt-000001")) == []


def test_a_job_taken_over_writes_nothing_more(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    lease = Lease(RunStorage(url))
    lease.acquire()
    token = lease.info.token if lease.info is not None else None
    Lease(RunStorage(url)).acquire(takeover=True)  # another job takes the run folder
    committers = jobs(url, 2, token=lambda: token, prepare=lambda name: None)
    results = in_threads([lambda i=i: committers[i].commit(part(tmp_path / f"p{i}", i), "ckpt-000001",
                                                           Manifest(epoch=1))
                          for i in range(2)])
    assert isinstance(results[1], LeaseLostError) and "taken over" in str(results[1])
    assert isinstance(results[0], LeaseLostError) and "process 1" in str(results[0])
    assert not (tmp_path / "run" / "ckpt-000001" / "variables" / "0" / "0.1").exists()
    assert not (tmp_path / "run" / "ckpt-000001" / MANIFEST_NAME).exists()


def test_a_file_reported_by_two_processes_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    group = channels(2)
    chief = JobCommit(RunStorage(url), group[0], timeout=10, prepare=RunStorage(url).committer.prepare)

    def process_1() -> None:  # reports process 0's listing as its own (two processes wrote one file)
        assert group[1].get("commit/ckpt-000001/1/ready", 10) is not None
        clash = {"files": {"variables.json": [17, "0badf00d"]}}
        group[1].put("commit/ckpt-000001/1/part/1", json.dumps(clash))

    results = in_threads([lambda: chief.commit(part(tmp_path / "p0", 0), "ckpt-000001", Manifest(epoch=1)),
                          process_1])
    assert isinstance(results[0], ResumableError)
    assert "process 1 wrote variables.json, which another process wrote too; not committed" in str(results[0])
    assert not (tmp_path / "run" / "ckpt-000001" / MANIFEST_NAME).exists()
    answer = json.loads(group[1].get("commit/ckpt-000001/1/committed", 1) or "{}")
    assert "which another process wrote too" in answer["error"]  # process 1 learns it too


def test_a_part_that_could_not_be_written_fails_the_round_and_its_retry(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    committers = jobs(url, 2)
    staged = [tmp_path / "p0", tmp_path / "p1"]

    def broken(folder: Path, root: str | None) -> None:
        part(folder, 1, size=10)  # half written, then the disk is full
        raise OSError(28, "No space left on device")

    committers[0].write_part(staged[0], lambda: part(staged[0], 0))  # as the uploader's job writes
    committers[1].write_part(staged[1], lambda: broken(staged[1], None))  # its part: never raises
    for _ in range(2):  # the round, then its retry: never half the files
        results = in_threads([lambda i=i: committers[i].commit(staged[i], "ckpt-000001", Manifest(epoch=1))
                              for i in range(2)])
        assert isinstance(results[1], OSError) and "No space" in str(results[1])
        assert isinstance(results[0], ResumableError) and "process 1: [Errno 28] No space" in str(results[0])
        assert not (tmp_path / "run" / "ckpt-000001" / MANIFEST_NAME).exists()


def test_finished_rounds_are_forgotten(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    group = channels(2)
    committers = [JobCommit(RunStorage(url), c, timeout=10, prepare=RunStorage(url).committer.prepare)
                  for c in group]
    for epoch in (1, 2, 3):
        name = f"ckpt-{epoch:06d}"
        in_threads([lambda i=i, n=name, e=epoch: committers[i].commit(part(tmp_path / f"p{i}-{n}", i), n,
                                                                       Manifest(epoch=e)) for i in range(2)])
    assert {key.split("/")[1] for key in group[0].shared} == {"ckpt-000003"}  # rounds 1 and 2 dropped
    assert [c.name for c in RunStorage(url).list() if c.ok] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]


def test_all_gather_returns_every_value_in_process_order_or_names_the_missing() -> None:
    group = channels(3)
    values = in_threads([lambda c=c: all_gather(c, "k", f"v{c.process_index}", 5, what="a test")
                         for c in group])
    assert values == [["v0", "v1", "v2"]] * 3
    group = channels(3)
    values = in_threads([lambda c=c: all_gather(c, "k", "v", 0.3, what="every process to fetch x")
                         for c in group[:2]])
    assert all(isinstance(v, BarrierTimeoutError) for v in values)
    assert "every process to fetch x: no word from process 2 of 3" in str(values[0])


def test_run_manager_commits_in_order_and_only_process_0_applies_retention(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    group = channels(2)
    managers = [RunManager(url, staging_dir=tmp_path / f"s{i}", retention=Retention(keep_last=1),
                           process_index=i) for i in range(2)]
    reported: list[list[str]] = [[], []]
    for i, manager in enumerate(managers):
        manager.writer.every_process_writes(group[i], timeout=10)
        manager.listener = SimpleNamespace(committed=lambda info, i=i: reported[i].append(info.name),
                                           skipped=print)
        assert manager.writer.uploader.when_behind == "wait"  # no process skips one the others commit
        assert not manager.writes_in_place  # a local run, yet each process's part is staged, then uploaded
    managers[0].writer.acquire()

    def train(i: int) -> None:
        for epoch in (1, 2, 3):
            name = f"ckpt-{epoch:06d}"
            folder = managers[i].writer.stage(name)
            managers[i].writer.submit(folder, name, Manifest(epoch=epoch),
                               files=SimpleNamespace(write=lambda f, root, i=i: part(f, i)))
        managers[i].wait()

    results = in_threads([lambda i=i: train(i) for i in range(2)])
    managers[0].release()
    assert results == [None, None]
    assert [c.name for c in RunStorage(url).list() if c.ok] == ["ckpt-000003"]
    assert reported == [["ckpt-000001", "ckpt-000002", "ckpt-000003"], []]  # lines said once, by process 0
    assert [m.last_checkpoint.name for m in managers if m.last_checkpoint] == ["ckpt-000003"] * 2
    stored = json.loads((tmp_path / "run" / "ckpt-000003" / MANIFEST_NAME).read_text())
    assert set(stored["files"]) == {"variables.json", "variables/0/0.0", "variables/0/0.1"}


def test_a_failed_round_is_dropped_on_every_process_never_retried(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    group = channels(2)
    managers = [RunManager(url, staging_dir=tmp_path / f"s{i}", process_index=i) for i in range(2)]
    for i, manager in enumerate(managers):
        manager.writer.every_process_writes(group[i], timeout=10)
    managers[0].writer.acquire()

    def write(folder: Path, i: int, epoch: int) -> None:
        if i == 1 and epoch in (1, 3):  # process 1 cannot write its part of epochs 1 and 3
            raise OSError(5, "Input/output error")
        part(folder, i)

    def train(i: int) -> list[str]:
        errors = []
        for epoch in (1, 2, 3):
            name = f"ckpt-{epoch:06d}"
            folder = managers[i].writer.stage(name)
            managers[i].writer.submit(folder, name, Manifest(epoch=epoch),
                               files=SimpleNamespace(write=lambda f, root, i=i, e=epoch: write(f, i, e)))
            try:
                managers[i].wait()
            except ResumableError as e:
                errors.append(str(e))
            except OSError as e:
                errors.append(str(e))
        return errors

    with pytest.warns(UserWarning, match="it is not tried again"):
        results = in_threads([lambda i=i: train(i) for i in range(2)])
    managers[0].release()
    assert all(isinstance(r, list) for r in results), results
    for errors in results:  # each process is told of epochs 1 and 3, once each
        assert len(errors) == 2 and all("Input/output error" in e for e in errors), errors
    assert [m.writer.uploader.committed for m in managers] == [["ckpt-000002"]] * 2  # none retried or skipped
    assert [c.name for c in RunStorage(url).list() if c.ok] == ["ckpt-000002"]



def test_a_fit_starts_on_every_process_only_once_process_0_took_the_run_folder(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    other = subprocess.Popen(  # another job's process 0 writes into the run folder
        [sys.executable, "-c", "import sys, time; from resumable import RunStorage; "
         "from resumable.storage.lease import Lease; Lease(RunStorage(sys.argv[1])).acquire(); "
         "print('held', flush=True); time.sleep(60)", url], stdout=subprocess.PIPE, text=True)
    assert other.stdout is not None and other.stdout.readline().strip() == "held"
    committers = jobs(url, 3)

    def begin() -> dict[str, Any]:
        Lease(RunStorage(url)).acquire()
        return {"epochs_done": 4}

    def never() -> dict[str, Any]:
        raise AssertionError("only process 0 takes the run folder")

    started = time.monotonic()
    results = in_threads([lambda: committers[0].start(begin), lambda: committers[1].start(never),
                          lambda: committers[2].start(never)])
    assert time.monotonic() - started < 5  # at once, never after barrier_timeout
    assert isinstance(results[0], LeaseHeldError)
    for result in results[1:]:  # the same kind of error, in one line naming the holder
        assert isinstance(result, LeaseHeldError), result
        assert str(result).startswith("process 0 could not start writing: ")
        assert str(result).endswith(str(results[0]).splitlines()[0]) and "\n" not in str(result)
    other.kill()
    other.wait()
    # the next fit: process 0 takes it, and every process gets what it said
    assert in_threads([lambda: committers[0].start(begin), lambda: committers[1].start(never),
                       lambda: committers[2].start(never)]) == [{"epochs_done": 4}] * 3
