"""A google-cloud-storage client that talks to GCS exactly as a given gcsfs filesystem does.

Two paths must not break with a gcsfs release: the streamed upload (`gcs_upload`) and the
writer lease's compare-and-swap (`gcs_objects`). They use google-cloud-storage's public API
through the `GcsClient` built here, once per filesystem, with the filesystem's endpoint (its
``endpoint_url``, else ``STORAGE_EMULATOR_HOST``), credentials (anonymous for ``token="anon"``),
project and requester-pays billing (``userProject``).

Public API relied on: ``google.cloud.storage.Client(project, credentials, client_options)``,
``Client.bucket(name, user_project)``, ``google.auth.transport.requests.AuthorizedSession``,
``google.auth.credentials.AnonymousCredentials``; from fsspec/gcsfs: ``fs.storage_options``,
``fs.requester_pays``, ``fs.project``, ``fs.split_path``, ``fsspec.asyn.sync``. What gcsfs does
not offer publicly is read in `_gcsfs_settings` only.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resumable.storage import library_random

if TYPE_CHECKING:  # imported when first used: local-only users never load them
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud.storage import Blob, Bucket, Client


@dataclass(frozen=True)
class GcsClient:
    """The client, an HTTP session with the same credentials, and how to tell zonal buckets."""

    client: Client
    session: AuthorizedSession  # sends a resumable upload's body, which the client cannot stream
    user_project: str | None  # billed for requester-pays buckets
    is_zonal: Callable[[str], bool]  # buckets that take no JSON-API uploads (written over gRPC)

    def bucket(self, name: str) -> Bucket:
        return self.client.bucket(name, user_project=self.user_project)

    def blob(self, fs: Any, path: str) -> Blob:
        """The object at gcsfs path ``bucket/key`` (any generation in the path is ignored)."""
        bucket, key, _ = fs.split_path(path)
        return self.bucket(bucket).blob(key)


@dataclass(frozen=True)
class _Settings:
    endpoint: str | None  # None: google-cloud-storage's default (with its mTLS switch)
    universe: str | None  # GOOGLE_CLOUD_UNIVERSE_DOMAIN, which gcsfs honours and the client must be told
    credentials: Any  # google-auth credentials, None for anonymous
    project: str | None
    user_project: str | None
    is_zonal: Callable[[str], bool]

    def same_as(self, other: _Settings) -> bool:
        """Whether a client built for ``other`` serves these (credentials compared by identity)."""
        return (self.endpoint, self.universe, self.project, self.user_project) == (
            other.endpoint, other.universe, other.project, other.user_project
        ) and self.credentials is other.credentials


_built: weakref.WeakKeyDictionary[Any, tuple[_Settings, GcsClient]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def client_for(fs: Any) -> GcsClient:
    """The `GcsClient` for gcsfs filesystem ``fs``: built on first use, then reused.

    Built again when the filesystem's settings changed (a new emulator address, new credentials).
    """
    settings = _gcsfs_settings(fs)
    with _lock:
        cached = _built.get(fs)
        if cached is not None and cached[0].same_as(settings):
            return cached[1]
        built = _build(settings)
        _built[fs] = (settings, built)
        return built


def _gcsfs_settings(fs: Any) -> _Settings:
    """What ``fs`` connects with, read from the filesystem in this one place."""
    options = getattr(fs, "storage_options", {})  # fsspec: the constructor's keyword arguments
    endpoint = options.get("endpoint_url") or _emulator()
    requester_pays = getattr(fs, "requester_pays", False)
    project = getattr(fs, "project", None) or None
    if isinstance(requester_pays, str):
        user_project = requester_pays or None
    else:
        user_project = project if requester_pays else None
    # Not documented by gcsfs: ``fs.credentials`` is its GoogleCredentials holder, whose
    # ``.credentials`` is the google-auth object (None when anonymous); gcsfs' own ``sign()``
    # reads it the same way, and RunStorage refreshes it before the first request.
    holder = getattr(fs, "credentials", None)
    if holder is None or not hasattr(holder, "credentials"):
        raise RuntimeError(
            f"gcsfs {_gcsfs_version()} keeps its credentials elsewhere than fs.credentials.credentials; "
            "resumable cannot reuse them: install a gcsfs release resumable supports"
        )
    # Private, and only on gcsfs' experimental ExtendedGcsFileSystem: its cached lookup of
    # zonal buckets, which gcsfs itself consults before writing. Absent: no zonal support.
    lookup = getattr(fs, "_is_zonal_bucket", None)
    universe = os.environ.get("GOOGLE_CLOUD_UNIVERSE_DOMAIN") or None
    return _Settings(endpoint, universe, holder.credentials, project, user_project, _zonal_check(fs, lookup))


def _emulator() -> str | None:
    """``STORAGE_EMULATOR_HOST`` as gcsfs reads it ("default" or empty: none; no scheme: http)."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if host in ("", "default"):
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def _zonal_check(fs: Any, lookup: Any) -> Callable[[str], bool]:
    if lookup is None:
        return lambda bucket: False

    def is_zonal(bucket: str) -> bool:
        from fsspec.asyn import sync

        return bool(sync(fs.loop, lookup, bucket))

    return is_zonal


def _build(settings: _Settings) -> GcsClient:
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import storage

    library_random.isolate()  # as RunFolder does, for a filesystem opened elsewhere
    credentials = settings.credentials if settings.credentials is not None else AnonymousCredentials()
    options: dict[str, str] = {}
    if settings.endpoint:
        options["api_endpoint"] = settings.endpoint
    elif settings.universe:
        options["universe_domain"] = settings.universe
    client = storage.Client(project=settings.project, credentials=credentials, client_options=options or None)
    session = AuthorizedSession(credentials)
    session.configure_mtls_channel()  # as the client's own session: a client certificate if configured
    return GcsClient(client, session, settings.user_project, settings.is_zonal)


def _gcsfs_version() -> str:
    try:
        import gcsfs

        return str(gcsfs.__version__)
    except Exception:
        return "(unknown version)"
