"""Big files to GCS as one resumable-upload request each, streamed a piece at a time.

Why not gcsfs' file object (``fs.open(path, "wb")``): it gathers a block in memory and hands
each block to asyncio in one write. Measured here for a 288 MB file on Python 3.11, that costs
the uploading process about 1.7 s of CPU (asyncio copies the unsent rest of a big write into
fresh memory, again and again) and the emulator 4 s; the hold during saves (`Uploader.paused`)
cannot stop a block already handed over. Streaming 1 MiB pieces through one request costs
0.2 s and 1.7 s, keeps one piece in memory, and lets the hold act between any two pieces.
Google's own advice is the same: upload in one request unless the data is produced on the
fly. A request that fails is retried whole, by the caller (`RunStorage`'s retry policy), in a
new upload session; an unfinished session never becomes a visible object.

The calling thread reads the file and runs ``before_piece`` (where a background upload waits
while a checkpoint is serialized); gcsfs' event loop only sends. So the hold works exactly as it
did with gcsfs' file object, in the thread that called.

The requests go through gcsfs' own session, endpoint and credentials (``fs.session``,
``fs._location``, ``fs._get_headers``, ``fs._get_params``: private, so tests/test_gcs_upload.py
runs them against the installed gcsfs and fake-gcs-server).
"""

from __future__ import annotations

import asyncio
import errno
import queue
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from resumable.core.checksum import RunningCrc32c

PIECE_SIZE = 1024 * 1024  # bytes per socket write: small enough to copy cheaply, big enough to be few


class NotStreamable(Exception):
    """This bucket takes no JSON-API uploads (a zonal bucket, written over gRPC): use gcsfs' own writer."""


def upload(fs: Any, local: Path, remote: str, *, before_piece: Callable[[], None],
           on_sent: Callable[[int], None]) -> tuple[int, str]:
    """Send ``local`` to ``remote`` (a gcsfs path); return the size and CRC32C of what was sent.

    ``before_piece`` runs in this thread before each piece is read, ``on_sent(n)`` after each.
    Raises gcsfs' own errors for HTTP failures (`gcsfs.retry.validate_response`), aiohttp's for
    broken connections, `NotStreamable` for a zonal bucket.
    """
    size = local.stat().st_size
    bucket, key, _ = fs.split_path(remote)
    asks: queue.SimpleQueue[asyncio.Future[bytes] | None] = queue.SimpleQueue()
    checksum = RunningCrc32c()
    sent = 0
    with open(local, "rb") as source:
        request = asyncio.run_coroutine_threadsafe(_send(fs, bucket, key, size, asks), fs.loop)
        request.add_done_callback(lambda _: asks.put(None))  # wakes the loop below when it ends
        try:
            while (ask := asks.get()) is not None:
                before_piece()
                piece = _read(source, min(PIECE_SIZE, size - sent), local)
                checksum.update(piece)
                sent += len(piece)
                fs.loop.call_soon_threadsafe(_answer, ask, piece)
                on_sent(len(piece))
            request.result()
        except BaseException:
            request.cancel()  # the session stays unfinished: no object appears
            raise
        finally:
            fs.invalidate_cache(remote)
    return sent, checksum.hex()


def _read(source: BinaryIO, length: int, local: Path) -> bytes:
    piece = source.read(length)
    if len(piece) < length:
        raise OSError(errno.EIO, f"{local} got shorter while it was being uploaded")
    return piece


def _answer(ask: asyncio.Future[bytes], piece: bytes) -> None:
    if not ask.done():  # the request may have been cancelled meanwhile
        ask.set_result(piece)


async def _send(fs: Any, bucket: str, key: str, size: int,
                asks: queue.SimpleQueue[asyncio.Future[bytes] | None]) -> None:
    from gcsfs.retry import validate_response

    is_zonal = getattr(fs, "_is_zonal_bucket", None)  # gcsfs' experimental ExtendedGcsFileSystem
    if is_zonal is not None and await is_zonal(bucket):
        raise NotStreamable(bucket)
    await fs._set_session()
    # Start the session ourselves, not with gcsfs' initiate_upload: its requests retry for
    # half a minute on their own, and the caller's retry policy is the one users set.
    # gcsfs' helpers add what its own requests carry: credentials, and userProject for
    # requester-pays buckets.
    start = f"{fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
    async with fs.session.request(
        "POST", start, params=fs._get_params({"uploadType": "resumable"}), json={"name": key},
        headers=fs._get_headers({"X-Upload-Content-Type": "application/octet-stream"}),
        timeout=fs.requests_timeout,
    ) as response:
        validate_response(response.status, await response.read(), start)
        location = response.headers["Location"]
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Length": str(size),
        "Content-Range": f"bytes 0-{size - 1}/{size}" if size else "bytes */0",
    }
    # GCS answers 308 for an unfinished upload, without a Location: not a redirect to follow
    # (aiohttp would try to resend the streamed body, and fail).
    async with fs.session.request(
        "PUT", location, headers=fs._get_headers(headers), data=_pieces(size, asks),
        allow_redirects=False, timeout=fs.requests_timeout,
    ) as response:
        content = await response.read()
        validate_response(response.status, content, location)
        if response.status == 308:
            got = response.headers.get("Range", "nothing")
            raise OSError(errno.EIO, f"upload unfinished: the server holds {got} of {size} bytes")


async def _pieces(size: int, asks: queue.SimpleQueue[asyncio.Future[bytes] | None]) -> AsyncIterator[bytes]:
    """The request body: asks the calling thread for each piece in turn."""
    loop = asyncio.get_running_loop()
    left = size
    while left:
        ask: asyncio.Future[bytes] = loop.create_future()
        asks.put(ask)
        piece = await ask
        left -= len(piece)
        yield piece
