"""Big files to GCS: one streamed request per file, on the real fake-gcs-server; no Keras."""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_gcs import fake_gcs_server, point_gcs_clients_at, server_process
from paths import ROOT
from storage_helpers import staged_checkpoint

from resumable import RunStorage, Status
from resumable.core.checksum import crc32c_of_file
from resumable.core.errors import StorageError
from resumable.core.manifest import Manifest
from resumable.manager.uploader import Uploader
from resumable.storage import STREAM_MIN_BYTES
from resumable.storage.gcs_upload import PIECE_SIZE, upload
from resumable.storage.retry import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.01)
BIG = STREAM_MIN_BYTES + 12345  # not a whole number of pieces


def stage(root: Path, epoch: int, size: int = BIG) -> tuple[Path, str, Manifest, bytes]:
    payload = os.urandom(size)
    return (*staged_checkpoint(root, epoch, {"model.keras": payload}), payload)


class Pieces:
    """A ``between_chunks`` that records each piece; from piece ``fail_at`` on, fails ``failures`` times."""

    def __init__(self, fail_at: int | None = None, failures: int = 1,
                 error: Exception | None = None) -> None:
        self.times: list[float] = []
        self.fail_at = fail_at
        self.failures = failures
        self.error = error or OSError(errno.EIO, "Input/output error (injected)")

    def __call__(self) -> None:
        self.times.append(time.monotonic())
        if self.fail_at is not None and len(self.times) >= self.fail_at and self.failures:
            self.failures -= 1
            raise self.error


@pytest.mark.parametrize("size", [STREAM_MIN_BYTES, BIG])
def test_a_big_file_goes_up_streamed_and_checks_out(gcs_bucket: str, tmp_path: Path, size: int) -> None:
    storage = RunStorage(f"{gcs_bucket}/run")
    folder, name, manifest, payload = stage(tmp_path, 1, size)
    pieces = Pieces()
    info = storage.commit(folder, name, manifest, between_chunks=pieces)
    assert info.ok and storage.verify(name) == []
    assert len(pieces.times) == math.ceil(size / PIECE_SIZE)  # a hold is possible before each piece
    assert storage.fs.cat(f"{storage.root}/{name}/model.keras") == payload


def test_the_hold_stops_a_big_upload_between_two_pieces(gcs_bucket: str, tmp_path: Path) -> None:
    """A save that starts while a big file is half sent holds it until the save is done."""
    storage = RunStorage(f"{gcs_bucket}/run", retry=FAST_RETRY)
    reached, holding = threading.Event(), threading.Event()
    pieces: list[float] = []
    uploader: Uploader

    def between_chunks() -> None:
        pieces.append(time.monotonic())
        if len(pieces) == 3:  # two pieces are on their way: the request is open
            reached.set()
            assert holding.wait(30)
        uploader.between_chunks()

    uploader = Uploader(storage, commit=lambda *job: storage.commit(*job, between_chunks=between_chunks))
    folder, name, manifest, payload = stage(tmp_path, 1)
    uploader.commit_later(folder, name, manifest)
    assert reached.wait(30)
    with uploader.paused():
        holding.set()
        time.sleep(0.5)
        assert len(pieces) == 3 and uploader.in_progress(name)
        released = time.monotonic()
    assert uploader.wait(60)
    assert pieces[3] >= released  # the fourth piece went only after the save
    assert len(pieces) == math.ceil(BIG / PIECE_SIZE)
    assert storage.verify(name) == []
    assert storage.fs.cat(f"{storage.root}/{name}/model.keras") == payload


def test_an_upload_failing_midway_is_sent_again_whole(gcs_bucket: str, tmp_path: Path) -> None:
    storage = RunStorage(f"{gcs_bucket}/run", retry=FAST_RETRY)
    folder, name, manifest, payload = stage(tmp_path, 1)
    pieces = Pieces(fail_at=3)
    assert storage.commit(folder, name, manifest, between_chunks=pieces).ok
    assert len(pieces.times) == 3 + math.ceil(BIG / PIECE_SIZE)  # 2 sent, the 3rd failed, then all
    assert storage.verify(name) == []
    assert storage.fs.cat(f"{storage.root}/{name}/model.keras") == payload


def test_an_upload_that_keeps_failing_leaves_no_object_and_keeps_nothing_half_sent(
    gcs_bucket: str, tmp_path: Path
) -> None:
    storage = RunStorage(f"{gcs_bucket}/run", retry=FAST_RETRY)
    folder, name, manifest, _ = stage(tmp_path, 1)
    with pytest.raises(StorageError, match="Input/output error") as caught:
        storage.commit(folder, name, manifest, between_chunks=Pieces(fail_at=3, failures=99))
    assert "\n" not in str(caught.value)
    storage.fs.invalidate_cache()
    assert not storage.fs.exists(f"{storage.root}/{name}/model.keras")  # unfinished sessions show nothing
    assert storage.list() == []
    assert folder.is_dir()  # the local copy is kept for the next try


def test_a_broken_pipe_from_a_piece_is_raised_at_once(
    gcs_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """urllib3 swallows a BrokenPipeError met while sending and waits for an answer: not this one."""
    storage = RunStorage(f"{gcs_bucket}/run", retry=FAST_RETRY)
    folder, name, manifest, payload = stage(tmp_path, 1)
    pieces = Pieces(fail_at=3, error=BrokenPipeError(errno.EPIPE, "Broken pipe (injected)"))
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert storage.commit(folder, name, manifest, between_chunks=pieces).ok
    retried = [r.getMessage() for r in caplog.records if "retry 1 of" in r.getMessage()]
    assert len(retried) == 1 and "BrokenPipeError: [Errno 32] Broken pipe (injected)" in retried[0]
    assert storage.fs.cat(f"{storage.root}/{name}/model.keras") == payload


def test_upload_returns_what_it_sent_and_bills_the_user_project(gcs_bucket: str, tmp_path: Path) -> None:
    """The module on its own, with a requester-pays filesystem (userProject on each request)."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", project="my-project", requester_pays=True,
                             skip_instance_cache=True)
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(BIG))
    sent: list[int] = []
    remote = f"{gcs_bucket.removeprefix('gs://')}/big.bin"
    assert upload(fs, local, remote, before_piece=lambda: None, on_sent=sent.append) == (
        BIG, crc32c_of_file(local)
    )
    assert sum(sent) == BIG and len(sent) == math.ceil(BIG / PIECE_SIZE)
    assert fs.info(remote)["size"] == BIG  # gcsfs' cache was refreshed


def test_a_session_url_is_in_no_error(gcs_bucket: str, tmp_path: Path) -> None:
    """Its upload_id lets anyone write the object: a refused connection's error names the URL."""
    import gcsfs
    import requests

    from resumable.storage import gcs_client, gcs_upload

    fs = gcsfs.GCSFileSystem(token="anon")
    gcs = gcs_client.client_for(fs)
    session = gcs.bucket(gcs_bucket.removeprefix("gs://")).blob("x").create_resumable_upload_session(
        size=1, retry=None
    )
    upload_id = re.search(r"upload_id=([^&]+)", session)
    assert upload_id is not None
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = re.sub(r"//[^/]+/", f"//127.0.0.1:{s.getsockname()[1]}/", session)
    local = tmp_path / "one"
    local.write_bytes(b"1")
    with open(local, "rb") as source, pytest.raises(requests.ConnectionError) as caught:
        body = gcs_upload._Body(source, 1, local, lambda: None, lambda n: None)
        gcs_upload._send(gcs.session, dead, body)
    assert upload_id.group(1) not in str(caught.value) and "Connection refused" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_file_that_shrinks_while_sent_leaves_no_object(gcs_bucket: str, tmp_path: Path) -> None:
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon")
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(BIG))
    calls: list[int] = []

    def shrink() -> None:
        calls.append(1)
        if len(calls) == 3:
            os.truncate(local, PIECE_SIZE * 2 + 10)

    remote = f"{gcs_bucket.removeprefix('gs://')}/big.bin"
    with pytest.raises(OSError, match="got shorter while it was being uploaded") as caught:
        upload(fs, local, remote, before_piece=shrink, on_sent=lambda n: None)
    assert caught.value.errno == errno.EIO and type(caught.value) is OSError
    assert not fs.exists(remote)


def test_the_server_going_away_midway_is_one_clear_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real connection cut: the emulator is killed while the request streams."""
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    try:
        with fake_gcs_server() as endpoint:
            point_gcs_clients_at(endpoint)
            import gcsfs

            gcsfs.GCSFileSystem.clear_instance_cache()
            gcsfs.GCSFileSystem(token="anon").mkdir("doomed")
            storage = RunStorage("gs://doomed/run", retry=FAST_RETRY)
            folder, name, manifest, _ = stage(tmp_path, 1)
            killed = []

            def between_chunks() -> None:
                killed.append(1)
                if len(killed) == 3:
                    server_process(endpoint).kill()

            started = time.monotonic()
            with pytest.raises(StorageError) as caught, caplog.at_level(logging.DEBUG):
                storage.commit(folder, name, manifest, between_chunks=between_chunks)
            message = str(caught.value)
            assert "\n" not in message and "gs://doomed/run" in message
            assert time.monotonic() - started < 60
            assert folder.is_dir()
            ours = [r.getMessage() for r in caplog.records if r.name == "resumable"]
            assert len(ours) == FAST_RETRY.attempts - 1
            assert not any(re.search(r"upload_id=(?!<redacted>)", line) for line in [message, *ours])
    finally:
        if saved is not None:
            point_gcs_clients_at(saved)
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()


def test_a_verbose_big_upload_shows_its_progress(
    gcs_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = RunStorage(f"{gcs_bucket}/run")
    folder, name, manifest, _ = stage(tmp_path, 1)
    storage.commit(folder, name, manifest, progress=True)
    err = capsys.readouterr().err
    assert "resumable: upload model.keras" in err and "B/s" in err


KILLED_SCRIPT = """
import os, signal, sys
from pathlib import Path
from resumable import Manifest, RunStorage

url, staged = sys.argv[1], Path(sys.argv[2])
pieces = []

def between_chunks():
    pieces.append(1)
    if len(pieces) == 3:
        print("killing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

RunStorage(url).commit(staged, "ckpt-000002", Manifest(epoch=2), between_chunks=between_chunks)
"""


def test_a_process_killed_midway_through_a_big_upload_leaves_the_latest_intact(
    gcs_bucket: str, tmp_path: Path
) -> None:
    url = f"{gcs_bucket}/run"
    storage = RunStorage(url)
    first = stage(tmp_path, 1)
    storage.commit(*first[:3])
    second = stage(tmp_path, 2)
    env = dict(os.environ, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", KILLED_SCRIPT, url, str(second[0])], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL and "killing" in done.stdout, done.stderr
    storage = RunStorage(url)
    assert [(info.name, info.status) for info in storage.list()] == [("ckpt-000001", Status.OK)]
    assert storage.latest().name == "ckpt-000001" and storage.verify("ckpt-000001") == []
    assert storage.commit(*second[:3]).ok  # the same name goes up again
    assert storage.fs.cat(f"{storage.root}/ckpt-000002/model.keras") == second[3]
