"""Hostile run folders: JSON files that a hand edit, another tool's bug or an attacker left.

A real run folder (three checkpoints committed by RunStorage) gets one hostile file at a time:
a manifest, the run index, the writer lease or a single file's checksum record. Each bad
manifest must read as `corrupt` with one line, and `list`, `verify`, `prune`, retention and the
newest-good search must go on with the good checkpoints; never a traceback, never a good
checkpoint deleted because of it. docs/format.md ("What readers refuse") lists the rules.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import commit, put_raw, raw, summary

from resumable import CorruptCheckpointError, RunStorage
from resumable.cli.app import main
from resumable.core.checksum import crc32c_of_file
from resumable.core.manifest import MANIFEST_NAME, FileEntry, Manifest
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager
from resumable.storage import run_index
from resumable.storage.lease import LEASE_NAME, Lease, LeaseInfo, read_lease
from resumable.storage.records import Status
from resumable.storage.single_file import FileRecord, FileTarget, record_name

GOOD = ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
HOSTILE = "ckpt-000004"  # newer than every good one: what resume() and retention look at first
MODEL = b"weights" * 100
KERAS = {"resumable": "0.1.0", "keras": "3.15.1"}


def manifest(epoch: int) -> Manifest:
    return Manifest(epoch=epoch, step=epoch * 10, metrics={"loss": 1.0 / epoch, "val_loss": 2.0 / epoch},
                    versions=KERAS, state={"monitor": "val_loss", "mode": "min"}, payload="model.keras")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with three good checkpoints and its index, committed once for the module."""
    tmp = tmp_path_factory.mktemp("template")
    storage = RunStorage(str(tmp / "run"))
    for epoch in (1, 2, 3):
        files = {"model.keras": MODEL, "state.json": b"{}"}
        commit(storage, tmp, f"ckpt-{epoch:06d}", manifest(epoch), files)
    assert [i.name for i in storage.list() if i.ok] == GOOD
    return tmp / "run"


@pytest.fixture
def run(template: Path, tmp_path: Path) -> Path:
    shutil.copytree(template, tmp_path / "run")
    return tmp_path / "run"


def good_manifest_data(epoch: int = 4) -> dict[str, Any]:
    data = manifest(epoch).to_dict()
    data["files"] = {"model.keras": {"size": len(MODEL), "crc32c": crc32c_of_bytes(MODEL)}}
    return data


def crc32c_of_bytes(data: bytes) -> str:
    import google_crc32c

    return google_crc32c.Checksum(data).digest().hex()


def with_fields(**changes: Any) -> bytes:
    data = good_manifest_data()
    data.update(changes)
    return json.dumps(data).encode()


def replaced(old: str, new: str) -> bytes:
    text = json.dumps(good_manifest_data())
    assert old in text
    return text.replace(old, new, 1).encode()


def put_checkpoint(run: Path, name: str, manifest_bytes: bytes) -> None:
    """A checkpoint folder as a hostile writer leaves it: its payload, and the manifest given."""
    (run / name).mkdir()
    (run / name / "model.keras").write_bytes(MODEL)
    (run / name / MANIFEST_NAME).write_bytes(manifest_bytes)


# Each hostile manifest, with a fragment of the one line that says why it is corrupt.
HOSTILE_MANIFESTS = {
    "nested-100000-deep": (with_fields(state=None)[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                           "nested too deep"),
    "nested-65-deep": (with_fields(state={"a": json.loads("[" * 65 + "]" * 65)}), "more than 64 levels"),
    "epoch-nan": (replaced('"epoch": 4', '"epoch": NaN'), "holds NaN"),
    "metric-infinity": (replaced('"loss": 0.25', '"loss": Infinity'), "holds Infinity"),
    "metric-minus-infinity": (replaced('"loss": 0.25', '"loss": -Infinity'), "holds -Infinity"),
    "step-1e400": (replaced('"step": 40', '"step": 1e400'), "too large for a float"),
    "epoch-400-digits": (replaced('"epoch": 4', '"epoch": ' + "9" * 400), "integer of 400 digits"),
    "step-5000-digits": (replaced('"step": 40', '"step": ' + "9" * 5000), "integer of 5000 digits"),
    "epoch-string": (with_fields(epoch="4"), "epoch: expected an integer >= 0, got '4'"),
    "epoch-float": (with_fields(epoch=3.5), "epoch: expected an integer >= 0, got 3.5"),
    "epoch-true": (with_fields(epoch=True), "epoch: expected an integer >= 0, got True"),
    "step-negative": (with_fields(step=-1), "step: expected an integer >= 0, got -1"),
    "size-negative": (with_fields(files={"model.keras": {"size": -1, "crc32c": "00000000"}}),
                      "size: expected an integer >= 0"),
    "files-not-object": (with_fields(files=["model.keras"]), "files: expected an object"),
    "file-entry-not-object": (with_fields(files={"model.keras": 700}), "expected an object with size"),
    "crc32c-7-digits": (with_fields(files={"model.keras": {"size": len(MODEL), "crc32c": "0000000"}}),
                        "8 lowercase hex digits"),
    "duplicate-key": (replaced('"epoch": 4', '"epoch": 4, "epoch": 40'), "'epoch' twice"),
    "utf-16": (json.dumps(good_manifest_data()).encode("utf-16"), "UTF-16 or UTF-32"),
    "utf-32": (json.dumps(good_manifest_data()).encode("utf-32-le"), "UTF-16 or UTF-32"),
    "files-empty": (with_fields(files={}, payload=None), "lists no file"),
    "keras-without-a-model-file": (
        with_fields(files={"notes.txt": good_manifest_data()["files"]["model.keras"]}, payload=None),
        "written by Keras but lists neither model.keras nor model.weights.h5"),
    "payload-not-listed": (with_fields(payload="model.weights.h5"), "'model.weights.h5' is not among"),
}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err == "", err  # a corrupt checkpoint is reported in the output, never as an error
    return code, out


def check_run_survives(run: Path, capsys: pytest.CaptureFixture[str], hostile: str, reason: str) -> None:
    """Every reader reports ``hostile`` as corrupt in one line and goes on with the good ones."""
    url = str(run)
    storage = RunStorage(url)
    for infos in (storage.list(), storage.list(check_files=False)):
        assert {i.name: i.status for i in infos} == {**{n: Status.OK for n in GOOD}, hostile: Status.CORRUPT}
        [bad] = [i for i in infos if not i.ok]
        assert reason in bad.problem and "\n" not in bad.problem and len(bad.problem) < 300
    assert next(storage.newest_first()).name == "ckpt-000003"
    warnings: list[str] = []
    found = RunManager(url, staging_dir=run.parent / "staging").fetch_newest(warn=warnings.append)
    assert found is not None and found[0].name == "ckpt-000003"

    for argv in (["list", url], ["list", url, "--deep"], ["inspect", url, "--name", hostile]):
        code, out = cli(capsys, *argv)
        assert code == 0 and "corrupt" in out
    code, out = cli(capsys, "verify", url)
    assert code == 1 and f"CORRUPT  {hostile}" in out and "verified" not in out
    assert sum(line.startswith("ok ") for line in out.splitlines()) == 3
    code, out = cli(capsys, "list", url, "--json")
    assert code == 0 and json.loads(out)["latest"] == "ckpt-000003"
    # Retention keeps the newest good checkpoint: never the unusable one in its place.
    code, out = cli(capsys, "prune", url, "--keep-last", "1", "--yes")
    assert code == 0
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["ckpt-000003", hostile]
    assert [i.name for i in storage.list() if i.ok] == ["ckpt-000003"]


@pytest.mark.parametrize(("data", "reason"), HOSTILE_MANIFESTS.values(), ids=HOSTILE_MANIFESTS.keys())
def test_a_hostile_manifest_is_one_corrupt_line_and_the_rest_of_the_run_goes_on(
        run: Path, capsys: pytest.CaptureFixture[str], data: bytes, reason: str) -> None:
    put_checkpoint(run, HOSTILE, data)
    check_run_survives(run, capsys, HOSTILE, reason)


def test_without_the_checks_an_unusable_manifest_would_have_been_the_latest_good(run: Path) -> None:
    """The test above can fail: a manifest listing no model file but a file that checks out is
    otherwise a good checkpoint, and the newest one."""
    data = good_manifest_data()
    data["files"] = {"notes.txt": data["files"]["model.keras"]}
    del data["payload"]
    (run / HOSTILE).mkdir()
    (run / HOSTILE / "notes.txt").write_bytes(MODEL)
    (run / HOSTILE / MANIFEST_NAME).write_text(json.dumps(data))
    [info] = [i for i in RunStorage(str(run)).list() if i.name == HOSTILE]
    assert info.status is Status.CORRUPT and "lists neither model.keras" in info.problem
    del data["versions"]["keras"]  # another writer's: any files will do
    (run / HOSTILE / MANIFEST_NAME).write_text(json.dumps(data))
    [info] = [i for i in RunStorage(str(run)).list() if i.name == HOSTILE]
    assert info.ok


def test_an_older_hostile_manifest_is_corrupt_and_pruned_the_others_stay(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "ckpt-000002" / MANIFEST_NAME).write_bytes(b"[" * 50_000 + b"]" * 50_000)
    storage = RunStorage(str(run))
    assert [(i.name, i.status) for i in storage.list()] == [
        ("ckpt-000001", Status.OK), ("ckpt-000002", Status.CORRUPT), ("ckpt-000003", Status.OK)]
    code, out = cli(capsys, "prune", str(run), "--yes")
    assert code == 0 and "deleted 1 checkpoint" in out
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["ckpt-000001", "ckpt-000003"]


def test_a_400_mb_manifest_is_corrupt_and_never_read(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put_checkpoint(run, HOSTILE, b"")
    with open(run / HOSTILE / MANIFEST_NAME, "r+b") as f:
        f.truncate(400 * 2**20)  # sparse: 400 MB by its size, nothing on disk
    tracemalloc.start()
    try:
        check_run_survives(run, capsys, HOSTILE, "manifest is 400.0 MB, larger than any real one")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20  # reading it would hold 400 MB


# ----------------------------------------------------------------------------- the run index

def index_text(run: Path) -> str:
    return (run / run_index.INDEX_NAME).read_text()


def in_text(old: str, new: str) -> Any:
    def damage(text: str) -> str:
        assert old in text
        return text.replace(old, new, 1)
    return damage


def in_column(column: str, value: Any) -> Any:
    """The first checkpoint's value in ``column`` replaced."""
    def damage(text: str) -> str:
        raw = json.loads(text)
        raw[column][0] = value
        return json.dumps(raw)
    return damage


# Whole-file damage makes the index unusable; a bad value leaves its row out. Either way the
# folders are read from their manifests, and a quick `list` shows what a deep one shows.
HOSTILE_INDEXES = {
    "nested-100000-deep": lambda text: "[" * 100_000 + "]" * 100_000,
    "nan": in_text('"loss":1.0', '"loss":NaN'),
    "1e400-metric": in_text('"loss":1.0', '"loss":1e400'),
    "metric-huge-integer": in_text('"loss":1.0', '"loss":' + "9" * 400),
    "epoch-400-digits": in_text('"epoch":[1,', '"epoch":[' + "9" * 400 + ","),
    "epoch-5000-digits": in_text('"epoch":[1,', '"epoch":[' + "9" * 5000 + ","),
    "epoch-string": in_column("epoch", "1"),
    "epoch-float": in_column("epoch", 1.0),
    "epoch-true": in_column("epoch", True),
    "step-negative": in_column("step", -10),
    "manifest-size-negative": in_column("manifest_size", -1),
    "files-empty": in_column("files", {}),
    "files-not-object": in_column("files", ["model.keras"]),
    "file-size-negative": in_column("files", {"model.keras": [-1, "00000000"]}),
    "file-entry-deep": in_column("files", {"model.keras": json.loads("[" * 500 + "]" * 500)}),
    "columns-not-aligned": in_text('"step":[10,', '"step":['),
    "utf-16": lambda text: text.encode("utf-16"),
    "not-json": lambda text: text[: len(text) // 2],
}


@pytest.mark.parametrize("damage", HOSTILE_INDEXES.values(), ids=HOSTILE_INDEXES.keys())
def test_a_hostile_index_is_ignored_rebuilt_and_never_stops_retention(run: Path, damage: Any) -> None:
    damaged = damage(index_text(run))
    (run / run_index.INDEX_NAME).write_bytes(damaged if isinstance(damaged, bytes) else damaged.encode())
    storage = RunStorage(str(run))
    quick = storage.list(check_files=False)
    assert summary(quick) == summary(storage.list())  # sizes too: an empty row would be too small
    assert [i.name for i in quick if i.ok] == GOOD
    assert "ckpt-000001" in {i.name for i in quick if i.checked}  # its row was not trusted
    # The next commit mends the index from the manifests; retention deletes as planned.
    manager = RunManager(str(run), staging_dir=run.parent / "staging", async_upload=False,
                         retention=Retention(keep_last=2))
    manager.writer.acquire()
    try:
        stage = manager.writer.stage(HOSTILE)
        stage.mkdir(parents=True)
        (stage / "model.keras").write_bytes(MODEL)
        manager.writer.submit(stage, HOSTILE, manifest(4))
    finally:
        manager.release()
    assert [i.name for i in storage.list()] == ["ckpt-000003", HOSTILE]
    assert list(run_index.decode((run / run_index.INDEX_NAME).read_bytes())) == ["ckpt-000003", HOSTILE]


def test_a_400_mb_index_is_ignored_and_read_only_to_its_limit(run: Path) -> None:
    with open(run / run_index.INDEX_NAME, "r+b") as f:
        f.truncate(400 * 2**20)
    storage = RunStorage(str(run))
    tracemalloc.start()
    try:
        infos = storage.list(check_files=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [i.name for i in infos if i.ok] == GOOD and all(i.checked for i in infos)  # read from manifests
    assert peak < run_index.INDEX_LIMIT + 32 * 2**20  # at most the limit, not 400 MB


# ----------------------------------------------------------------------------- the writer lease

def lease_data() -> dict[str, Any]:
    return {"format": "resumable.lease", "token": "5f0c9e7a", "host": "elsewhere", "pid": 4242,
            "started": "2026-11-22T06:10:03.125+00:00", "renewed": "2026-11-22T06:19:03.402+00:00",
            "timeout": 40.0, "process_start": None, "boot_id": None, "renew_interval": 10.0}


def lease_with(**changes: Any) -> bytes:
    return json.dumps({**lease_data(), **changes}).encode()


def lease_replaced(old: str, new: str) -> bytes:
    text = json.dumps(lease_data())
    assert old in text
    return text.replace(old, new, 1).encode()


HOSTILE_LEASES = {
    "nested-100000-deep": b"[" * 100_000 + b"]" * 100_000,
    "timeout-nan": lease_replaced('"timeout": 40.0', '"timeout": NaN'),
    "timeout-1e400": lease_replaced('"timeout": 40.0', '"timeout": 1e400'),
    "timeout-1e300": lease_with(timeout=1e300),  # no datetime holds renewed + 1e300 s
    "renewed-year-9999": lease_with(renewed="9999-12-31T23:59:59+00:00"),
    "pid-400-digits": lease_replaced('"pid": 4242', '"pid": ' + "9" * 400),
    "pid-2-to-the-70": lease_with(pid=2**70),  # os.kill() would raise OverflowError
    "pid-negative": lease_with(pid=-1),  # os.kill(-1, 0) asks about every process
    "pid-string": lease_with(pid="4242"),
    "token-list": lease_with(token=["a"]),
    "host-huge": lease_with(host="x" * 5000),
    "duplicate-token": lease_replaced('"token": "5f0c9e7a"', '"token": "5f0c9e7a", "token": "other"'),
    "utf-16": json.dumps(lease_data()).encode("utf-16"),
    "over-64-kib": lease_with(padding="x" * 70_000),
}


def test_the_lease_the_hostile_ones_start_from_reads_as_a_lease() -> None:
    info = LeaseInfo.from_json(json.dumps(lease_data()).encode())
    assert info is not None and (info.pid, info.timeout, info.renew_interval) == (4242, 40.0, 10.0)


@pytest.mark.parametrize("data", HOSTILE_LEASES.values(), ids=HOSTILE_LEASES.keys())
def test_a_hostile_lease_is_no_lease_and_is_taken_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, data: bytes) -> None:
    storage = RunStorage(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LEASE_NAME).write_bytes(data)
    long_ago = time.time() - 3600  # not a lease being written this very moment
    os.utime(tmp_path / "run" / LEASE_NAME, (long_ago, long_ago))
    assert LeaseInfo.from_json(data) is None
    assert read_lease(storage) is None
    lease = Lease(storage)
    with caplog.at_level(logging.WARNING, logger="resumable"):
        lease.acquire()
    try:
        assert "is not a readable lease; taking it over" in caplog.text
        found = read_lease(storage)
        assert found is not None and found.mine()
    finally:
        lease.release()


# ----------------------------------------------------------------------------- single files' records

def record_data() -> dict[str, Any]:
    return json.loads(FileRecord("best.keras", 3, "00000000", {"epoch": 2}).to_json())


HOSTILE_RECORDS = {
    "nested-100000-deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    "previous-chain-100-deep": (b'{"previous": ' * 100 + json.dumps(record_data()).encode() + b"}" * 100,
                                 "more than 64 levels"),
    "size-nan": (json.dumps(record_data()).replace('"size": 3', '"size": NaN').encode(), "holds NaN"),
    "size-1e400": (json.dumps(record_data()).replace('"size": 3', '"size": 1e400').encode(), "too large"),
    "size-string": (json.dumps({**record_data(), "size": "3"}).encode(), "size '3'"),
    "size-negative": (json.dumps({**record_data(), "size": -3}).encode(), "size -3"),
    "crc32c-9-digits": (json.dumps({**record_data(), "crc32c": "000000000"}).encode(), "8 lowercase hex"),
    "previous-list": (json.dumps({**record_data(), "previous": [1]}).encode(), "previous [1] is not an"),
    "not-an-object": (b"[1, 2]", "format"),
    "duplicate-size": (json.dumps(record_data()).replace('"size": 3', '"size": 3, "size": 3').encode(),
                       "'size' twice"),
    "utf-16": (json.dumps(record_data()).encode("utf-16"), "UTF-16 or UTF-32"),
    "over-1-mib": (json.dumps({**record_data(), "pad": "x" * 2**20}).encode(), "larger than any real one"),
}


@pytest.mark.parametrize(("data", "reason"), HOSTILE_RECORDS.values(), ids=HOSTILE_RECORDS.keys())
def test_a_hostile_checksum_record_is_one_line(tmp_path: Path, data: bytes, reason: str) -> None:
    (tmp_path / "best.keras").write_bytes(b"abc")
    (tmp_path / record_name("best.keras")).write_bytes(data)
    with pytest.raises(CorruptCheckpointError, match="unreadable checksum record") as caught:
        FileTarget(str(tmp_path / "best.keras")).read_record()
    text = str(caught.value)
    assert reason in text and "\n" not in text and len(text) < 400
    assert "delete .best.keras.resumable.json to load it unchecked" in text


def test_a_good_record_still_reads(tmp_path: Path) -> None:
    (tmp_path / record_name("best.keras")).write_bytes(FileRecord("best.keras", 3, "00000000", {}).to_json())
    record = FileTarget(str(tmp_path / "best.keras")).read_record()
    assert record is not None and (record.size, record.crc32c) == (3, "00000000")


def test_the_staged_files_agree_with_the_helpers(run: Path) -> None:
    """The hostile manifests above start from a good one: its model file's checksum is right."""
    assert crc32c_of_file(run / "ckpt-000001" / "model.keras") == crc32c_of_bytes(MODEL)
    (run / HOSTILE).mkdir()
    (run / HOSTILE / "model.keras").write_bytes(MODEL)
    (run / HOSTILE / MANIFEST_NAME).write_text(json.dumps(good_manifest_data()))
    info = RunStorage(str(run)).get(HOSTILE)
    assert info is not None and info.ok and info.manifest is not None
    assert info.manifest.files == {"model.keras": FileEntry(len(MODEL), crc32c_of_bytes(MODEL))}


def test_on_every_backend_hostile_manifests_and_index_are_read_bounded(run_url: str, tmp_path: Path) -> None:
    """Ranged reads on GCS and memory://, as locally: the same statuses everywhere."""
    storage = RunStorage(run_url)
    for epoch in (1, 2):
        commit(storage, tmp_path, f"ckpt-{epoch:06d}", manifest(epoch), {"model.keras": MODEL})
    put_raw(storage, MODEL, "ckpt-000003", "model.keras")
    put_raw(storage, with_fields(files={}, payload=None), "ckpt-000003", MANIFEST_NAME)
    put_raw(storage, MODEL, "ckpt-000004", "model.keras")
    put_raw(storage, b"[" * 100_000 + b"]" * 100_000, "ckpt-000004", MANIFEST_NAME)
    index = raw(storage, run_index.INDEX_NAME)
    put_raw(storage, index.replace(b'"loss":1.0', b'"loss":NaN'), run_index.INDEX_NAME)
    for infos in (storage.list(), storage.list(check_files=False)):
        assert [(i.name, i.status) for i in infos] == [
            ("ckpt-000001", Status.OK), ("ckpt-000002", Status.OK),
            ("ckpt-000003", Status.CORRUPT), ("ckpt-000004", Status.CORRUPT)]
    assert next(storage.newest_first()).name == "ckpt-000002"
    target = FileTarget(f"{run_url}/best.keras")
    put_raw(storage, json.dumps({**record_data(), "pad": "x" * 2**21}).encode(), record_name("best.keras"))
    with pytest.raises(CorruptCheckpointError, match="larger than any real one"):
        target.read_record()


@pytest.mark.parametrize("backend", ["local", "gcs"], indirect=True)
def test_a_huge_lease_is_read_no_further_than_the_limit(run_url: str) -> None:
    """A hostile lease.json of 8 MB: the reader takes READ_LIMIT + 1 bytes and treats it as no lease."""
    from resumable.storage.run_files import READ_LIMIT

    storage = RunStorage(run_url)
    assert storage.run_files.create_run_file("lease.json", b"[" + b" " * (8 * READ_LIMIT) + b"]") is not None
    found = storage.run_files.read_run_file("lease.json")
    assert found is not None and len(found[0]) == READ_LIMIT + 1
    if storage.is_local:  # written a minute ago: not a lease still being written (TORN_GRACE)
        past = time.time() - 60
        os.utime(os.path.join(storage.root, "lease.json"), (past, past))
    lease = Lease(storage)
    lease.acquire()  # a file that is no lease is taken over (it is old enough: not being written)
    assert lease.held
    lease.release()
