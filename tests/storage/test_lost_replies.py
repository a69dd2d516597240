"""Uploads whose reply is lost after GCS applied them: the bucket is asked, never guessed.

The real fake-gcs-server behind `fault_proxy.FaultProxy`. A small file goes up through gcsfs'
resumable session (its final chunk re-sent to the finished session meets a 404), a big one as
resumable's own streamed PUT (`gcs_upload`). Each fault hits the request that finishes the
upload of one file, after the server made the object, or before (a reset). What must hold:
the commit lands whole, never "not found" for the file just written, and an object that is
not the one sent is never kept (`landed.settle`).
"""

from __future__ import annotations

import errno
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import FaultProxy, Rule
from test_faulty_uploads import staged, streamed_and_quick, through  # noqa: F401 - a fixture

from resumable import Manifest
from resumable.storage import landed

FINAL = {  # which file's finishing request fails: gcsfs' session (small) or the streamed PUT (big)
    "small": "state.json&upload_id=",
    "big": "model.keras&upload_id=",
}
FAULTS = {
    "lost-answer": {"action": "lost-answer"},
    "truncated-answer": {"action": "truncate"},
    "503-after-the-write": {"action": 503, "applied": True},
    "reset-before-the-write": {"action": "reset"},
}
CASES = [pytest.param(file, fault, id=f"{size}-{name}") for size, file in FINAL.items()
         for name, fault in FAULTS.items()] + [
    # the streamed PUT waits 2 s for its answer here (gcsfs' small uploads, minutes: not tried)
    pytest.param(FINAL["big"], {"action": "late-answer", "seconds": 4.0}, id="big-answer-too-late"),
]


@pytest.fixture
def proxy(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server) as running:
        yield running


@pytest.mark.parametrize(("file", "fault"), CASES)
def test_a_lost_final_reply_commits_the_checkpoint(proxy: FaultProxy, gcs_bucket: str, tmp_path: Path,
                                                   file: str, fault: dict[str, object]) -> None:
    proxy.add(Rule(match=file, final_chunk=True, times=1, **fault))  # type: ignore[arg-type]
    storage = through(proxy, gcs_bucket)
    folder = staged(tmp_path, 1)
    info = storage.commit(folder, "ckpt-000001", Manifest(epoch=1, step=10))
    assert [s for s in proxy.seen if s[2] != "forwarded"], "the fault never happened"
    assert info.name == "ckpt-000001"
    assert [(i.name, i.status.value) for i in storage.list()] == [("ckpt-000001", "ok")]
    assert storage.verify("ckpt-000001") == []
    for rel in ("model.keras", "state.json"):
        assert storage.fs.cat_file(f"{storage.root}/ckpt-000001/{rel}") == (folder / rel).read_bytes()
    sessions = [s for s in proxy.seen if s[0] == "PUT" and "model.keras" in s[1]]
    if file == FINAL["big"] and fault["action"] != "reset":
        assert len(sessions) == 1  # the object the server made was kept, not sent again


@pytest.mark.parametrize("size", [3000, 3 * 2**20], ids=["small", "big"])
def test_a_single_file_whose_final_reply_is_lost_lands(proxy: FaultProxy, gcs_bucket: str, tmp_path: Path,
                                                       size: int) -> None:
    """A single file (ModelCheckpoint's ``model.keras`` on gs://) goes up through the same path."""
    import gcsfs

    from resumable.storage.single_file import FileTarget

    gcsfs.GCSFileSystem.clear_instance_cache()
    local = tmp_path / "model.keras"
    local.write_bytes(random.Random(size).randbytes(size))
    proxy.add(Rule("lost-answer", match="model.keras&upload_id=", final_chunk=True, times=1))
    target = FileTarget(f"{gcs_bucket}/models/model.keras",
                        storage_options={"token": "anon", "endpoint_url": proxy.url})
    record = target.land(local, {})
    assert proxy.outcomes("lost-answer"), "the fault never happened"
    assert record.size == size and target.verify() == record
    assert target.folder.fs.cat_file(target.path) == local.read_bytes()


def test_a_lost_reply_at_each_request_of_a_save_commits_or_leaves_a_clean_partial(
        proxy: FaultProxy, gcs_bucket: str, tmp_path: Path) -> None:
    """Each request of a save in turn loses its reply after the server applied it, with one retry
    left: the checkpoint is committed whole, or partial; never corrupt, never a second manifest."""
    from resumable.storage.retry import RetryPolicy

    folder = tmp_path / "small"
    folder.mkdir()
    (folder / "model.keras").write_bytes(random.Random(1).randbytes(3000))
    (folder / "state.json").write_bytes(b'{"epoch": 1}')
    through(proxy, gcs_bucket).commit(folder, "ckpt-000000", Manifest(epoch=0, step=0))
    requests = len(proxy.seen)
    outcomes = []
    for nth in range(1, requests + 1):
        proxy.clear()
        proxy.seen.clear()
        proxy.add(Rule("lost-answer", nth=nth, times=1))
        storage = through(proxy, gcs_bucket)
        storage.retry = RetryPolicy(attempts=2, initial_delay=0.05)
        name = f"ckpt-{nth:06d}"
        try:
            storage.commit(folder, name, Manifest(epoch=nth, step=10 * nth))
        except Exception as e:  # noqa: BLE001 - what matters is what the bucket holds
            assert "\n" not in str(e) and "not found" not in str(e), f"request {nth}: {e}"
        status = {c.name: c.status.value for c in storage.list()}.get(name, "absent")
        outcomes.append(status)
        assert status in ("ok", "partial", "absent"), f"lost reply of request {nth}: {status}"
        if status == "ok":
            assert storage.verify(name) == []
    assert outcomes == ["ok"] * requests  # each lost reply is ridden out: the bucket was asked


# ----------------------------------------------------------------------------- the decision itself


@pytest.fixture
def fs_and_file(gcs_bucket: str, tmp_path: Path) -> tuple[object, Path, str]:
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    fs = gcsfs.GCSFileSystem(token="anon")
    local = tmp_path / "state.json"
    local.write_bytes(random.Random(7).randbytes(5000))
    return fs, local, f"{gcs_bucket}/run/ckpt-000001/state.json"


GONE = FileNotFoundError("the session's URL")  # what gcsfs raises for a finished session's 404
RESET = ConnectionResetError(errno.ECONNRESET, "reset")


def test_the_object_sent_is_kept(fs_and_file: tuple[object, Path, str]) -> None:
    fs, local, remote = fs_and_file
    fs.pipe_file(remote, local.read_bytes())  # type: ignore[attr-defined]
    for error in (GONE, RESET):
        size, _ = landed.settle(fs, local, remote, error)
        assert size == 5000


@pytest.mark.parametrize("stored", [None, b"x" * 10, b"y" * 5000], ids=["absent", "shorter", "other-bytes"])
def test_an_object_that_is_not_the_one_sent_is_never_kept(fs_and_file: tuple[object, Path, str],
                                                          stored: bytes | None) -> None:
    fs, local, remote = fs_and_file
    if stored is not None:
        fs.pipe_file(remote, stored)  # type: ignore[attr-defined]
    with pytest.raises(landed.SessionGone) as caught:  # transient: the retry uploads again
        landed.settle(fs, local, remote, GONE)
    assert caught.value.errno == errno.EIO and "uploading again" in str(caught.value)
    with pytest.raises(ConnectionResetError):  # a transient error stays itself: retried as before
        landed.settle(fs, local, remote, RESET)


def test_a_404_from_a_missing_bucket_stays_not_found(fs_and_file: tuple[object, Path, str],
                                                     tmp_path: Path) -> None:
    from google.api_core.exceptions import NotFound

    from resumable.core.errors import RunNotFoundError
    from resumable.storage.errors import translate

    fs, local, _ = fs_and_file
    remote = "no-such-bucket-51ab/run/ckpt-000001/state.json"
    with pytest.raises(NotFound) as caught:
        landed.settle(fs, local, remote, GONE)
    run = "gs://no-such-bucket-51ab/run"
    said = translate(caught.value, f"{run}/ckpt-000001/state.json", run, run[5:], is_gcs=True, is_local=False)
    assert isinstance(said, RunNotFoundError)
    assert "does the bucket gs://no-such-bucket-51ab exist" in str(said)


def test_only_errors_that_may_hide_a_write_are_looked_into() -> None:
    assert landed.reply_may_be_lost(GONE) and landed.reply_may_be_lost(RESET)
    assert not landed.reply_may_be_lost(PermissionError("forbidden"))
    assert not landed.reply_may_be_lost(ValueError("bad"))


@pytest.mark.parametrize("fault", [{"action": "lost-answer"}, {"action": 503, "applied": True},
                                   {"action": "truncate"}], ids=["lost-answer", "503-after", "truncated"])
@pytest.mark.parametrize("what", ["leftovers", "retention"])
def test_a_delete_whose_reply_was_lost_is_done(proxy: FaultProxy, gcs_bucket: str, tmp_path: Path,
                                               what: str, fault: dict[str, object]) -> None:
    """A DELETE that landed, its reply lost: the retry meets 404, which means deleted, not
    "not found". Found by tests/keras/test_fault_soak.py (seed 11): the leftovers of a killed
    save met it, and the save failed with "ckpt-000001/model.keras: not found"."""
    storage = through(proxy, gcs_bucket)
    storage.commit(staged(tmp_path / "one", 1), "ckpt-000001", Manifest(epoch=1, step=10))
    if what == "leftovers":  # a killed save's file, no manifest: the next commit of the name clears it
        storage.fs.pipe_file(f"{storage.root}/ckpt-000002/model.keras", b"half")
        proxy.add(Rule(method="DELETE", match="ckpt-000002%2Fmodel.keras", times=1, **fault))  # type: ignore[arg-type]
        storage.commit(staged(tmp_path / "two", 2), "ckpt-000002", Manifest(epoch=2, step=20))
    else:
        proxy.add(Rule(method="DELETE", match="ckpt-000001%2Fmodel.keras", times=1, **fault))  # type: ignore[arg-type]
        storage.delete("ckpt-000001")
    assert [s for s in proxy.seen if s[2] != "forwarded"], "the fault never happened"
    statuses = [(i.name, i.status.value) for i in storage.list()]
    assert statuses == ([("ckpt-000001", "ok"), ("ckpt-000002", "ok")] if what == "leftovers" else [])
