"""The folder names `resumable list` reads on GCS, against fake-gcs-server and the installed gcsfs."""

from __future__ import annotations

import pytest
from fsspec.asyn import sync

from resumable import NotAFolderError
from resumable.storage import RunStorage, gcs_listing


def names(storage: RunStorage, path: str) -> list[str]:
    return sync(storage.fs.loop, gcs_listing.folder_names, storage.fs, path)


def test_one_level_of_folders_without_the_files_beside_them(gcs_bucket: str) -> None:
    storage = RunStorage(f"{gcs_bucket}/runs/exp1")
    storage.fs.pipe({
        f"{storage.root}/ckpt-000002/model.keras": b"m",
        f"{storage.root}/ckpt-000001/model.keras": b"m",
        f"{storage.root}/ckpt-000001/assets/vocab.txt": b"v",  # deeper: not a folder of the run
        f"{storage.root}/index.json": b"{}",  # a file in the run folder: no checkpoint
        f"{storage.root}-other/ckpt-000009/model.keras": b"m",  # a sibling sharing the name's start
        f"{storage.root}/ckpt-000003/": b"",  # a folder marker, as some tools write them
    })
    assert names(storage, storage.root) == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    assert names(storage, storage.root + "/") == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    bucket = storage.root.split("/")[0]
    assert names(storage, bucket) == ["runs"]  # the bucket itself as the run folder
    assert names(storage, f"{storage.root}/ckpt-000001") == ["assets"]
    assert names(storage, f"{storage.root}/nothing") == []


def test_a_missing_bucket_raises_what_gcsfs_raises(gcs_bucket: str) -> None:
    storage = RunStorage(f"{gcs_bucket}/runs/exp1")
    with pytest.raises(FileNotFoundError):
        names(storage, "no-such-bucket-7c2a/runs/exp1")


def test_quick_list_on_gcs_uses_the_names_and_still_explains_a_file_url(gcs_bucket: str) -> None:
    """An empty answer goes the slow way, whose errors say what is wrong."""
    storage = RunStorage(f"{gcs_bucket}/runs/model.keras")
    storage.fs.pipe({storage.root: b"not a folder"})
    with pytest.raises(NotAFolderError, match="is a file, not a run folder"):
        storage.list(check_files=False)
