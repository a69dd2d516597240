"""The run folder (storage/folder.py): URLs that are no run folder, credentials, Drive's defaults."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from storage_helpers import bad_service_account, stage

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
        "GOOGLE_APPLICATION_CREDENTIALS", str(bad_service_account(tmp_path, refusing_token_server))
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
