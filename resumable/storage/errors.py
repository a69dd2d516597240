"""What fsspec, gcsfs, google-cloud-storage, google-auth or the OS raised, as one clear ResumableError line.

Users meet these messages first when something is wrong (no bucket, no credentials, a full
Drive), so each one says what happened and what to do, never a library's traceback. Errors of
google-cloud-storage (google.api_core.exceptions) are told apart by their public ``code``, the
HTTP status, as gcsfs' HttpError is. `redact` keeps upload-session ids, tokens and signatures
out of every message.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from typing import Any

from resumable.core.display import human_size, printable
from resumable.core.errors import (
    NoSpaceError,
    NotAFolderError,
    NotAuthenticatedError,
    RunNotFoundError,
    StorageError,
    StoragePermissionError,
)

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # disk full, over quota, file too big
COLAB_AUTH_HINT = "run `from google.colab import auth; auth.authenticate_user()` in Colab"
GCLOUD_AUTH_HINT = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS"

# Query parameters that let their holder act: a resumable session's id (anyone holding it may
# write the object), OAuth tokens, signed-URL signatures, API keys.
_SECRET_PARAM = re.compile(
    r"\b(upload_id|access_token|token|key|sig|signature|x-goog-signature|x-goog-credential)=[^&\s'\"]+",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(bearer)\s+[\w.~+/=-]+", re.IGNORECASE)
# Google OAuth access tokens ("ya29.") and refresh tokens ("1//"), wherever a library quotes them.
_GOOGLE_TOKEN = re.compile(r"\b(ya29\.|1//)[\w.~+/=-]+")
# Loggers of libraries whose error records carry tracebacks (gcsfs logs one per failed retry
# loop) that the ResumableError raised right after says in one line.
QUIETED_LOGGERS = ("gcsfs",)
# Libraries under resumable's storage whose log records may quote a server's answer: where no
# logging is configured (a notebook, the CLI), Python prints their warnings through its
# last-resort handler; those lines are made one line, redacted and escaped there too.
STORAGE_LIBRARIES = ("gcsfs", "fsspec", "google", "urllib3", "requests", "aiohttp")


def translate(e: Exception, where: str, url: str, root: str, *, is_gcs: bool, is_local: bool) -> Exception:
    """The ResumableError to raise for ``e``, met at ``where`` in run folder ``url`` (fs path ``root``)."""
    # One line, whatever the library put in its message (JSON bodies, URLs on new lines).
    detail = " ".join(redact(f"{type(e).__name__}: {e}").split()).rstrip(":")
    if len(detail) > 300:
        detail = detail[:297] + "..."
    module = type(e).__module__
    code = getattr(e, "code", None)
    if code == 412:  # google-cloud-storage's PreconditionFailed: a conditional write lost a race
        return FileExistsError(errno.EEXIST, f"{where}: changed meanwhile (precondition failed)")
    if module.startswith("google.auth") or "credentials" in str(e).lower() and code in (401, None):
        hint = COLAB_AUTH_HINT if in_colab() else GCLOUD_AUTH_HINT
        return NotAuthenticatedError(f"{where}: not authenticated to Google Cloud ({detail}); {hint}")
    if code == 401:
        hint = COLAB_AUTH_HINT if in_colab() else GCLOUD_AUTH_HINT
        return NotAuthenticatedError(f"{where}: not authenticated to Google Cloud; {hint}")
    if isinstance(e, PermissionError) or code == 403 or _gcsfs_forbidden(e):
        return StoragePermissionError(
            f"{where}: permission denied; check that this account may read and write it"
        )
    if isinstance(e, NotADirectoryError):
        return NotAFolderError(f"{where}: a file is in the way where a folder was expected")
    if isinstance(e, FileNotFoundError) or code == 404:
        # Listing an absent prefix is no error on GCS; an upload answered "bucket does not exist" is.
        if is_gcs and (where == url or code == 404 and "bucket does not exist" in str(e).lower()):
            bucket = root.split("/", 1)[0]
            return RunNotFoundError(
                f"{where}: not found; does the bucket gs://{bucket} exist? Create it first"
            )
        return RunNotFoundError(f"{where}: not found")
    if isinstance(e, FileExistsError):
        return e  # handled by the caller
    if isinstance(e, OSError) and e.errno == errno.EROFS:
        return StoragePermissionError(
            f"{where}: the file system is read-only (a read-only mount, or a shared folder you may only "
            "view); choose a run folder you can write to"
        )
    if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS:
        free = free_space(root) if is_local else ""
        return NoSpaceError(
            f"{where}: no space left on the device{free}; free space or choose another folder"
        )
    if type(e).__name__ == "OutOfTime":  # retry.OutOfTime: a command's time budget ran out
        return StorageError(f"{where}: {' '.join(redact(str(e)).split())}; the storage may be down or "
                            "unreachable (the time budget is set with --timeout or RESUMABLE_CLI_TIMEOUT)")
    return StorageError(f"{where}: {detail}")


def _gcsfs_forbidden(e: Exception) -> bool:
    """gcsfs answers a 403 with a bare ``OSError("Forbidden: <path>...")``, no status attached."""
    return type(e) is OSError and e.errno is None and str(e).startswith("Forbidden")


def redact(text: str, *secrets: str) -> str:
    """``text`` without upload-session ids, tokens, signatures, and without each of ``secrets``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    text = _BEARER.sub(r"\1 <redacted>", _SECRET_PARAM.sub(r"\1=<redacted>", text))
    return _GOOGLE_TOKEN.sub(r"\1<redacted>", text)


class OneLineRedacted(logging.Filter):
    """Log records as one redacted line: no traceback, no token, no upload session URL, no
    control character (a server's text may hold ``\x1b[2J``: it is printed as ``\x1b[2J``).

    Args:
        prefixes: Apply to records of loggers named so (or below them) only; None: to all.
    """

    def __init__(self, prefixes: tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if self.prefixes is not None and not any(
                record.name == p or record.name.startswith(p + ".") for p in self.prefixes):
            return True
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            record.msg, record.args = f"{record.getMessage()} ({type(error).__name__})", None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        record.msg, record.args = printable(" ".join(redact(record.getMessage()).split())), None
        return True


def quiet_library_logs() -> None:
    """Give the resumable and gcsfs loggers the `OneLineRedacted` filter, and Python's last-resort
    handler one for the storage libraries' records (once each)."""
    for name in ("resumable", *QUIETED_LOGGERS):
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineRedacted) for f in logger.filters):
            logger.addFilter(OneLineRedacted())
    last = logging.lastResort
    if last is not None and not any(isinstance(f, OneLineRedacted) for f in last.filters):
        last.addFilter(OneLineRedacted(STORAGE_LIBRARIES))


def free_space(path: str) -> str:
    """``", 1.2 MB free"`` for the disk holding ``path`` (or its nearest existing parent), else ``""``."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return f", {human_size(shutil.disk_usage(folder).free)} free"
    except OSError:
        return ""


def in_colab() -> bool:
    return "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ


class BoundedRequest:
    """google-auth's requests transport with a short timeout (its default is 120 s)."""

    timeout = 20.0

    def __init__(self) -> None:
        from google.auth.transport.requests import Request

        self._request = Request()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = min(kwargs.get("timeout") or self.timeout, self.timeout)
        return self._request(*args, **kwargs)


__all__ = [
    "NO_SPACE_ERRNOS", "BoundedRequest", "OneLineRedacted", "free_space", "in_colab", "quiet_library_logs",
    "redact", "translate",
]
