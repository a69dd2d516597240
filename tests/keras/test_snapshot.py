"""Checkpoints taken as snapshots in memory and written later (resumable/keras/checkpoint/snapshot.py)."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from forked import job_env, run_job
from paths import JOBS

import resumable
from resumable.core.checksum import crc32c_of_file
from resumable.core.manifest import KERAS_PAYLOADS
from resumable.keras import compat
from resumable.keras.checkpoint import model_to_files, snapshot

JOB = JOBS / "snapshot_job.py"


def test_the_core_knows_the_keras_side_s_model_files() -> None:
    assert set(KERAS_PAYLOADS) == {snapshot.MODEL_FILE, snapshot.WEIGHTS_FILE}


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
@pytest.mark.parametrize("weights_only", [False, True])
def test_the_files_hold_the_step_the_snapshot_was_taken_at(tmp_path: Path, backend: str,
                                                          weights_only: bool) -> None:
    """On JAX the next training step donates the variables' buffers: the snapshot copied them."""
    argv = [str(tmp_path / "ckpt"), *(["--weights-only"] if weights_only else [])]
    done = run_job(JOB, argv, env=job_env(backend), cwd=JOBS)
    assert done.returncode == 0 and "EQUAL" in done.stdout, done.stdout + done.stderr[-2000:]


def make_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.lanes
def test_a_snapshot_writes_what_model_save_writes(tmp_path: Path) -> None:
    model = make_model()
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    model.fit(x, x[:, :1], epochs=1, verbose=0)
    model.save(tmp_path / "plain.keras")
    taken = model_to_files.snapshot(model, weights_only=False, state={})
    assert taken is not None and taken.nbytes > 0
    taken.write(tmp_path / "snap")
    ours = keras.saving.load_model(tmp_path / "snap" / "model.keras")
    theirs = keras.saving.load_model(tmp_path / "plain.keras")
    assert ours.get_config() == theirs.get_config()
    for a, b in zip(ours.weights + ours.optimizer.variables, theirs.weights + theirs.optimizer.variables,
                    strict=True):
        assert a.path == b.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_training_waits_only_for_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are written in the uploader's thread, never in the training thread."""
    writers: list[str] = []
    original = snapshot.ModelSnapshot.write

    def write(self: snapshot.ModelSnapshot, folder: Path, root: str | None = None) -> Any:
        writers.append(threading.current_thread().name)
        return original(self, folder, root)

    monkeypatch.setattr(snapshot.ModelSnapshot, "write", write)
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    callback = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", keep_last=None,
                                            staging_dir=tmp_path / "staging")
    make_model().fit(x, x[:, :1], epochs=3, verbose=0, callbacks=[callback])
    assert writers and set(writers) == {"resumable-uploader"}
    good = [c.name for c in resumable.RunStorage(str(tmp_path / "run")).list() if c.ok]
    assert good[-1] == "ckpt-000003" and len(good) == len(writers)  # a replaced snapshot is never written


def test_a_failed_background_write_is_reported_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           recwarn: Any) -> None:
    failures = [OSError(28, "No space left on device")]  # the run folder's disk is full once
    original = snapshot.ModelSnapshot.write

    def write(self: snapshot.ModelSnapshot, folder: Path, root: str | None = None) -> Any:
        if failures:
            raise failures.pop()
        return original(self, folder, root)

    monkeypatch.setattr(snapshot.ModelSnapshot, "write", write)
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    callback = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", keep_last=None,
                                            staging_dir=tmp_path / "staging")
    make_model().fit(x, x[:, :1], epochs=3, verbose=0, callbacks=[callback])
    messages = [str(w.message) for w in recwarn if "resumable:" in str(w.message)]
    failed = [m for m in messages if "save of ckpt-000001 failed" in m]
    assert len(failed) == 1 and "no space left in the run folder" in failed[0], messages
    assert failed[0].count("tries again") == 1 and "\n" not in failed[0], failed  # each thing said once
    [caught] = [w for w in recwarn if "save of ckpt-000001 failed" in str(w.message)]
    assert caught.filename == "resumable-uploader"  # the thread it came from, not resumable's source file
    shown = warnings.formatwarning(caught.message, caught.category, caught.filename, caught.lineno)
    assert shown.count("\n") == 1, shown  # one line: no source line of resumable's printed under it
    good = [c.name for c in resumable.RunStorage(str(tmp_path / "run")).list() if c.ok]
    assert good[-1] == "ckpt-000003"  # the next saves went on; the failed one was retried or superseded


needs_proc_io = pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")


def _io_bytes() -> tuple[int, int]:
    """Bytes this process read and wrote through system calls so far (HDF5's own C writes included)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def make_big_model() -> keras.Model:
    """About 0.8M parameters: 9 MB of weights and Adam's state, dwarfing headers and small files."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((256,))
    outputs = keras.layers.Dense(10)(keras.layers.Dense(512)(keras.layers.Dense(1024)(inputs)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    x = np.ones((4, 256), "float32")
    model.fit(x, np.ones((4, 10), "float32"), verbose=0)  # Adam's state built
    return model


# A Keras whose HDF5 store cannot write into our file object (3.8, 3.9) writes the weights to a
# temporary file, read back and copied in: twice (docs/runtimes.md). Every newer one: once, never read.
ONCE = compat.stores._store_into_file() is not None
WRITES, READS = (1.01, 0.0) if ONCE else (2.02, 1.01)


@needs_proc_io
@pytest.mark.parametrize("kind", ["model", "weights", "shards"])
def test_each_byte_is_written_once_and_never_read_back(tmp_path: Path, kind: str) -> None:
    model = make_big_model()

    def take() -> snapshot.ModelSnapshot:
        taken = model_to_files.snapshot(model, weights_only=kind == "weights", state={"epoch": 1},
                                        arrays={"seen": np.arange(4)},
                                        max_shard_size=0.004 if kind == "shards" else None)
        assert taken is not None
        return taken

    take().write(tmp_path / "warm-up")  # imports and Keras' probes: not what is measured
    taken = take()
    read, written = _io_bytes()
    entries = taken.write(tmp_path / "ckpt")
    read, written = (after - before for after, before in zip(_io_bytes(), (read, written), strict=True))
    size = sum(entry.size for entry in entries.values())
    assert size > 8 * 2**20
    assert written <= size * WRITES + 2**18, (written, size)  # once (HDF5 and the zip rewrite a few headers)
    assert read <= size * READS + 2**18, read  # never read back (old: into the zip, then for its CRC)
    if kind == "shards" and compat.can_shard():  # else one file, said once (docs/runtimes.md)
        assert sum(rel.endswith(".weights.h5") for rel in entries) >= 3
    for rel, entry in entries.items():  # each file's size and CRC32C, as written
        path = tmp_path / "ckpt" / rel
        assert (path.stat().st_size, crc32c_of_file(path)) == (entry.size, entry.crc32c)


@needs_proc_io
def test_a_local_run_s_checkpoint_is_written_into_the_run_once_and_never_read_back(tmp_path: Path) -> None:
    model = make_big_model()
    x = np.ones((4, 256), "float32")
    y = np.ones((4, 10), "float32")
    callback = resumable.CheckpointCallback(str(tmp_path / "run"), monitor="loss", keep_last=None,
                                            staging_dir=tmp_path / "staging", async_upload=False)
    model.fit(x, y, epochs=1, verbose=0, callbacks=[callback])  # warm: the first save's imports
    read, written = _io_bytes()
    model.fit(x, y, initial_epoch=1, epochs=2, verbose=0, callbacks=[callback])
    read, written = (after - before for after, before in zip(_io_bytes(), (read, written), strict=True))
    info = resumable.RunStorage(str(tmp_path / "run")).get("ckpt-000002")
    assert info.ok and info.size > 8 * 2**20
    assert written <= info.size * WRITES + 2**20, (written, info.size)  # no staged copy, no second file
    assert read <= info.size * READS + 2**20, read  # the manifest read back, the lease: small files only
    staged = tmp_path / "staging" / "staging"
    assert not staged.exists() or not any(staged.iterdir())
    assert resumable.RunStorage(str(tmp_path / "run")).verify("ckpt-000002") == []


def test_a_damaged_file_written_in_place_is_found_on_resume(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    callback = resumable.CheckpointCallback(url, monitor="loss", keep_last=None,
                                            staging_dir=tmp_path / "staging")
    make_model().fit(x, x[:, :1], epochs=2, verbose=0, callbacks=[callback])
    damaged = tmp_path / "run" / "ckpt-000002" / "model.keras"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size: only the checksum tells
    damaged.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="ckpt-000002"):
        run = resumable.resume(url, build_model=make_model, staging_dir=tmp_path / "staging")
    assert run.callback.epochs_done == 1


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_no_snapshot_outlives_its_fit_waiting_for_the_cycle_collector(
        tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """A snapshot holds a checkpoint's values (on TensorFlow, the variables' old buffers): once its
    files are committed nothing may keep it, not even a reference cycle through a caught error's
    traceback (a missing run index, a leftover folder that is not there) that only Python's cycle
    collector would free, whenever it next ran."""
    import gc
    import weakref

    taken: list[weakref.ref[snapshot.ModelSnapshot]] = []
    take = model_to_files.snapshot

    def recorded(*args: Any, **kwargs: Any) -> snapshot.ModelSnapshot | None:
        result = take(*args, **kwargs)
        if result is not None:
            taken.append(weakref.ref(result))
        return result

    monkeypatch.setattr(model_to_files, "snapshot", recorded)
    url = str(tmp_path / "run") if where == "local" else f"{request.getfixturevalue('gcs_bucket')}/run"
    model = make_model()
    x = np.random.default_rng(0).random((32, 4), dtype=np.float32)
    gc.collect()
    gc.disable()
    try:
        checkpoints = resumable.CheckpointCallback(url, monitor="loss")
        model.fit(x, x[:, :1], epochs=3, verbose=0, callbacks=[checkpoints])
        assert len(taken) == 3
        assert [ref() for ref in taken] == [None, None, None]
    finally:
        gc.enable()
