"""An upload whose reply was lost: the bucket is asked what it holds, never guessed.

A write can land and its reply never come back: the connection reset or the answer cut short
after GCS applied the request, a timeout while the answer was on its way, a 5xx from a front
end after the write went through. gcsfs then sends the final chunk again, to a session that is
finished by now, and GCS answers 404 (410 once it expired): "not found" for the file just
written. Taken for a failure, it stopped a fit; a lost reply taken for a success would let a
manifest vouch for a file that may not be there. So after such an error the stored object is
looked at (size, CRC32C, generation): the one sent (same size and CRC32C) is kept; anything
else (nothing, an older or shorter object) is uploaded again by the caller's retry.

The object is looked at with one request of google-cloud-storage (`gcs_objects.stored_object`),
never retried inside: against a server gone, gcsfs' own six tries would take minutes per look.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

from resumable.core.checksum import crc32c_of_file
from resumable.core.manifest import FileEntry
from resumable.storage import gcs_objects
from resumable.storage.retry import http_code, is_transient

logger = logging.getLogger("resumable")

SESSION_GONE = frozenset({404, 410})  # a finished (or expired) upload session, sent to again


class SessionGone(OSError):
    """A 404/410 met by an upload whose object is not there: the session ended without making it.
    Transient (EIO): the caller's retry uploads again in a new session."""


def reply_may_be_lost(error: BaseException) -> bool:
    """True when ``error`` may hide a write that landed: a broken or cut-short answer, a
    timeout, a 5xx, or a finished session's 404/410 (what gcsfs' resend of the last chunk meets)."""
    return is_transient(error) or isinstance(error, FileNotFoundError) or http_code(error) in SESSION_GONE


def settle(fs: Any, local: Path, remote: str, error: Exception) -> tuple[int, str]:
    """After ``error`` from the upload of ``local`` to ``remote``: the local file's size and CRC32C
    when the bucket holds exactly its bytes. Otherwise raises for the caller's retry to upload
    again: ``error`` itself when transient; for a 404/410, `SessionGone` (a session that ended
    before the object was made), or the bucket's own "not found" when the bucket is missing."""
    sent = FileEntry(local.stat().st_size, crc32c_of_file(local))
    fs.invalidate_cache(remote)  # gcsfs' listings would not show what landed
    stored = gcs_objects.stored_object(fs, remote)
    if stored is not None and stored[:2] == sent:
        logger.info("resumable: the reply to the upload of %s was lost (%s); the bucket holds it whole "
                    "(generation %s): kept", remote, type(error).__name__, stored[2])
        return sent.size, sent.crc32c
    if is_transient(error):
        raise error
    gcs_objects.check_bucket(fs, remote)  # a missing bucket: its NotFound, said as such
    if stored is None:
        found = "nothing"
    else:
        found = f"{stored[0]} of {sent.size} bytes" if stored[0] != sent.size else "another CRC32C"
    raise SessionGone(errno.EIO, f"the upload session ended without the object (the bucket holds {found}); "
                      "uploading again")
