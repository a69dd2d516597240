"""Big files to GCS as one resumable-upload request each, streamed a piece at a time.

Why not gcsfs' file object (``fs.open(path, "wb")``): it gathers a block in memory and hands
each block to asyncio in one write; measured for a 288 MB file, that cost the uploading
process about 1.7 s of CPU, and the hold during saves (`Uploader.paused`) cannot stop a block
already handed over. Why not google-cloud-storage's chunked upload: each chunk is a request
of its own, read whole into memory and waited for, so small chunks cost a round trip each and
big ones hold their size in memory. Here one session is started with
``Blob.create_resumable_upload_session`` (public; it carries the credentials, ``userProject``
and the emulator's address) and its body goes in one PUT, the documented way to complete such a
session, from an iterable that reads the file a piece at a time in the calling thread: one
piece in memory, ``before_piece`` (where a background upload waits while a checkpoint is
serialized) runs before each, so the hold acts between any two pieces. Google's advice is the
same: upload in one request unless the data is produced on the fly.

A request that fails is retried whole by the caller (`RunStorage`'s retry policy), in a new
session; an unfinished session never becomes a visible object. The session's URL lets anyone
holding it write the object: it appears in no message raised here (`errors.redact`).

Public API relied on: ``Blob.create_resumable_upload_session``, google-auth's
``AuthorizedSession`` (a requests session), requests' streaming of an iterable body with a
length, ``google.api_core.exceptions.from_http_status``.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from resumable.core.checksum import RunningCrc32c
from resumable.storage.errors import redact
from resumable.storage.gcs_client import client_for
from resumable.storage.retry import time_left

PIECE_SIZE = 1024 * 1024  # bytes per socket write: small enough to copy cheaply, big enough to be few
SESSION_TIMEOUT = 60.0  # seconds to start a session
BODY_TIMEOUT = (60.0, 300.0)  # seconds to connect, and for each socket operation (GCS answers once all is in)


class NotStreamable(Exception):
    """This bucket takes no JSON-API uploads (a zonal bucket, written over gRPC): use gcsfs' own writer."""


def upload(fs: Any, local: Path, remote: str, *, before_piece: Callable[[], None],
           on_sent: Callable[[int], None]) -> tuple[int, str]:
    """Send ``local`` to ``remote`` (a gcsfs path); return the size and CRC32C of what was sent.

    ``before_piece`` runs in this thread before each piece is read, ``on_sent(n)`` after each is
    sent; what they raise is raised as it is. Raises google.api_core's errors for HTTP failures
    (``.code`` is the status), requests' for broken connections, `NotStreamable` for a zonal bucket.
    """
    gcs = client_for(fs)
    bucket, key, _ = fs.split_path(remote)
    if gcs.is_zonal(bucket):
        raise NotStreamable(bucket)
    size = local.stat().st_size
    try:
        with open(local, "rb") as source:
            body = _Body(source, size, local, before_piece, on_sent)
            session = gcs.bucket(bucket).blob(key).create_resumable_upload_session(
                content_type="application/octet-stream", size=size, timeout=time_left(SESSION_TIMEOUT),
                checksum=None, retry=None,  # the caller checks the CRC32C and decides on retries
            )
            _send(gcs.session, session, body)
        return body.sent, body.checksum.hex()
    finally:
        fs.invalidate_cache(remote)


def _send(http: Any, session: str, body: _Body) -> None:
    """PUT the whole body to the session in one request; raise unless the object was created."""
    import requests
    from google.api_core.exceptions import from_http_status

    size = len(body)
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Range": f"bytes 0-{size - 1}/{size}" if size else "bytes */0",
    }
    try:
        # A 308 answers an unfinished upload, without a Location: not a redirect to follow.
        response = http.put(session, data=body if size else b"", headers=headers,  # len 0: chunked otherwise
                            timeout=tuple(time_left(t) for t in BODY_TIMEOUT), allow_redirects=False)
    except _PieceFailed:
        assert body.error is not None
        raise body.error from None  # what before_piece or the file raised, as it was
    except requests.RequestException as e:  # their messages name the URL, upload_id included
        raise type(e)(redact(str(e), session)) from None
    with response:
        if response.status_code == 308:
            got = response.headers.get("Range", "nothing")
            raise OSError(errno.EIO, f"upload unfinished: the server holds {got} of {size} bytes")
        if not 200 <= response.status_code < 300:
            raise from_http_status(response.status_code, f"upload refused: {_reason(response, session)}")
    if body.sent != size:  # the server finished the object without asking for all of it
        raise OSError(errno.EIO, f"upload ended after {body.sent} of {size} bytes")


def _reason(response: Any, session: str) -> str:
    """The error's message from a GCS answer, one line, without the session's URL."""
    try:
        reason = str(response.json()["error"]["message"])
    except Exception:
        reason = response.text[:200] or response.reason or ""
    return " ".join(redact(reason, session).split())


class _Body:
    """The request's body: the file a piece at a time, read when the connection asks for the next.

    Its length makes requests send Content-Length and the pieces as they come, without chunked
    encoding. It can be iterated once: a resend (requests retrying after refreshing a token)
    fails, and the caller's retry starts a new session.
    """

    def __init__(self, source: BinaryIO, size: int, local: Path, before_piece: Callable[[], None],
                 on_sent: Callable[[int], None]) -> None:
        self.source, self.size, self.local = source, size, local
        self.before_piece, self.on_sent = before_piece, on_sent
        self.checksum = RunningCrc32c()
        self.sent = 0
        self.error: Exception | None = None  # what a piece raised, for `_send` to raise unwrapped
        self.started = False

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes]:
        if self.started:
            self.error = OSError(errno.EIO, "the upload's body was asked for twice; starting over")
            raise _PieceFailed
        self.started = True
        return self._pieces()

    def _pieces(self) -> Iterator[bytes]:
        try:
            while self.sent < self.size:
                self.before_piece()
                piece = _read(self.source, min(PIECE_SIZE, self.size - self.sent), self.local)
                self.checksum.update(piece)
                yield piece  # resumes once the connection has taken it
                self.sent += len(piece)
                self.on_sent(len(piece))
        except Exception as e:
            # Raised past urllib3 as a type it neither wraps nor swallows (it ignores a
            # BrokenPipeError from the body and waits for an answer that never comes).
            self.error = e
            raise _PieceFailed from e


class _PieceFailed(Exception):
    """Carries an error of the body out of requests; `_send` raises the original."""


def _read(source: BinaryIO, length: int, local: Path) -> bytes:
    piece = source.read(length)
    if len(piece) < length:
        raise OSError(errno.EIO, f"{local} got shorter while it was being uploaded")
    return piece
