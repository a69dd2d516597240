"""A model split across the processes of a multi-host JAX job (ModelParallel over every process's
devices) saves and resumes, each process writing and reading its own part.

The processes are real: tests/jobs/model_parallel_job.py forked N times from the JAX job
server (tests/forked.py), on 127.0.0.1, each with its own XLA CPU devices, ``jax.distributed``
between them and collectives over gloo. Each process writes its shards' arrays (TensorStore),
process 0 commits the one manifest after every process reported its files; on resume each
process reads only the parts its devices need, under whatever layout and number of processes
the new session has.
"""

from __future__ import annotations

import importlib.util
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from forked import WatchedJob, job_env
from paths import JOBS

from resumable import CheckpointCallback, ResumableError, RunStorage
from resumable.cli.app import main as cli
from resumable.manager.run_manager import default_staging_dir

needs_jax = pytest.mark.skipif(importlib.util.find_spec("tensorstore") is None or
                               importlib.util.find_spec("jax") is None,
                               reason="needs jax and tensorstore (orbax-checkpoint's)")
JOB = JOBS / "model_parallel_job.py"
STEPS_PER_EPOCH = 12  # 384 samples, batch 32


# ----------------------------------------------------------------------------- in this process


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "10", True])
def test_a_bad_barrier_timeout_is_refused_in_one_line(tmp_path: Path, timeout: Any) -> None:
    with pytest.raises(ValueError, match=r"Invalid value for argument `barrier_timeout`\. Received: "
                                         r"barrier_timeout=.*waits for the others at a save\.$"):
        CheckpointCallback(str(tmp_path / "run"), barrier_timeout=timeout)
    assert not (tmp_path / "run").exists()


def test_a_split_model_refuses_trainable_only_and_a_missing_tensorstore_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from resumable.keras.multihost import shard_io, split_job

    # Stands in for a model split across the processes of a job (tests below run real ones).
    monkeypatch.setattr(split_job, "split_across_processes", lambda model: True)
    callback = CheckpointCallback(str(tmp_path / "run"), save_trainable_only=True)
    with pytest.raises(ValueError, match=r"^Invalid value for argument `save_trainable_only`\. Received: "
                                         r"save_trainable_only=True for a model split across processes\. "
                                         r"Expected False: each process saves the parts it holds\.$"):
        callback.fit_lease.every_process_writes(callback.model)
    assert callback.manager.job is None
    monkeypatch.setattr(shard_io.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ResumableError, match="^resumable: a model split across processes is saved with "
                                             "TensorStore, which is not installed: pip install tensorstore"):
        CheckpointCallback(str(tmp_path / "run")).fit_lease.every_process_writes(None)
    assert not (tmp_path / "run").exists()


def test_chunk_files_name_the_chunks_each_part_overlaps() -> None:
    from resumable.keras.multihost.shard_io import chunk_files

    matrix = {"shape": [8, 12], "chunks": [8, 3], "dimension_separator": "."}
    assert chunk_files(matrix, [(slice(None), slice(0, 3))]) == {"0.0"}
    assert chunk_files(matrix, [(slice(None), slice(3, 9))]) == {"0.1", "0.2"}
    assert chunk_files(matrix, [(slice(0, 4), slice(2, 4))]) == {"0.0", "0.1"}  # another layout's part
    assert chunk_files(matrix, [(slice(None), slice(None))]) == {"0.0", "0.1", "0.2", "0.3"}
    assert chunk_files({"shape": [], "chunks": []}, [()]) == {"0"}  # a scalar
    assert chunk_files({"shape": [0, 4], "chunks": [1, 4]}, [(slice(None), slice(None))]) == set()
    slashes = {"shape": [6], "chunks": [4], "dimension_separator": "/"}
    assert chunk_files(slashes, [(slice(3, 6),)]) == {"0", "1"}
    # metadata no checkpoint of that many files can hold is refused before any name is made
    with pytest.raises(ValueError, match="more files than the checkpoint's 100"):
        chunk_files({"shape": [2**40], "chunks": [1]}, [(slice(None),)], limit=100)


def test_shards_written_and_read_back_and_a_missing_chunk_is_an_error_never_zeros(tmp_path: Path) -> None:
    pytest.importorskip("tensorstore")
    jax = pytest.importorskip("jax")
    from resumable.keras.multihost import shard_io

    value = jax.numpy.arange(24, dtype="float32").reshape(4, 6)
    owned = shard_io.take(value, process_index=0)
    assert owned.shards and owned.nbytes == 96 and owned.chunks == (4, 6)
    shard_io.write(tmp_path / "v", owned, create=True)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    back = shard_io.read(tmp_path / "v", sharding, (4, 6), np.float32)
    assert np.array_equal(np.asarray(back), np.asarray(value))
    # process 1 of a job never writes an array every process holds whole: process 0 does
    assert shard_io.take(value, process_index=1).shards == []
    (tmp_path / "v" / "0.0").unlink()
    with pytest.raises(ValueError, match="missing"):
        shard_io.read(tmp_path / "v", sharding, (4, 6), np.float32)
    with pytest.raises(ValueError, match="shape"):
        shard_io.read(tmp_path / "v", sharding, (4, 7), np.float32)


# ----------------------------------------------------------------------------- several processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(url: str | Path, processes: int, epochs: int, folder: Path, tag: str, *extra: str,
          host_devices: int = 2, per_process: dict[int, list[str]] | None = None) -> list[WatchedJob]:
    coordinator = f"127.0.0.1:{free_port()}"
    return [WatchedJob(JOB, [str(url), "--epochs", str(epochs), "--processes", str(processes),
                             "--process-id", str(i), "--coordinator", coordinator,
                             "--host-devices", str(host_devices), "--out", str(folder / f"{tag}-p{i}.npz"),
                             "--restored-out", str(folder / f"{tag}-r{i}.npz"),
                             *extra, *(per_process or {}).get(i, [])],
                       job_env("jax"), folder / f"{tag}-p{i}.log")
            for i in range(processes)]


def finish(job: list[WatchedJob]) -> list[WatchedJob]:
    for i, process in enumerate(job):
        code = process.finish()
        assert code == 0, f"process {i} failed ({code}):\n{process.output}"
        assert "TENSORFLOW imported=False" in process.lines, process.output
    return job


def whole(paths: list[Path]) -> dict[int, np.ndarray]:
    """Every variable, put together from the shards the processes of a job wrote (``--out``)."""
    arrays: dict[int, np.ndarray] = {}
    for path in paths:
        with np.load(path) as data:
            for key in data.files:
                index, where, shape = key.split("|")
                dims = tuple(int(d) for d in shape.split("x")) if shape else ()
                array = arrays.setdefault(int(index), np.zeros(dims, dtype=data[key].dtype))
                part = tuple(slice(*map(int, w.split(":"))) for w in where.split(",")) if where else ()
                array[part] = data[key]
    return arrays


def assert_same_arrays(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> None:
    assert sorted(a) == sorted(b) and a
    for index in a:
        most = np.nanmax(abs(a[index] - b[index])) if a[index].size else 0
        assert np.array_equal(a[index], b[index]), f"variable {index} differs by up to {most}"


def outs(folder: Path, tag: str, processes: int, kind: str = "p") -> list[Path]:
    return [folder / f"{tag}-{kind}{i}.npz" for i in range(processes)]


def check_every_commit(url: str) -> None:
    """Every checkpoint with a manifest is whole: each file it lists is there, as it says."""
    storage = RunStorage(url)
    listed = storage.list()
    problems = [(c.name, c.problem) for c in listed]
    assert listed and all(c.status.value in ("ok", "partial") for c in listed), problems
    for checkpoint in listed:
        if checkpoint.ok:
            assert storage.verify(checkpoint) == [], checkpoint.name


TRAINING = ["--save-freq", "5", "--shuffle", "--heartbeat", "6"]
EPOCHS = 3


@pytest.mark.slow
@needs_jax
def test_split_model_resumes_exactly_after_sigkills_and_a_slow_process_fails_one_save_in_one_line(
        tmp_path: Path) -> None:
    # The run never killed. Process 1 is slow to upload its first part: process 0 waits
    # barrier_timeout (2 s) for it, says so in one line, that save is committed by no process,
    # and training goes on; the next saves commit.
    straight = finish(start(tmp_path / "straight", 2, EPOCHS, tmp_path, "straight", *TRAINING,
                            "--barrier-timeout", "2", per_process={1: ["--slow-first-part", "5"]}))
    chief_said = straight[0].log.read_text()
    assert "no word from process 1 of 2" in chief_said, straight[0].output
    assert "not committed: process 0: waited 2 s" in straight[1].log.read_text(), straight[1].output
    check_every_commit(str(tmp_path / "straight"))
    reference = whole(outs(tmp_path, "straight", 2))

    # Sessions killed at random moments: all processes at once, then process 0 alone (the one
    # that commits), then process 1 alone. When one dies, the others stop by themselves (JAX's
    # heartbeat, 6 s here; our own waits are bounded).
    rng = random.Random(36)
    url = tmp_path / "run"
    for attempt, victims in enumerate(["all", "process 0", "process 1"]):
        job = start(url, 2, EPOCHS, tmp_path, f"killed{attempt}", *TRAINING, "--batch-sleep", "0.1")
        job[0].wait_for("READY", timeout=120)
        for _ in range(rng.randint(1, 3)):
            job[0].wait_for("LOG resumable: saving", timeout=120)
        time.sleep(rng.uniform(0, 0.5))
        killed = job if victims == "all" else [job[int(victims.split()[1])]]
        for process in killed:
            process.kill()
        stopped = time.monotonic()
        for process in job:
            code = process.finish(timeout=90)
            assert code != 0, process.output  # killed, or stopped because a peer died
        print(f"killed {victims} after {attempt}: the others stopped in {time.monotonic() - stopped:.1f} s")
        assert time.monotonic() - stopped < 60, "a process kept waiting after another died"
        check_every_commit(str(url))

    final = finish(start(url, 2, EPOCHS, tmp_path, "final", *TRAINING))
    ready = [p.line("READY") for p in final]
    assert ready[0] == ready[1] and not ready[0].endswith("step=0"), ready
    assert final[0].line("RESUMED") == final[1].line("RESUMED")
    assert_same_arrays(whole(outs(tmp_path, "final", 2)), reference)
    check_every_commit(str(url))
    latest = RunStorage(str(url)).latest()
    assert latest is not None and latest.manifest is not None and latest.epoch == EPOCHS
    manifest = latest.manifest
    assert (manifest.processes, manifest.devices, manifest.payload) == (2, 4, "variables.json")
    assert latest.manifest.state["format"] == "split"


@pytest.mark.slow
@needs_jax
def test_backup_and_restore_of_a_split_model_restores_every_part_in_a_plain_fit(tmp_path: Path) -> None:
    # Keras' drop-in in a plain model.fit: each process backs up its part, and a later fit
    # restores them (every process the same backup) and continues where training stopped.
    finish(start(tmp_path / "straight", 2, 3, tmp_path, "straight", "--backup-and-restore"))
    url = tmp_path / "backup"
    first = finish(start(url, 2, 2, tmp_path, "first", "--backup-and-restore"))
    assert [line for line in first[0].lines if line.startswith("EPOCH")] == ["EPOCH 0", "EPOCH 1"]
    latest = RunStorage(str(url)).latest()
    assert latest is not None and latest.manifest is not None and latest.epoch == 2
    assert latest.manifest.payload == "variables.json" and latest.manifest.processes == 2
    second = finish(start(url, 2, 3, tmp_path, "second", "--backup-and-restore"))
    for process in second:  # restored at epoch 2: only the third epoch is trained
        assert [line for line in process.lines if line.startswith("EPOCH")] == ["EPOCH 2"], process.output
    assert_same_arrays(whole(outs(tmp_path, "second", 2)), whole(outs(tmp_path, "straight", 2)))
    check_every_commit(str(url))


@pytest.mark.slow
@needs_jax
def test_a_split_job_whose_run_folder_another_job_writes_stops_on_every_process_in_one_line(
        tmp_path: Path) -> None:
    url = tmp_path / "run"
    holder = subprocess.Popen(  # another job's process 0, alive, holds the writer lease
        [sys.executable, "-c", "import sys, time; from resumable import RunStorage; "
         "from resumable.storage.lease import Lease; Lease(RunStorage(sys.argv[1])).acquire(); "
         "print('held', flush=True); time.sleep(300)", str(url)],
        stdout=subprocess.PIPE, text=True, env=job_env("jax"))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        # JAX's heartbeat (60 s) would end process 1 too, later and in JAX's words: ours must come first
        job = start(url, 2, 1, tmp_path, "refused", "--heartbeat", "60")
        job[1].wait_for("READY", timeout=120)
        began = time.monotonic()
        codes = [process.finish(timeout=120) for process in job]
        assert time.monotonic() - began < 45
        said = [process.log.read_text() for process in job]
        assert codes[0] != 0 and codes[1] != 0, said
        assert f"LeaseHeldError: {RunStorage(str(url)).url} is being written by another process" in said[0]
        assert f"LeaseHeldError: process 0 could not start writing: {RunStorage(str(url)).url} is being " \
               "written by another process" in said[1]
        assert f"process {holder.pid}" in said[1].rsplit("process 0 could not start writing: ", 1)[1]
        assert RunStorage(str(url)).list() == []
    finally:
        holder.kill()
        holder.wait()


BIG = ["--hidden", "1024", "--width", "4096"]
ZARRAY_NAME = ".zarray"  # the split kernel: 16 MiB, the biggest variable


@pytest.mark.slow
@needs_jax
def test_split_model_reshards_onto_fewer_processes_another_mesh_and_one_each_reading_only_its_part(
        tmp_path: Path, gcs_bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{gcs_bucket}/runs/split"
    # 4 processes x 2 devices: the wide kernel (1024 x 4096) in 8 column shards, 2 per process.
    first = finish(start(url, 4, 1, tmp_path, "four", *BIG, "--measure"))
    split = dict(kv.split("=") for kv in first[0].line("SPLIT").split()[1:])
    largest, held = int(split["largest"]), int(split["held"])
    assert held * 4 == largest  # each process holds a quarter of it
    for process in first:  # a save holds this process's part, never a whole split variable
        save, snapshot = (int(kv.split("=")[1]) for kv in process.line("MEMORY save").split()[1:])
        assert snapshot < 0.25 * 3 * largest * 1.05, process.line("MEMORY save")  # kernel, its two Adam slots
        assert save < snapshot + largest / 2, process.line("MEMORY save")
    name = RunStorage(url).latest().name  # type: ignore[union-attr]
    written = [sorted(_files(default_staging_dir(RunStorage(url).url, i) / "committed" / name))
               for i in range(4)]
    kernel = [sorted(f for f in files if f.startswith("variables/2/") and not f.endswith(".zarray"))
              for files in written]
    assert [len(files) for files in kernel] == [2, 2, 2, 2]  # each wrote its own 2 of 8 chunk files
    assert not set(kernel[0]) & set(kernel[1])
    manifest = RunStorage(url).latest().manifest  # type: ignore[union-attr]
    assert manifest is not None and set(manifest.files) == set().union(*map(set, written))

    # 2 processes x 4 devices: the same 8 devices' worth of shards, 4 per process now.
    second = finish(start(url, 2, 2, tmp_path, "two", *BIG, host_devices=4))
    assert all(p.line("READY") == f"READY initial_epoch=1 step={STEPS_PER_EPOCH}" for p in second)
    assert_same_arrays(whole(outs(tmp_path, "two", 2, "r")), whole(outs(tmp_path, "four", 4)))
    for i, process in enumerate(second):
        restore = int(process.line("MEMORY restore").split("=")[1])
        assert restore < largest, process.line("MEMORY restore")  # never a whole split variable at once
        cached = _files(default_staging_dir(RunStorage(url).url, i) / "cache" / name)
        fetched = sorted(f for f in cached if f.startswith("variables/2/") and not f.endswith(".zarray"))
        assert len(fetched) == 4, fetched  # the 4 chunk files its devices need, not all 8
    later = RunStorage(url).latest()
    assert later is not None and later.epoch == 2 and later.manifest is not None
    assert later.manifest.processes == 2 and later.manifest.payload == "variables.json"

    # Another mesh shape: 2 processes x 2 devices as model (2) x batch (2): the kernel in halves,
    # one per process (over both its devices); each reads the 4 chunk files of its half.
    mesh = finish(start(url, 2, 3, tmp_path, "mesh", *BIG, "--model-axis", "2"))
    assert all(p.line("READY") == f"READY initial_epoch=2 step={2 * STEPS_PER_EPOCH}" for p in mesh)
    assert all(p.line("SPLIT").endswith(f"held={largest // 2}") for p in mesh)
    assert_same_arrays(whole(outs(tmp_path, "mesh", 2, "r")), whole(outs(tmp_path, "two", 2)))

    # 1 process x 4 devices (a mesh of 4): every part, read by one process; it saves Keras' format.
    one = finish(start(url, 1, 4, tmp_path, "one", *BIG, host_devices=4))
    assert one[0].line("READY") == f"READY initial_epoch=3 step={3 * STEPS_PER_EPOCH}"
    assert_same_arrays(whole(outs(tmp_path, "one", 1, "r")), whole(outs(tmp_path, "mesh", 2)))
    newest = RunStorage(url).latest()
    assert newest is not None and newest.manifest is not None and newest.manifest.payload == "model.keras"

    # And back onto 2 processes x 2 devices: the Keras-format checkpoint of that one process,
    # read whole by each process and split across them again; the next save is split again.
    again = finish(start(url, 2, 5, tmp_path, "again", *BIG))
    assert all(p.line("READY") == f"READY initial_epoch=4 step={4 * STEPS_PER_EPOCH}" for p in again)
    assert_same_arrays(whole(outs(tmp_path, "again", 2, "r")), whole(outs(tmp_path, "one", 1)))
    newest = RunStorage(url).latest()
    assert newest is not None and newest.manifest is not None and newest.manifest.payload == "variables.json"

    # The CLI lists and verifies checkpoints of either kind; a damaged chunk file is named.
    capsys.readouterr()
    assert cli(["verify", url]) == 0
    assert "all files match their manifests" in capsys.readouterr().out
    assert cli(["list", url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["status"] for c in listed["checkpoints"]] == ["ok"] * len(listed["checkpoints"])
    kinds = {c.name: c.manifest.payload for c in RunStorage(url).list() if c.manifest is not None}
    assert set(kinds.values()) == {"variables.json", "model.keras"}, kinds
    split_one = max(name for name, payload in kinds.items() if payload == "variables.json")
    assert cli(["inspect", url, "--name", split_one, "--json"]) == 0
    inspected = json.loads(capsys.readouterr().out)["manifest"]
    assert (inspected["processes"], inspected["devices"], inspected["state"]["format"]) == (2, 4, "split")
    assert f"variables/2/{ZARRAY_NAME}" in inspected["files"]
    import gcsfs

    gcs = gcsfs.GCSFileSystem(token="anon")
    chunk = f"{url}/{split_one}/variables/2/0.1"
    gcs.pipe_file(chunk.removeprefix("gs://"), b"\0" * 100)
    assert cli(["verify", url]) == 1
    assert f"{split_one}/variables/2/0.1: size 100 bytes" in capsys.readouterr().out

    # Retention (process 0's) deleted whole split checkpoints: no chunk file of any process is left
    folders = {path.rsplit("/", 1)[-1] for path in gcs.ls(url.removeprefix("gs://"), detail=False)
               if gcs.isdir(path)}
    assert folders == {c.name for c in RunStorage(url).list()}, folders
    assert len(folders) < 5  # 5 sessions saved one checkpoint each at least; keep_last=2, keep_best=1


def _files(folder: Path) -> list[str]:
    return [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
