"""The run folder (storage/folder.py): URLs that are no run folder, credentials, Drive's defaults."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import stage

from resumable import (
    Manifest,
    NotAFolderError,
    NotAuthenticatedError,
    ResumableError,
    RunNotFoundError,
    RunStorage,
)

# ----------------------------------------------------------------- errors


def test_run_url_that_is_a_file(run_url: str) -> None:
    storage = RunStorage(run_url)
    if storage.is_local:
        Path(storage.root).parent.mkdir(parents=True, exist_ok=True)
    storage.fs.pipe_file(storage.root, b"not a folder")
    for call in (storage.list, storage.latest, storage.exists, lambda: storage.get("ckpt-000001"),
                 lambda: storage.list(check_files=False)):
        with pytest.raises(NotAFolderError, match="is a file, not a run folder") as caught:
            call()
        assert run_url in str(caught.value) and "\n" not in str(caught.value)
        assert isinstance(caught.value, NotADirectoryError)


def test_missing_bucket(gcs_server: str, tmp_path: Path) -> None:
    storage = RunStorage("gs://no-such-bucket-4c1d/runs/exp1")
    started = time.monotonic()
    for call in (
        storage.list,
        lambda: storage.list(check_files=False),
        storage.latest,
        storage.exists,
        lambda: storage.commit(stage(tmp_path / "s"), "ckpt-000001", Manifest(epoch=1)),
    ):
        with pytest.raises(RunNotFoundError) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and "gs://no-such-bucket-4c1d" in message and "bucket" in message
        assert isinstance(caught.value, FileNotFoundError)
    assert time.monotonic() - started < 5


def test_missing_local_folder_is_an_empty_run(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "not" / "yet"))
    assert storage.list() == [] and storage.latest() is None and storage.exists() is False
    assert storage.list(check_files=False) == []


def test_empty_url_is_refused() -> None:
    with pytest.raises(ResumableError, match="empty"):
        RunStorage("")


def _bad_service_account(tmp_path: Path, token_uri: str) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = tmp_path / "service-account.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "k",
                "private_key": key.decode(),
                "client_email": "nobody@p.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )
    return path


@pytest.fixture
def refusing_token_server() -> Iterator[str]:
    """A token endpoint on 127.0.0.1 that answers every refresh with 400 invalid_grant."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps(
                {"error": "invalid_grant", "error_description": "Invalid JWT\nSignature."}
            ).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("in_colab", [False, True])
def test_not_authenticated_fails_fast_with_one_line(
    gcs_bucket: str,
    tmp_path: Path,
    refusing_token_server: str,
    monkeypatch: pytest.MonkeyPatch,
    in_colab: bool,
) -> None:
    """gcsfs alone retries a failed token refresh for over 30 s; we refresh once and say what to do."""
    import gcsfs

    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(_bad_service_account(tmp_path, refusing_token_server))
    )
    monkeypatch.delenv("FSSPEC_GCS_TOKEN", raising=False)
    if in_colab:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261101-060000_RC00")
    else:
        monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
        monkeypatch.delenv("COLAB_GPU", raising=False)
    gcsfs.GCSFileSystem.clear_instance_cache()
    url = f"{gcs_bucket}/runs/exp1"
    storage = RunStorage(url, storage_options={"token": "google_default"})
    assert storage.fs.credentials.method == "google_default"  # real credentials, not anon
    started = time.monotonic()
    with pytest.raises(NotAuthenticatedError) as caught:
        storage.latest()
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert (
        message.startswith(f"{url}: not authenticated") and "\n" not in message and "invalid_grant" in message
    )
    assert ("authenticate_user()" in message) is in_colab
    assert isinstance(caught.value, PermissionError)
    gcsfs.GCSFileSystem.clear_instance_cache()


# ----------------------------------------------------------------- defaults


def test_truncate_before_delete_defaults_to_drive_only(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from resumable.storage import mounts

    (tmp_path / "mountinfo").write_text("90 1 0:50 / /content/drive rw - fuse.drive drive rw\n")
    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "mountinfo"))  # Drive mounted: see test_mounts.py
    assert RunStorage(str(tmp_path)).truncate_before_delete is False
    assert RunStorage("/content/drive/MyDrive/runs/exp1").truncate_before_delete is True
    assert RunStorage("memory://content/drive/x").truncate_before_delete is False
