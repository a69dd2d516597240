"""No token, upload session URL or signature in any error, warning or log line; no library tracebacks."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from storage_helpers import bad_service_account

from resumable.storage.errors import OneLineRedacted, redact

SECRETS = [
    "https://storage.googleapis.com/upload/storage/v1/b/b/o?uploadType=resumable&upload_id=ADPycdu9SECRET",
    "Authorization: Bearer ya29.a0AfB_SECRET-token",
    "token expired: ya29.c.b0Aaek_SECRET",
    "refresh_token 1//0gSECRET-refresh",
    "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=a%40b"
    "&X-Goog-Signature=SECRETsig",
    "https://x/?GoogleAccessId=a&Expires=1&Signature=SECRETsig",
    "https://www.googleapis.com/storage/v1/b?key=AIzaSECRETkey",
    "POST /token access_token=SECRETaccess&x=1",
]


@pytest.mark.parametrize("text", SECRETS)
def test_redact_removes_every_kind_of_secret(text: str) -> None:
    assert "SECRET" not in redact(text) and "<redacted>" in redact(text)


def test_gcsfs_tracebacks_become_one_redacted_line(capsys: pytest.CaptureFixture[str]) -> None:
    """gcsfs logs each failed retry loop with logger.exception; the error raised after says it all."""
    import gcsfs.retry

    import resumable.storage.folder  # noqa: F401  (installs the filter, as any use of storage does)

    @gcsfs.retry.retry_request(retries=1)
    async def refused() -> None:
        raise gcsfs.retry.HttpError({"code": 401, "message": "Invalid Credentials ya29.SECRET"})

    handler = logging.StreamHandler(sys.stderr)  # what a notebook or a script with basicConfig shows
    logging.getLogger("gcsfs").addHandler(handler)
    try:
        with pytest.raises(gcsfs.retry.HttpError):
            asyncio.run(refused())
    finally:
        logging.getLogger("gcsfs").removeHandler(handler)
    err = capsys.readouterr().err
    assert "out of retries" in err and "HttpError" in err
    assert "Traceback" not in err and "SECRET" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_filter_keeps_a_plain_record_whole() -> None:
    record = logging.LogRecord("resumable", logging.WARNING, __file__, 1, "saved %s in %d s", ("x", 3), None)
    assert OneLineRedacted().filter(record) and record.getMessage() == "saved x in 3 s"


@pytest.mark.parametrize("command", [["list"], ["prune", "--keep-last", "1", "--yes"]])
def test_a_failing_token_refresh_is_one_line_from_every_command(
        gcs_bucket: str, tmp_path: Path, refusing_token_server: str, command: list[str]) -> None:
    key = bad_service_account(tmp_path, refusing_token_server)
    env = dict(os.environ, GOOGLE_APPLICATION_CREDENTIALS=str(key))
    env.pop("FSSPEC_GCS_TOKEN", None)  # real credentials, refused by the token endpoint
    argv = [sys.executable, "-m", "resumable", command[0], f"{gcs_bucket}/runs/x", *command[1:]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "not authenticated" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_403_on_upload_is_a_permission_error_without_the_session_url(tmp_path: Path) -> None:
    """A server refusing the upload session's PUT; its answer quotes the session URL back."""
    import http.server
    import json
    import threading

    import requests

    from resumable.core.errors import StoragePermissionError
    from resumable.storage import gcs_upload
    from resumable.storage.errors import translate

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"error": {"code": 403, "message": f"no write access to {self.path}"}}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    session = f"http://127.0.0.1:{server.server_address[1]}/upload?uploadType=resumable&upload_id=SECRETid"
    local = tmp_path / "one"
    local.write_bytes(b"1")
    try:
        with open(local, "rb") as source, pytest.raises(Exception) as caught:
            gcs_upload._send(requests.Session(), session, gcs_upload._Body(source, 1, local, lambda: None,
                                                                            lambda n: None))
    finally:
        server.shutdown()
        server.server_close()
    error = translate(caught.value, "gs://b/run/ckpt-000001/model.keras", "gs://b/run", "b/run",
                      is_gcs=True, is_local=False)
    assert isinstance(error, StoragePermissionError)
    assert "SECRET" not in str(caught.value) and "SECRET" not in str(error)
    assert str(error).startswith("gs://b/run/ckpt-000001/model.keras: permission denied")
