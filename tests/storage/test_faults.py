"""Storage that misbehaves (faulty:// over local, memory:// and fake-gcs-server): nothing is lost.

Each test commits good checkpoints, injects a fault (Drive's EIO and ENOTCONN, GCS' 429 and
503, a full disk, a quota spent mid-file, a write cut short, a listing that lags) and checks:
committed checkpoints keep their bytes, the newest good one is what `latest` returns, retries
are bounded and logged, and a half-written checkpoint is never reported as good.
"""

from __future__ import annotations

import errno
import logging
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import storage_helpers
from faulty_fs import LISTINGS, READS, WRITES, Faults, eio, enotconn, faulty_options, faulty_url, http

from resumable import (
    CheckpointExistsError,
    Manifest,
    RetryPolicy,
    RunStorage,
    Status,
    StorageError,
)
from resumable.core.checksum import crc32c_of_bytes
from resumable.core.display import human_size
from resumable.core.errors import NoSpaceError
from resumable.core.manifest import MANIFEST_NAME
from resumable.manager.uploader import Uploader

MODEL = bytes(random.Random(7).randrange(256) for _ in range(40_000))
SIZE = len(MODEL) + len(b'{"epoch": 0}\n')  # bytes of one checkpoint's files
RETRY = RetryPolicy(attempts=4, initial_delay=0.001, max_delay=0.002)


def stage(tmp_path: Path, epoch: int) -> Path:
    # each epoch's bytes differ
    files = {"model.keras": MODEL[:-1] + bytes([epoch]), "state.json": b'{"epoch": 0}\n'}
    return storage_helpers.stage(tmp_path / "stage" / f"ckpt-{epoch:06d}", files)


def commit(storage: RunStorage, tmp_path: Path, epoch: int) -> Any:
    return storage.commit(stage(tmp_path, epoch), f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 6))


def snapshot(storage: RunStorage) -> dict[str, str]:
    """Every file under the run folder, read through the real filesystem: path -> crc32c."""
    real = storage.fs.target
    return {
        path[len(storage.root):]: crc32c_of_bytes(bytes(real.cat_file(path)))
        for path in real.find(storage.root)
        if not path.rsplit("/", 1)[-1].startswith(".")
    }


def committed(before: dict[str, str], after: dict[str, str], names: list[str]) -> None:
    """The files of the checkpoints ``names`` are in ``after`` with the bytes they had."""
    kept = {p: c for p, c in before.items() if p.split("/")[1] in names}
    assert kept and {p: after.get(p) for p in kept} == kept


def latest_name(storage: RunStorage) -> str | None:
    latest = storage.latest()
    return latest.name if latest else None


def retries_logged(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if "retry" in r.getMessage() and r.levelno == logging.WARNING)


@pytest.fixture
def make_storage(run_url: str) -> Callable[..., RunStorage]:
    url, protocol = faulty_url(run_url)

    def make(faults: Faults, retry: RetryPolicy = RETRY) -> RunStorage:
        return RunStorage(url, retry=retry, storage_options=faulty_options(faults, protocol))

    return make


# ----------------------------------------------------------------- transient errors


@pytest.mark.parametrize(
    "error", [eio, enotconn, http(503), http(429)], ids=["EIO", "ENOTCONN", "http503", "http429"]
)
def test_transient_errors_are_retried_and_logged(
    make_storage: Callable[..., RunStorage], tmp_path: Path, caplog: pytest.LogCaptureFixture,
    error: Callable[[], Exception],
) -> None:
    faults = Faults(transient_rate=0.25, transient=error, seed=3)
    storage = make_storage(faults, RetryPolicy(attempts=12, initial_delay=0.001, max_delay=0.002))
    with caplog.at_level(logging.WARNING, logger="resumable"):
        for epoch in (1, 2, 3):
            commit(storage, tmp_path, epoch)
        latest = storage.latest()
        assert latest is not None
        fetched = storage.fetch(latest, tmp_path / "fetched")
    assert faults.injected, "the fault injection did nothing"
    assert retries_logged(caplog) == len(faults.injected)  # every failed try is logged, none hidden
    faults.heal()
    assert [(i.name, i.status) for i in storage.list()] == [
        (f"ckpt-{e:06d}", Status.OK) for e in (1, 2, 3)
    ]
    assert latest.name == "ckpt-000003"
    assert (fetched / "model.keras").read_bytes() == MODEL[:-1] + bytes([3])


def test_retries_are_bounded_and_a_failed_commit_loses_nothing(
    make_storage: Callable[..., RunStorage], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    faults = Faults()
    storage = make_storage(faults)
    for epoch in (1, 2):
        commit(storage, tmp_path, epoch)
    before = snapshot(storage)
    puts = faults.count("open_write")  # uploads stream through open(..., "wb")
    faults.ops, faults.fail_first = WRITES, 1000  # the mount never comes back
    with caplog.at_level(logging.WARNING, logger="resumable"), pytest.raises(StorageError) as caught:
        commit(storage, tmp_path, 3)
    message = str(caught.value)
    assert "\n" not in message and storage.url in message and "Input/output error" in message
    assert faults.count("open_write") - puts == RETRY.attempts  # bounded: one try and three retries
    assert retries_logged(caplog) == RETRY.attempts - 1
    logged = "upload ckpt-000003/model.keras failed (OSError: [Errno 5] Input/output error); retry 1 of 3"
    assert logged in caplog.text
    faults.heal()
    assert snapshot(storage) == before  # nothing of the old checkpoints touched
    assert latest_name(storage) == "ckpt-000002"
    commit(storage, tmp_path, 3)  # the next save succeeds once the mount is back
    assert latest_name(storage) == "ckpt-000003"


@pytest.mark.parametrize("ops", [READS, LISTINGS], ids=["reads", "listings"])
def test_reads_and_listings_are_retried(
    make_storage: Callable[..., RunStorage], tmp_path: Path, ops: frozenset[str]
) -> None:
    faults = Faults()
    storage = make_storage(faults)
    for epoch in (1, 2):
        commit(storage, tmp_path, epoch)
    faults.ops, faults.fail_first = ops, 2
    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000002"
    faults.fail_first = 2
    if ops is READS:
        fetched = storage.fetch(latest, tmp_path / "fetched")
        assert (fetched / "model.keras").read_bytes() == MODEL[:-1] + bytes([2])
    else:
        assert [i.status for i in storage.list(check_files=False)] == [Status.OK, Status.OK]
    assert len(faults.injected) == 4


def test_a_delete_that_fails_leaves_a_good_or_a_partial_checkpoint(
    make_storage: Callable[..., RunStorage], tmp_path: Path
) -> None:
    faults = Faults()
    storage = make_storage(faults)
    for epoch in (1, 2):
        commit(storage, tmp_path, epoch)
    faults.ops, faults.fail_first = frozenset({"rm_file"}), 1000
    with pytest.raises(StorageError):
        storage.delete("ckpt-000001")
    faults.heal()
    statuses = {i.name: i.status for i in storage.list()}
    assert statuses["ckpt-000002"] is Status.OK
    assert statuses.get("ckpt-000001", Status.PARTIAL) in (Status.OK, Status.PARTIAL)


# ----------------------------------------------------------------- space and quota


@pytest.mark.parametrize(
    "code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"]
)
def test_a_full_destination_names_the_folder_and_the_space_needed(
    make_storage: Callable[..., RunStorage], tmp_path: Path, code: int
) -> None:
    faults = Faults()
    storage = make_storage(faults)
    for epoch in (1, 2):
        commit(storage, tmp_path, epoch)
    before = snapshot(storage)
    # Room for half a checkpoint: model.keras lands in part, then every write fails.
    faults.budget, faults.budget_error = SIZE // 2, lambda: OSError(code, "No space left on device")
    with pytest.raises(NoSpaceError) as caught:
        commit(storage, tmp_path, 3)
    message = str(caught.value)
    assert message.startswith(f"{storage.url}/ckpt-000003: no space left") and "\n" not in message
    assert f"{human_size(SIZE)} needed" in message and "older checkpoints are kept" in message
    assert isinstance(caught.value, OSError) and isinstance(caught.value, StorageError)
    after = snapshot(storage)
    committed(before, after, ["ckpt-000001", "ckpt-000002"])  # nothing deleted to make room
    statuses = {i.name: i.status for i in storage.list()}
    assert statuses["ckpt-000003"] is Status.PARTIAL  # half a file, no manifest: never good
    assert latest_name(storage) == "ckpt-000002"
    faults.heal()
    commit(storage, tmp_path, 3)  # the next save clears the leftovers and commits
    assert latest_name(storage) == "ckpt-000003"
    committed(before, snapshot(storage), ["ckpt-000001", "ckpt-000002"])


def test_a_full_local_disk_says_how_much_is_free(tmp_path: Path) -> None:
    """On a local folder (Drive's mount is one) the message also gives the free space."""
    from resumable.storage.errors import free_space

    text = free_space(str(tmp_path / "not" / "yet"))  # the nearest existing parent's disk
    assert text.startswith(", ") and text.endswith(" free")


# ----------------------------------------------------------------- writes cut short


@pytest.mark.parametrize("raises", [False, True], ids=["silent", "with-error"])
def test_a_write_cut_short_is_caught_and_retried(
    make_storage: Callable[..., RunStorage], tmp_path: Path, caplog: pytest.LogCaptureFixture, raises: bool
) -> None:
    faults = Faults(cut_short=1, cut_short_raises=raises)
    storage = make_storage(faults)
    with caplog.at_level(logging.WARNING, logger="resumable"):
        commit(storage, tmp_path, 1)
    assert faults.injected and retries_logged(caplog) == 1
    fetched = storage.fetch("ckpt-000001", tmp_path / "fetched")  # checks every CRC32C
    assert (fetched / "model.keras").read_bytes() == MODEL[:-1] + bytes([1])


def test_writes_always_cut_short_never_commit(
    make_storage: Callable[..., RunStorage], tmp_path: Path
) -> None:
    faults = Faults()
    storage = make_storage(faults)
    commit(storage, tmp_path, 1)
    before = snapshot(storage)
    faults.cut_short = 1000
    with pytest.raises(StorageError, match="uploaded copy differs"):
        commit(storage, tmp_path, 2)
    faults.heal()
    statuses = {i.name: i.status for i in storage.list()}
    assert statuses == {"ckpt-000001": Status.OK, "ckpt-000002": Status.PARTIAL}
    committed(before, snapshot(storage), ["ckpt-000001"])
    assert latest_name(storage) == "ckpt-000001"


def test_a_manifest_cut_short_is_not_reported_as_committed(
    make_storage: Callable[..., RunStorage], tmp_path: Path
) -> None:
    faults = Faults()
    storage = make_storage(faults)
    commit(storage, tmp_path, 1)
    staged = stage(tmp_path, 2)
    faults.cut_short, faults.cut_only = 1, MANIFEST_NAME  # the data files land whole, the manifest does not
    with pytest.raises(StorageError, match="did not land intact"):
        storage.commit(staged, "ckpt-000002", Manifest(epoch=2))
    faults.heal()
    statuses = {i.name: i.status for i in storage.list()}
    assert statuses == {"ckpt-000001": Status.OK, "ckpt-000002": Status.CORRUPT}
    assert latest_name(storage) == "ckpt-000001"
    storage.commit(staged, "ckpt-000002", Manifest(epoch=2))  # the next save replaces it
    assert latest_name(storage) == "ckpt-000002"


# ----------------------------------------------------------------- late visibility


def test_late_listings_never_show_a_bad_checkpoint_and_catch_up(
    make_storage: Callable[..., RunStorage], tmp_path: Path
) -> None:
    faults = Faults(hide_new=3)
    storage = make_storage(faults)
    seen = []
    for epoch in (1, 2, 3):
        commit(storage, tmp_path, epoch)
        latest = storage.latest()
        seen.append(latest.name if latest else None)
        assert latest is None or latest.ok
    assert seen[-1] != "ckpt-000003"  # the listing really lagged
    for _ in range(4):
        storage.list()
    assert latest_name(storage) == "ckpt-000003"
    assert all(i.ok for i in storage.list())


def test_a_committed_checkpoint_not_yet_listed_is_never_overwritten(
    make_storage: Callable[..., RunStorage], tmp_path: Path
) -> None:
    """Another VM's commit that our listing does not show yet: our commit of the same name must fail."""
    faults = Faults(hide_new=100)
    storage = make_storage(faults)
    commit(storage, tmp_path, 1)
    assert storage.latest() is None  # not visible yet
    faults.hide_new = 0
    real = storage.fs.target
    before = {p: bytes(real.cat_file(p)) for p in real.find(storage.root) if "ckpt-000001" in p}
    other = stage(tmp_path / "other", 1)
    (other / "model.keras").write_bytes(b"another run's bytes")
    with pytest.raises(CheckpointExistsError) as caught:
        storage.commit(other, "ckpt-000001", Manifest(epoch=1))
    assert "never overwrites" in str(caught.value)
    assert {p: bytes(real.cat_file(p)) for p in before} == before


# ----------------------------------------------------------------- background uploads


def test_background_uploads_keep_the_failed_job_and_the_next_save_retries(
    make_storage: Callable[..., RunStorage], tmp_path: Path
) -> None:
    faults = Faults()
    storage = make_storage(faults)
    uploader = Uploader(storage)
    uploader.commit_later(stage(tmp_path, 1), "ckpt-000001", Manifest(epoch=1))
    uploader.wait()
    before = snapshot(storage)
    faults.budget = 100  # the disk fills up
    staged = stage(tmp_path, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        uploader.commit_later(staged, "ckpt-000002", Manifest(epoch=2))
        with pytest.raises(NoSpaceError, match="no space left to commit this checkpoint"):
            uploader.wait()
    texts = [str(w.message) for w in caught]
    assert any("upload of ckpt-000002 failed" in t and "no space left" in t and "next save" in t
               for t in texts), texts
    assert staged.is_dir()  # the local copy is kept for the retry
    committed(before, snapshot(storage), ["ckpt-000001"])
    faults.heal()
    uploader.commit_later(stage(tmp_path, 3), "ckpt-000003", Manifest(epoch=3))  # retries ckpt-000002 first
    uploader.wait()
    assert [i.name for i in storage.list() if i.ok] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    uploader.close()


# ----------------------------------------------------------------- training through faults (Keras)


def _keras_job() -> tuple[Any, Any, Any, dict[str, Any]]:
    keras = pytest.importorskip("keras")
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")

    def make_model() -> Any:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    fit = {"batch_size": 32, "shuffle": False, "verbose": 0, "validation_data": (x[:32], y[:32])}
    return keras, make_model, (x, y), fit


@pytest.mark.slow
def test_training_goes_on_through_flaky_storage_and_resume_takes_the_newest(tmp_path: Path) -> None:
    import resumable

    keras, make_model, data, fit = _keras_job()
    url, protocol = faulty_url(str(tmp_path / "run"))
    faults = Faults(transient_rate=0.2, seed=5, transient=enotconn)
    options = faulty_options(faults, protocol)
    run = resumable.resume(url, build_model=make_model, keep_last=None, storage_options=options)
    run.callback.storage.retry = RetryPolicy(attempts=12, initial_delay=0.001, max_delay=0.002)
    run.fit(*data, epochs=4, **fit)
    assert faults.injected
    faults.heal()
    infos = RunStorage(str(tmp_path / "run")).list()
    assert [(i.name, i.status) for i in infos] == [(f"ckpt-{e:06d}", Status.OK) for e in (1, 2, 3, 4)]
    again = resumable.resume(str(tmp_path / "run"), build_model=make_model)
    assert again.checkpoint is not None and again.checkpoint.name == "ckpt-000004"
    assert again.initial_epoch == 4


@pytest.mark.slow
def test_a_full_destination_warns_training_goes_on_and_the_next_save_retries(tmp_path: Path) -> None:
    import resumable

    keras, make_model, data, fit = _keras_job()
    url, protocol = faulty_url(str(tmp_path / "run"))
    faults = Faults()
    options = faulty_options(faults, protocol)
    run = resumable.resume(url, build_model=make_model, keep_last=1, storage_options=options)
    run.callback.storage.retry = RETRY

    def fill_the_disk(epoch: int, logs: Any) -> None:
        if epoch == 1:  # before the callback saves epoch 2 (it runs last)
            run.callback.wait_for_uploads()
            faults.budget = 0

    full = keras.callbacks.LambdaCallback(on_epoch_end=fill_the_disk)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(NoSpaceError) as error:
        warnings.simplefilter("always")
        run.fit(*data, epochs=4, callbacks=[full], **fit)
    assert run.callback.epochs_done == 4  # training did not stop at the full disk
    failed = [str(w.message) for w in caught if "upload of ckpt-" in str(w.message)]
    assert failed and all("no space left" in t and "next save tries again" in t for t in failed), failed
    message = str(error.value)
    assert "\n" not in message and "ckpt-000004: no space left to commit" in message and "needed" in message
    faults.heal()
    statuses = {i.name: i.status for i in RunStorage(str(tmp_path / "run")).list()}
    assert statuses["ckpt-000001"] is Status.OK  # keep_last=1, yet the only good one was not deleted
    assert all(s is not Status.OK for n, s in statuses.items() if n != "ckpt-000001")
    run.callback.wait_for_uploads()  # space again: the kept local copy of epoch 4 is committed now
    latest = RunStorage(str(tmp_path / "run")).latest()
    assert latest is not None and latest.name == "ckpt-000004"


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A real 64 KB tmpfs (root only: CI runners without it skip)."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
def test_a_full_run_disk_warns_names_the_folder_and_training_goes_on(
    tmp_path: Path, small_disk: Path
) -> None:
    """A local run's checkpoints are written straight into it: its disk is the one that fills."""
    import resumable

    keras, make_model, data, fit = _keras_job()

    def big_model() -> Any:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2000), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model  # ~200 KB with Adam's state: more than the disk holds

    url = str(small_disk / "run")
    run = resumable.resume(url, build_model=big_model, staging_dir=tmp_path / "staging")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.fit(*data, epochs=2, **fit)
    texts = [str(w.message) for w in caught if "run folder" in str(w.message)]
    assert len(texts) == 2, [str(w.message) for w in caught]
    assert f"no space left in the run folder {url} to save ckpt-000001" in texts[0]
    assert " free)" in texts[0] and "training goes on" in texts[0] and "\n" not in texts[0]
    assert run.callback.epochs_done == 2 and RunStorage(url).list() == []
    assert list(small_disk.rglob("*.keras")) == []  # the half-written file was removed
