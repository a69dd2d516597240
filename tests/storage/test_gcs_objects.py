"""Compare-and-swap on one GCS object (the writer lease), on the real fake-gcs-server; no mocks.

fake-gcs-server honours ``ifGenerationMatch`` on writes (0 and a generation), so the write
tests below fail if the precondition is not sent. It ignores it on deletes: there
`delete_if_generation` compares the generation itself first, which is what these tests see.
"""

from __future__ import annotations

import errno
import uuid

import gcsfs
import pytest
from google.api_core import exceptions as api_exceptions

from resumable.core.errors import RunNotFoundError, StorageError, StoragePermissionError
from resumable.storage import gcs_client
from resumable.storage.errors import redact, translate
from resumable.storage.gcs_objects import delete_if_generation, read_with_generation, write_if_generation
from resumable.storage.retry import is_transient


@pytest.fixture
def fs(gcs_bucket: str) -> gcsfs.GCSFileSystem:
    return gcsfs.GCSFileSystem(token="anon")


@pytest.fixture
def path(gcs_bucket: str) -> str:
    return f"{gcs_bucket.removeprefix('gs://')}/run/lease.json"


def test_reading_an_absent_object_is_file_not_found(fs: gcsfs.GCSFileSystem, path: str) -> None:
    with pytest.raises(FileNotFoundError):
        read_with_generation(fs, path)


def test_create_only_if_absent(fs: gcsfs.GCSFileSystem, path: str) -> None:
    generation = write_if_generation(fs, path, b'{"owner": "a"}', 0)
    assert generation.isdigit()
    assert read_with_generation(fs, path) == (b'{"owner": "a"}', generation)
    with pytest.raises(FileExistsError):  # the server's 412: it is there now
        write_if_generation(fs, path, b'{"owner": "b"}', 0)
    assert read_with_generation(fs, path) == (b'{"owner": "a"}', generation)
    assert fs.info(path)["contentType"] == "application/json"


def test_replace_only_the_generation_read(fs: gcsfs.GCSFileSystem, path: str) -> None:
    first = write_if_generation(fs, path, b"one", 0)
    second = write_if_generation(fs, path, b"two", int(first))
    assert second != first
    assert read_with_generation(fs, path) == (b"two", second)
    with pytest.raises(FileExistsError):  # a writer still holding the first generation loses
        write_if_generation(fs, path, b"stale", int(first))
    assert read_with_generation(fs, path) == (b"two", second)


def test_replacing_an_absent_object_fails(fs: gcsfs.GCSFileSystem, path: str) -> None:
    with pytest.raises(FileExistsError):
        write_if_generation(fs, path, b"x", 12345)
    with pytest.raises(FileNotFoundError):
        read_with_generation(fs, path)


def test_delete_only_the_generation_read(fs: gcsfs.GCSFileSystem, path: str) -> None:
    first = write_if_generation(fs, path, b"one", 0)
    second = write_if_generation(fs, path, b"two", int(first))
    assert delete_if_generation(fs, path, first) is False
    assert read_with_generation(fs, path) == (b"two", second)
    assert delete_if_generation(fs, path, second) is True
    with pytest.raises(FileNotFoundError):
        read_with_generation(fs, path)
    assert delete_if_generation(fs, path, second) is False  # gone already


def test_gcsfs_listings_see_each_change(fs: gcsfs.GCSFileSystem, path: str) -> None:
    folder = path.rsplit("/", 1)[0]
    assert not fs.exists(path)  # gcsfs caches this listing
    generation = write_if_generation(fs, path, b"x", 0)
    assert fs.exists(path) and fs.cat(path) == b"x"
    assert [entry.rsplit("/", 1)[-1] for entry in fs.ls(folder)] == ["lease.json"]
    assert delete_if_generation(fs, path, generation)
    assert not fs.exists(path)


def test_the_client_follows_the_filesystem(fs: gcsfs.GCSFileSystem, gcs_bucket: str, gcs_server: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    built = gcs_client.client_for(fs)
    assert gcs_client.client_for(fs) is built  # one per filesystem
    assert built.client.api_endpoint == gcs_server and built.user_project is None
    moved = gcs_server.replace("127.0.0.1", "localhost")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", moved.removeprefix("http://"))  # no scheme: http
    rebuilt = gcs_client.client_for(fs)
    assert rebuilt is not built and rebuilt.client.api_endpoint == moved
    path = f"{gcs_bucket.removeprefix('gs://')}/lease.json"
    generation = write_if_generation(fs, path, b"x", 0)  # through the new address
    assert read_with_generation(fs, path) == (b"x", generation)


def test_an_endpoint_url_without_the_emulator_variable(gcs_bucket: str, gcs_server: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=gcs_server, skip_instance_cache=True)
    path = f"{gcs_bucket.removeprefix('gs://')}/lease.json"
    generation = write_if_generation(fs, path, b"x", 0)
    assert read_with_generation(fs, path) == (b"x", generation)


def test_the_filesystems_credentials_are_used(gcs_bucket: str) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2.credentials import Credentials

    token = Credentials(token="test-token")  # fake-gcs-server accepts any
    fs = gcsfs.GCSFileSystem(token=token, skip_instance_cache=True)
    assert gcs_client.client_for(fs).session.credentials is token
    path = f"{gcs_bucket.removeprefix('gs://')}/lease.json"
    generation = write_if_generation(fs, path, b"x", 0)
    assert read_with_generation(fs, path) == (b"x", generation)
    anonymous = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)
    assert isinstance(gcs_client.client_for(anonymous).session.credentials, AnonymousCredentials)


@pytest.mark.parametrize(("requester_pays", "expected"), [(True, "my-project"), ("billed", "billed")])
def test_requester_pays_bills_the_user_project(gcs_bucket: str, requester_pays: bool | str,
                                               expected: str) -> None:
    fs = gcsfs.GCSFileSystem(token="anon", project="my-project", requester_pays=requester_pays,
                             skip_instance_cache=True)
    assert gcs_client.client_for(fs).user_project == expected
    path = f"{gcs_bucket.removeprefix('gs://')}/lease.json"
    blob = gcs_client.client_for(fs).blob(fs, path)
    assert blob.bucket.user_project == expected  # sent as userProject on each request
    generation = write_if_generation(fs, path, b"x", 0)
    assert read_with_generation(fs, path) == (b"x", generation)


def test_a_missing_bucket_is_one_clear_line(fs: gcsfs.GCSFileSystem) -> None:
    bucket = f"absent-{uuid.uuid4().hex[:12]}"
    with pytest.raises(api_exceptions.NotFound) as caught:
        write_if_generation(fs, f"{bucket}/run/lease.json", b"x", 0)
    error = translate(caught.value, f"gs://{bucket}/run", f"gs://{bucket}/run", f"{bucket}/run",
                      is_gcs=True, is_local=False)
    assert isinstance(error, RunNotFoundError)
    assert str(error) == f"gs://{bucket}/run: not found; does the bucket gs://{bucket} exist? Create it first"
    assert not is_transient(caught.value)


@pytest.mark.parametrize(
    ("exc", "expected", "transient"),
    [
        (api_exceptions.Forbidden("no"), StoragePermissionError, False),
        (api_exceptions.PreconditionFailed("raced"), FileExistsError, False),
        (api_exceptions.NotFound("The specified bucket does not exist."), RunNotFoundError, False),
        (api_exceptions.ServiceUnavailable("busy"), StorageError, True),
        (api_exceptions.TooManyRequests("slow down"), StorageError, True),
        (api_exceptions.InternalServerError("oops"), StorageError, True),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_google_cloud_errors(exc: Exception, expected: type, transient: bool) -> None:
    error = translate(exc, "gs://b/run/f", "gs://b/run", "b/run", is_gcs=True, is_local=False)
    assert isinstance(error, expected) and "\n" not in str(error)
    assert is_transient(exc) is transient
    if expected is RunNotFoundError:
        assert "does the bucket gs://b exist" in str(error)
    if expected is FileExistsError:
        assert error.errno == errno.EEXIST


def test_google_auth_errors() -> None:
    from google.auth import exceptions as auth_exceptions

    assert is_transient(auth_exceptions.TransportError("metadata server unreachable"))
    assert not is_transient(auth_exceptions.RefreshError("invalid_grant"))
    error = translate(api_exceptions.Unauthorized("Invalid Credentials"), "gs://b/run", "gs://b/run", "b/run",
                      is_gcs=True, is_local=False)
    assert type(error).__name__ == "NotAuthenticatedError"


def test_secrets_never_reach_a_message() -> None:
    session = "https://storage.googleapis.com/upload/storage/v1/b/b/o?uploadType=resumable&upload_id=ABC123"
    text = f"PUT {session} failed; url: /upload/storage/v1/b/b/o?upload_id=ABC123 Bearer ya29.tok&x=1"
    cleaned = redact(text, session)
    assert "ABC123" not in cleaned and "ya29" not in cleaned
    assert "uploadType=resumable" in redact(session)  # harmless parameters stay
    error = translate(OSError(errno.EPIPE, f"cut off at {session}"), "gs://b/run/f", "gs://b/run", "b/run",
                      is_gcs=True, is_local=False)
    assert "ABC123" not in str(error)
