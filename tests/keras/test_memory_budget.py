"""A save's memory budget (#54, resumable/keras/memory_budget.py): the argument, the memory left
read from a cgroup (v1, v2) or the system, and a save over its budget written while training
waits, one variable at a time, into the same bytes as a save copied to host memory.

The real memory limit is tests/keras/test_memory_cgroup.py's."""

from __future__ import annotations

import json
import re
import threading
import zipfile
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import resumable
from resumable.keras import compat
from resumable.keras.checkpoint import model_to_files, snapshot
from resumable.keras.checkpoint.memory_budget import AUTO_FRACTION, SnapshotMemory, memory_left

# compat/stores.py: Keras' stores before 3.10 write through entry objects, so a big variable is
# read whole there (the bytes are the same)
KERAS_WRITES_ENTRIES = tuple(int(part) for part in keras.version().split(".")[:2]) < (3, 10)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "lots", None, "AUTO"])
def test_a_bad_snapshot_memory_is_one_line_naming_it(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match=r"^Invalid value for argument `snapshot_memory`\. Received: "
                                         r"snapshot_memory=.*Expected 'auto' or a number of bytes") as raised:
        resumable.CheckpointCallback(str(tmp_path / "run"), snapshot_memory=bad)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="snapshot_memory"):
        resumable.resume(str(tmp_path / "run"), lambda: keras.Sequential(), snapshot_memory=bad)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("good", [0, 1, 2**40, "auto"])
def test_a_good_snapshot_memory_is_kept(tmp_path: Path, good: int | str) -> None:
    callback = resumable.CheckpointCallback(str(tmp_path / "run"), snapshot_memory=good)
    assert callback.snapshot_memory == SnapshotMemory(good)
    assert resumable.CheckpointCallback(str(tmp_path / "run")).snapshot_memory.setting == "auto"


def fake_root(tmp_path: Path, meminfo_kb: int, cgroup_line: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kb} kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup_line)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_memory_left_is_a_v1_cgroup_s_room_less_its_clean_reclaimable_file_pages(tmp_path: Path) -> None:
    group = "sys/fs/cgroup/memory/colab/kernel"
    root = fake_root(tmp_path, 8 * 2**20, "4:memory:/colab/kernel\n0::/\n", {
        f"{group}/memory.limit_in_bytes": str(3 * 2**30),
        f"{group}/memory.usage_in_bytes": str(2 * 2**30),
        f"{group}/memory.stat": f"cache 1\ntotal_inactive_file {2**28 + 2**20}\ntotal_dirty {2**19}\n"
                                f"total_writeback {2**19}\n",  # dirty pages wait for the disk: used
        "sys/fs/cgroup/memory/colab/memory.limit_in_bytes": str(2**63 - 4096),  # no limit
        "sys/fs/cgroup/memory/colab/memory.usage_in_bytes": str(5 * 2**30),
    })
    assert memory_left(root) == 2**30 + 2**28
    assert SnapshotMemory("auto").budget(root) == int((2**30 + 2**28) * AUTO_FRACTION)
    assert SnapshotMemory(123).budget(root) == 123


def test_a_parent_cgroup_s_limit_binds_and_v2_is_read(tmp_path: Path) -> None:
    root = fake_root(tmp_path, 8 * 2**20, "0::/user.slice/job\n", {
        "sys/fs/cgroup/user.slice/job/memory.max": "max",
        "sys/fs/cgroup/user.slice/job/memory.current": str(2**30),
        "sys/fs/cgroup/user.slice/memory.max": str(3 * 2**30),
        "sys/fs/cgroup/user.slice/memory.current": str(2 * 2**30),
        "sys/fs/cgroup/user.slice/memory.stat": f"anon 5\ninactive_file {2**29}\n",
    })
    assert memory_left(root) == 2**30 + 2**29


def test_a_v2_cgroup_s_own_limit_less_its_usage_and_clean_reclaimable_files_is_the_room(
        tmp_path: Path) -> None:
    """A Colab-like container on cgroup v2 (none can be made here: the tree is faked): the leaf's
    memory.max less memory.current, memory.stat's inactive_file not counted as used but for its
    dirty pages (file_dirty, file_writeback); the root cgroup has no files."""
    root = fake_root(tmp_path, 64 * 2**20, "0::/docker/abc\n", {
        "sys/fs/cgroup/docker/abc/memory.max": str(12 * 2**30),
        "sys/fs/cgroup/docker/abc/memory.current": str(10 * 2**30),
        "sys/fs/cgroup/docker/abc/memory.stat": f"anon {9 * 2**30}\nfile {2**30}\ninactive_file {2**29}\n"
                                                f"file_dirty {2**28}\nfile_writeback 0\n",
        "sys/fs/cgroup/docker/memory.max": "max",
        "sys/fs/cgroup/docker/memory.current": str(10 * 2**30),
    })
    assert memory_left(root) == 2 * 2**30 + 2**28
    assert SnapshotMemory().budget(root) == int((2 * 2**30 + 2**28) * AUTO_FRACTION)
    # over its limit (usage counted before the kernel reclaims): no room, never a negative budget
    (tmp_path / "sys/fs/cgroup/docker/abc/memory.current").write_text(str(13 * 2**30))
    (tmp_path / "sys/fs/cgroup/docker/abc/memory.stat").write_text("inactive_file 0\n")
    assert memory_left(root) == 0 and SnapshotMemory().budget(root) == 0
    # the cgroup's room where the system has more available, the system's where it has less
    (tmp_path / "sys/fs/cgroup/docker/abc/memory.current").write_text(str(2**30))
    assert memory_left(root) == 11 * 2**30 and memory_left(fake_root(
        tmp_path / "small", 2**20, "0::/docker/abc\n", {
            "sys/fs/cgroup/docker/abc/memory.max": str(12 * 2**30),
            "sys/fs/cgroup/docker/abc/memory.current": str(2**30)})) == 2**30


def test_a_cgroup_s_peak_and_the_process_peak_leave_room_for_training_to_get_back_there(
        tmp_path: Path) -> None:
    """Between two steps training is below its peak: the cgroup's peak usage (v1
    memory.max_usage_in_bytes, v2 memory.peak) bounds its room, and the process' resident set's
    peak over its current one (VmHWM - VmRSS) is kept free too."""
    group = "sys/fs/cgroup/memory/kernel"
    root = fake_root(tmp_path, 64 * 2**20, "4:memory:/kernel\n", {
        f"{group}/memory.limit_in_bytes": str(4 * 2**30),
        f"{group}/memory.usage_in_bytes": str(2**30),
        f"{group}/memory.max_usage_in_bytes": str(3 * 2**30),
    })
    assert memory_left(root) == 2**30
    (tmp_path / "proc/self/status").write_text("Name:\tpython\nVmHWM:\t  524288 kB\nVmRSS:\t  262144 kB\n")
    assert memory_left(root) == 2**30 - 2**28
    v2 = fake_root(tmp_path / "v2", 64 * 2**20, "0::/k\n", {
        "sys/fs/cgroup/k/memory.max": str(4 * 2**30), "sys/fs/cgroup/k/memory.current": str(2**30),
        "sys/fs/cgroup/k/memory.peak": str(2**31)})
    assert memory_left(v2) == 2 * 2**30


def test_auto_copies_all_or_nothing_a_number_copies_what_fits() -> None:
    assert not SnapshotMemory("auto").copies_part
    assert SnapshotMemory(0).copies_part and SnapshotMemory(2**30).copies_part
    model = trained()
    whole = model_to_files.snapshot(model, weights_only=True, state={})
    assert whole is not None
    for copy_part in (True, False):
        taken = model_to_files.snapshot(model, weights_only=True, state={}, budget=whole.nbytes // 2,
                                        copy_part=copy_part)
        assert taken is not None and taken.streamed and taken.partial == copy_part


def test_without_a_cgroup_limit_the_system_s_available_memory_counts(tmp_path: Path) -> None:
    root = fake_root(tmp_path, 4 * 2**20, "4:memory:/\n", {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": str(2**63 - 4096),
        "sys/fs/cgroup/memory/memory.usage_in_bytes": str(2**30),
    })
    assert memory_left(root) == 4 * 2**30
    assert memory_left(tmp_path / "nowhere") is None
    assert SnapshotMemory().budget(tmp_path / "nowhere") is None  # nothing known: copied, as before


def test_this_machine_s_memory_left_is_at_most_what_the_system_has() -> None:
    left = memory_left()
    assert left is not None and left > 0
    available = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemAvailable:")).split()[1]) * 1024
    assert left <= available


def trained(layers: int = 3) -> keras.Model:
    keras.backend.clear_session()  # the same layer names in every model of this file
    keras.utils.set_random_seed(5)
    inputs = keras.Input((16,))
    hidden = inputs
    for _ in range(layers):
        hidden = keras.layers.Dense(32)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(1).normal(size=(64, 16)).astype("float32")
    model.fit(x, x[:, :1], epochs=1, verbose=0)
    return model


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def keras_members(data: bytes) -> dict[str, bytes]:
    """A .keras zip's members, what differs between any two saves of two models set aside."""
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    return {**members, "metadata.json": undated(members["metadata.json"]),
            "config.json": unnumbered(members["config.json"])}


def undated(metadata: bytes) -> bytes:
    """metadata.json without its save date (a second's resolution)."""
    loaded = json.loads(metadata)
    loaded.pop("date_saved")
    return json.dumps(loaded).encode()


def unnumbered(config: bytes) -> bytes:
    """config.json without Keras' shared_object_id, a Python object's id(): another per model."""
    return re.sub(rb'"shared_object_id": \d+', b'"shared_object_id": 0', config)

def assert_same_checkpoint(ours_folder: Path, theirs_folder: Path) -> None:
    """The files of two snapshots written: the same bytes (a .keras file's members, metadata but its date)."""
    ours, theirs = file_bytes(ours_folder), file_bytes(theirs_folder)
    assert ours.keys() == theirs.keys()
    for name in ours:
        if name == snapshot.MODEL_FILE:
            assert keras_members(ours[name]) == keras_members(theirs[name])
        elif name == snapshot.METADATA_FILE:
            assert undated(ours[name]) == undated(theirs[name])
        else:
            assert ours[name] == theirs[name], name



@pytest.mark.lanes
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("max_shard_size", [None, 2e-5])
def test_a_snapshot_over_its_budget_holds_no_copy_and_writes_the_same_bytes(
        tmp_path: Path, weights_only: bool, max_shard_size: float | None) -> None:
    model = trained()
    kwargs: dict[str, Any] = dict(weights_only=weights_only, state={"step": 1}, max_shard_size=max_shard_size)
    copied = model_to_files.snapshot(model, **kwargs)
    streamed = model_to_files.snapshot(model, **kwargs, budget=0)
    fitting = model_to_files.snapshot(model, **kwargs, budget=copied.nbytes if copied else 0)
    assert copied is not None and streamed is not None and fitting is not None
    assert not copied.streamed and not fitting.streamed and streamed.streamed
    assert not streamed.partial and streamed.copied_bytes == 0
    assert all(isinstance(v.value, np.ndarray) for v in copied.values)
    live = [v for v in streamed.values if isinstance(v.value, snapshot.LiveValue)]
    assert len(live) == len(model.weights) + len(model.optimizer.variables)  # nothing copied
    assert streamed.nbytes == copied.nbytes and streamed.payload == copied.payload
    # a Keras that writes no shards (3.8 to 3.10) writes one file either way
    assert streamed.sharded == copied.sharded == (max_shard_size is not None and compat.can_shard())
    copied.write(tmp_path / "copied")
    streamed.write(tmp_path / "streamed")
    assert_same_checkpoint(tmp_path / "streamed", tmp_path / "copied")


@pytest.mark.lanes
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("max_shard_size", [None, 2e-5])
def test_a_snapshot_a_quarter_over_its_budget_copies_its_tail_and_writes_the_same_bytes(
        tmp_path: Path, weights_only: bool, max_shard_size: float | None) -> None:
    """What fits is copied, counted from the end of the save order; the write says when it is
    past the live part (training goes on from there) before it writes the copied tail."""
    model = trained()
    kwargs: dict[str, Any] = dict(weights_only=weights_only, state={"step": 1}, max_shard_size=max_shard_size)
    copied = model_to_files.snapshot(model, **kwargs)
    assert copied is not None
    budget = copied.nbytes // 4
    partly = model_to_files.snapshot(model, **kwargs, budget=budget)
    assert partly is not None and partly.streamed and partly.partial
    held = sum(int(a.nbytes) for a in partly.arrays.values())
    assert 0 < partly.copied_bytes <= budget - held
    live = [isinstance(v.value, snapshot.LiveValue) for v in partly.values]
    tail = live.index(False, max(i for i, is_live in enumerate(live) if is_live))
    assert not any(live[tail:])  # the live ones first, then the copies
    assert sum(int(v.value.nbytes) for v in partly.values[tail:]) >= partly.copied_bytes
    variables = len(model.weights) + len(model.optimizer.variables)
    assert 0 < live.count(False) < variables
    released_at: list[int] = []
    original = np.asarray

    def reading(value: Any, *args: Any, **kwargs: Any) -> Any:  # counts the reads of live values
        if isinstance(value, snapshot.LiveValue):
            released_at.append(int(partly.live_written.is_set()))
        return original(value, *args, **kwargs)

    assert not partly.live_written.is_set()
    np.asarray = reading  # type: ignore[assignment]
    try:
        partly.write(tmp_path / "partly")
    finally:
        np.asarray = original  # type: ignore[assignment]
    assert partly.live_written.is_set()
    assert released_at and not any(released_at)  # no live value read after training was let go
    copied.write(tmp_path / "copied")
    assert_same_checkpoint(tmp_path / "partly", tmp_path / "copied")


@pytest.mark.lanes
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("max_shard_size", [None, 2e-5])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_big_variable_is_written_in_slices_into_the_same_bytes(
        tmp_path: Path, weights_only: bool, max_shard_size: float | None, dtype: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A live variable over SLICE_BYTES is read a slice of rows at a time, never whole."""
    monkeypatch.setattr(snapshot, "SLICE_BYTES", 700)  # a 16x32 kernel (2 KB) is big here
    # On the CPU, TensorFlow and JAX hand a view for free; torch copies (read in slices there too)
    assert snapshot.whole_read_is_free(trained().weights[0]) == (keras.backend.backend() != "torch")
    monkeypatch.setattr(snapshot, "whole_read_is_free", lambda variable: False)  # as a GPU's
    model = trained()
    if dtype == "bfloat16":
        keras.backend.clear_session()
        inputs = keras.Input((16,))
        model = keras.Model(inputs, keras.layers.Dense(1, dtype="bfloat16")(
            keras.layers.Dense(64, dtype="bfloat16")(inputs)))
        model.compile(optimizer="adam", loss="mse")
        model.optimizer.build(model.trainable_variables)
    kwargs: dict[str, Any] = dict(weights_only=weights_only, state={"step": 1}, max_shard_size=max_shard_size)
    copied = model_to_files.snapshot(model, **kwargs)
    streamed = model_to_files.snapshot(model, **kwargs, budget=0)
    assert copied is not None and streamed is not None
    big = [v.value for v in streamed.values
           if isinstance(v.value, snapshot.LiveValue) and v.value.slice_rows is not None]
    assert big and all(v.nbytes > 700 for v in big)
    reads: list[tuple[int, int]] = []
    whole: list[snapshot.LiveValue] = []
    read, array = snapshot.LiveValue.read, snapshot.LiveValue.__array__

    def counted_read(self: snapshot.LiveValue, start: int, stop: int) -> np.ndarray:
        reads.append((start, stop))
        return read(self, start, stop)

    def counted_array(self: snapshot.LiveValue, *args: Any, **kwargs: Any) -> np.ndarray:
        whole.append(self)
        return array(self, *args, **kwargs)

    monkeypatch.setattr(snapshot.LiveValue, "read", counted_read)
    monkeypatch.setattr(snapshot.LiveValue, "__array__", counted_array)
    streamed.write(tmp_path / "streamed")
    copied.write(tmp_path / "copied")
    if KERAS_WRITES_ENTRIES:  # Keras 3.8, 3.9: its store writes through entry objects, read whole
        assert {id(v) for v in big} <= {id(v) for v in whole} and not reads
    else:
        assert not {id(v) for v in whole} & {id(v) for v in big}  # no big one read whole
        assert len(reads) > len(big) and max(stop - start for start, stop in reads) < 16  # of 16 or 64 rows
    assert_same_checkpoint(tmp_path / "streamed", tmp_path / "copied")


def checkpoint_files(run: Path) -> dict[str, dict[str, Any]]:
    manifest = json.loads((run / "ckpt-000002" / "manifest.json").read_text())
    return dict(manifest["files"])


@pytest.mark.parametrize("save", [
    {"save_weights_only": True},
    {"save_weights_only": True, "max_shard_size": 2e-5},
    {"save_trainable_only": True},
    {},
    {"max_shard_size": 2e-5},
])
def test_a_run_saved_within_a_zero_or_a_quarter_budget_commits_the_same_checksums(
        tmp_path: Path, save: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Training waits for the write (MainThread), or for its live part only when a quarter fits
    (the rest in resumable-tail-write); every file's checksum is the copied save's, but for what
    differs between any two saves of a full model: metadata.json's date, config.json's object
    ids (compared without them)."""
    writers: list[tuple[bool, bool, str]] = []
    original = snapshot.ModelSnapshot.write

    def write(self: snapshot.ModelSnapshot, folder: Path, root: str | None = None) -> Any:
        writers.append((self.streamed, self.partial, threading.current_thread().name))
        return original(self, folder, root)

    monkeypatch.setattr(snapshot.ModelSnapshot, "write", write)
    x = np.random.default_rng(1).normal(size=(64, 16)).astype("float32")
    whole = model_to_files.snapshot(trained(), weights_only="save_weights_only" in save, state={})
    assert whole is not None
    files = {}
    for memory in ("auto", 0, whole.nbytes // 4):
        run = tmp_path / f"run-{memory}"
        callback = resumable.CheckpointCallback(str(run), monitor="loss", snapshot_memory=memory, **save)
        model = trained()
        model.fit(x, x[:, :1], epochs=2, verbose=0, callbacks=[callback])
        files[memory] = checkpoint_files(run)
    if "save_trainable_only" not in save:
        assert (False, False, "resumable-uploader") in writers
        assert {w for w in writers if w[0]} == {(True, False, "MainThread"),
                                                (True, True, "resumable-tail-write")}
    for memory in (0, whole.nbytes // 4):
        assert files["auto"].keys() == files[memory].keys()
        differs = {name for name in files[memory] if files[memory][name] != files["auto"][name]}
        full_model = "save_weights_only" not in save and "save_trainable_only" not in save
        assert differs <= ({"model.keras", "metadata.json", "config.json"} if full_model else set())
        normalized = {"model.keras": keras_members, "metadata.json": undated, "config.json": unnumbered}
        for name in differs:
            ours, theirs = ((tmp_path / f"run-{m}/ckpt-000002/{name}").read_bytes() for m in (memory, "auto"))
            assert normalized[name](ours) == normalized[name](theirs), name


@pytest.mark.lanes
def test_backup_and_restore_backs_up_within_its_budget(tmp_path: Path) -> None:
    x = np.random.default_rng(1).normal(size=(64, 16)).astype("float32")
    with pytest.raises(ValueError, match="snapshot_memory"):
        resumable.BackupAndRestore(str(tmp_path / "bad"), snapshot_memory=-5)
    backups = {}
    for memory in ("auto", 0):
        backup = resumable.BackupAndRestore(str(tmp_path / f"backup-{memory}"), delete_checkpoint=False,
                                            snapshot_memory=memory)
        assert backup.snapshot_memory == SnapshotMemory(memory)
        trained().fit(x, x[:, :1], epochs=2, verbose=0, callbacks=[backup])
        backups[memory] = checkpoint_files(tmp_path / f"backup-{memory}")
    assert backups[0] == backups["auto"]


@pytest.mark.lanes
def test_a_run_saved_within_a_zero_budget_resumes(tmp_path: Path) -> None:
    x = np.random.default_rng(1).normal(size=(64, 16)).astype("float32")
    run = resumable.resume(str(tmp_path / "run"), trained, monitor="loss", snapshot_memory=0)
    run.fit(x, x[:, :1], epochs=2, verbose=0)
    again = resumable.resume(str(tmp_path / "run"), trained, monitor="loss", snapshot_memory=0)
    assert again.initial_epoch == 2
    for a, b in zip(run.model.weights, again.model.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


@pytest.mark.parametrize("backend", ["memory", "gcs"])
def test_a_run_to_a_bucket_within_a_quarter_budget_commits_the_same_checksums_and_resumes(
        run_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket's run stages its files: the tail's write moves them into the staging folder."""
    import fsspec

    from resumable.keras.checkpoint import tail_write

    moved: list[str | None] = []
    original = tail_write.TailWrite.write

    def write(self: tail_write.TailWrite, folder: Path, root: str | None) -> Any:
        moved.append(root)
        return original(self, folder, root)

    monkeypatch.setattr(tail_write.TailWrite, "write", write)

    x = np.random.default_rng(1).normal(size=(64, 16)).astype("float32")
    whole = model_to_files.snapshot(trained(), weights_only=True, state={})
    assert whole is not None
    manifests = {}
    for memory in ("auto", whole.nbytes // 4):
        url = f"{run_url}-{memory}"
        run = resumable.resume(url, trained, monitor="loss", save_weights_only=True, snapshot_memory=memory)
        run.fit(x, x[:, :1], epochs=2, verbose=0)
        with fsspec.open(f"{url}/ckpt-000002/manifest.json", "r") as manifest:
            manifests[memory] = json.load(manifest)["files"]
        again = resumable.resume(url, trained, monitor="loss", save_weights_only=True, snapshot_memory=memory)
        assert again.initial_epoch == 2
        for a, b in zip(run.model.weights, again.model.weights, strict=True):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    assert manifests["auto"] == manifests[whole.nbytes // 4]
    assert moved and set(moved) == {None}  # into staging, then uploaded


def test_a_tail_write_hands_its_files_on_again_for_a_retry_and_leaves_nothing(tmp_path: Path) -> None:
    """A commit in place that failed after its files (the manifest) is retried with them; a
    staged one moves them; either way the private folder goes with the save job."""
    import gc
    import shutil

    from resumable.keras.checkpoint import tail_write
    from resumable.manager import WrittenFiles

    def write(folder: Path) -> dict[str, Any]:
        files = WrittenFiles(folder)
        files.write_bytes("model.weights.h5", b"w" * 1000)
        files.write_bytes("assets/vocab.txt", b"a b c")
        files.close()
        return files.entries

    staging = tmp_path / "staging" / "ckpt-000001"
    run = tmp_path / "run"
    run.mkdir()
    pending = tail_write.TailWrite(write, staging)
    pending.join()
    private = [p for p in staging.parent.iterdir() if p.name.startswith("ckpt-000001.writing-")]
    assert len(private) == 1
    first = pending.write(run / "ckpt-000001", str(run))
    shutil.rmtree(run / "ckpt-000001")  # the commit failed after the files: retried
    assert pending.write(run / "ckpt-000001", str(run)) == first
    assert (run / "ckpt-000001/assets/vocab.txt").read_bytes() == b"a b c"
    del pending
    gc.collect()
    assert not private[0].exists()
    moved = tail_write.TailWrite(write, staging)
    assert moved.write(staging, None) == first and (staging / "model.weights.h5").stat().st_size == 1000
    assert sorted(p.name for p in staging.parent.iterdir()) == ["ckpt-000001"]

    def fails(folder: Path) -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        tail_write.TailWrite(fails, staging).write(staging, None)
