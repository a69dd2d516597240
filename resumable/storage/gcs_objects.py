"""Compare-and-swap on one small GCS object: what the writer's lease is made of on GCS.

A version is the object's generation, as a string of digits. Writes and deletes carry
``if_generation_match`` (0: only if absent), so GCS itself refuses a stale one with HTTP 412.

Public API relied on: google-cloud-storage's ``Blob.download_as_bytes`` (which sets
``Blob.generation`` from the answer), ``Blob.upload_from_string`` and ``Bucket.get_blob`` /
``Blob.delete`` with ``if_generation_match``, ``google.api_core.exceptions``; fsspec's
``fs.invalidate_cache``. The client is `gcs_client.client_for`. Requests are made once each
(``retry=None``): the caller's RetryPolicy decides about retries.
"""

from __future__ import annotations

import email.utils
import errno
import json
from datetime import datetime
from typing import Any

from resumable.storage.gcs_client import client_for
from resumable.storage.retry import time_left

REQUEST_TIMEOUT = 60.0  # seconds: google-cloud-storage's own default, cut to a command's budget


def read_with_generation(fs: Any, path: str, limit: int | None = None) -> tuple[bytes, str]:
    """The bytes of object ``path`` (``bucket/key``) and their generation; FileNotFoundError if absent.

    With ``limit``, at most ``limit + 1`` bytes: enough to tell an object over the limit.
    """
    window = {} if limit is None else {"start": 0, "end": limit}  # inclusive: limit + 1 bytes
    from google.api_core.exceptions import NotFound, PreconditionFailed

    blob = client_for(fs).blob(fs, path)
    try:
        data = blob.download_as_bytes(**window, retry=None, timeout=time_left(REQUEST_TIMEOUT))
        if blob.generation is None:  # a server that omits X-Goog-Generation: read again, pinned
            blob.reload(retry=None, timeout=time_left(REQUEST_TIMEOUT))
            data = blob.download_as_bytes(**window, if_generation_match=blob.generation, retry=None,
                                          timeout=time_left(REQUEST_TIMEOUT))
    except NotFound:
        raise FileNotFoundError(errno.ENOENT, "no such object", path) from None
    except PreconditionFailed:  # replaced between the two reads: worth another try
        raise OSError(errno.EAGAIN, f"{path} changed while it was read") from None
    return data, str(blob.generation)


def age_by_server(fs: Any, path: str) -> float | None:
    """Seconds since object ``path`` was last written, by the server's clock alone: its ``Date``
    answer minus the object's ``updated`` time (no clock of any client in between). None if
    the answer lacks either; FileNotFoundError if the object is gone.

    Through gcsfs' public ``call``: google-cloud-storage does not hand back response headers.
    """
    bucket, key, _ = fs.split_path(path)
    headers, body = fs.call("GET", "b/{}/o/{}", bucket, key)  # within a budget: `gcsfs_compat.bound_requests`
    try:
        now = email.utils.parsedate_to_datetime(headers["Date"])
        updated = datetime.fromisoformat(str(json.loads(body)["updated"]).replace("Z", "+00:00"))
    except (KeyError, TypeError, ValueError):
        return None
    age = (now - updated).total_seconds()
    return max(0.0, age) if age > -2 else None  # Date has whole seconds; a server far off tells nothing


def stored_object(fs: Any, path: str) -> tuple[int, str | None, str] | None:
    """Size, CRC32C (8 hex digits; None if the server has none) and generation of object ``path``;
    None if absent. One request, never retried here: it answers whether a write landed
    (`landed`), where gcsfs' own retries of a server gone would take minutes."""
    from resumable.core.checksum import crc32c_from_gcs

    bucket, key, _ = fs.split_path(path)
    blob = client_for(fs).bucket(bucket).get_blob(key, retry=None, timeout=time_left(REQUEST_TIMEOUT))
    if blob is None:
        return None
    return int(blob.size or 0), crc32c_from_gcs(blob.crc32c) if blob.crc32c else None, str(blob.generation)


def check_bucket(fs: Any, path: str) -> None:
    """Raise google.api_core's NotFound ("The specified bucket does not exist") when the bucket of
    ``path`` is missing: one listing of at most one object, which needs no more than the
    ``storage.objects.list`` permission resumable's listings need anyway."""
    from google.api_core.exceptions import NotFound

    bucket, key, _ = fs.split_path(path)
    blobs = client_for(fs).bucket(bucket).list_blobs(prefix=key, max_results=1, retry=None,
                                                     timeout=time_left(REQUEST_TIMEOUT))
    try:
        list(blobs)  # the request is sent as the listing is read
    except NotFound:  # GCS says so; an emulator may say only "Not Found"
        raise NotFound("The specified bucket does not exist.") from None


def write_if_generation(fs: Any, path: str, data: bytes, generation: int, *,
                        content_type: str = "application/json") -> str:
    """Write ``data`` to ``path`` only if its generation still is ``generation`` (0: only if absent).

    Returns the new generation. Raises FileExistsError when GCS refuses (412): another
    generation is there, or (for 0) any.
    """
    from google.api_core.exceptions import PreconditionFailed

    blob = client_for(fs).blob(fs, path)
    try:
        blob.upload_from_string(data, content_type=content_type, if_generation_match=int(generation),
                                retry=None, timeout=time_left(REQUEST_TIMEOUT))
    except PreconditionFailed:
        raise FileExistsError(errno.EEXIST, f"not generation {generation}", path) from None
    finally:
        fs.invalidate_cache(path)  # gcsfs' listings would not show the change
    return str(blob.generation)


def delete_if_generation(fs: Any, path: str, generation: str | int) -> bool:
    """Delete ``path`` only if its generation still is ``generation``; False when it changed or is gone.

    The generation is read first: fake-gcs-server ignores ``ifGenerationMatch`` on deletes (GCS
    honours it, and so closes the window between that read and the delete).
    """
    from google.api_core.exceptions import NotFound, PreconditionFailed

    gcs = client_for(fs)
    bucket, key, _ = fs.split_path(path)
    try:
        blob = gcs.bucket(bucket).get_blob(key, retry=None, timeout=time_left(REQUEST_TIMEOUT))
        if blob is None or str(blob.generation) != str(generation):
            return False
        blob.delete(if_generation_match=int(generation), retry=None, timeout=time_left(REQUEST_TIMEOUT))
    except (NotFound, PreconditionFailed):
        return False
    finally:
        fs.invalidate_cache(path)
    return True
