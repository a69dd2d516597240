"""The gcsfs and fsspec internals resumable uses (storage/gcsfs_compat.py), and their public fallbacks."""

from __future__ import annotations

from typing import Any

import fsspec
import gcsfs
import pytest
from fsspec.asyn import sync
from gated_fs import GatedFS

from resumable import RunStorage, StorageError
from resumable.storage import gcsfs_compat


class _Bare:
    """A filesystem with none of the private members: what another release could look like."""

    protocol = "gs"
    async_impl = False


class _WithoutListObjects:
    """gcsfs as resumable would find a release without ``_do_list_objects``."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.loop = fs.loop

    async def _ls(self, path: str, detail: bool = True) -> Any:
        return await self.fs._ls(path, detail=detail)

    def split_path(self, path: str) -> Any:
        return self.fs.split_path(path)


def test_folder_prefixes_are_the_same_through_the_public_listing(gcs_bucket: str) -> None:
    storage = RunStorage(f"{gcs_bucket}/runs/exp1")
    storage.fs.pipe({
        f"{storage.root}/ckpt-000001/model.keras": b"m",
        f"{storage.root}/ckpt-000002/assets/vocab.txt": b"v",
        f"{storage.root}/index.json": b"{}",
    })
    fresh = sync(storage.fs.loop, gcsfs_compat.folder_prefixes, storage.fs, storage.root)
    older = _WithoutListObjects(storage.fs)
    fallback = sync(older.loop, gcsfs_compat.folder_prefixes, older, storage.root)
    assert fresh == fallback == ["runs/exp1/ckpt-000001/", "runs/exp1/ckpt-000002/"]


def test_without_any_listing_member_the_error_names_the_gcsfs_version() -> None:
    with pytest.raises(StorageError, match=f"gcsfs {gcsfs.__version__}") as caught:
        sync(fsspec.asyn.get_loop(), gcsfs_compat.folder_prefixes, _Bare(), "bucket/runs")
    assert "\n" not in str(caught.value)


def test_paths_without_the_private_helpers() -> None:
    assert gcsfs_compat.strip_protocol(_Bare(), "gs://bucket/runs/exp1/") == "bucket/runs/exp1"
    assert gcsfs_compat.split_path(_Bare(), "bucket/runs/exp1") == ("bucket", "runs/exp1")
    assert gcsfs_compat.split_path(_Bare(), "gs://bucket/runs/exp1") == ("bucket", "runs/exp1")
    fs = gcsfs.GCSFileSystem(token="anon")
    assert gcsfs_compat.strip_protocol(fs, "gs://bucket/runs/exp1/") == "bucket/runs/exp1"
    assert gcsfs_compat.split_path(fs, "bucket/runs/exp1") == ("bucket", "runs/exp1")


def test_only_an_async_filesystem_with_the_members_is_awaited(gcs_bucket: str) -> None:
    fs = gcsfs.GCSFileSystem(token="anon")
    assert gcsfs_compat.awaits_listing_and_reads(fs)
    assert not gcsfs_compat.awaits_listing_and_reads(GatedFS(fs))  # a wrapper: one call at a time
    assert not gcsfs_compat.awaits_listing_and_reads(fsspec.filesystem("memory"))
    assert not gcsfs_compat.awaits_listing_and_reads(_Bare())


def test_the_quick_list_through_a_wrapper_takes_the_public_path(gcs_bucket: str, tmp_path: Any) -> None:
    storage = RunStorage(f"{gcs_bucket}/runs/exp1")
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "model.keras").write_bytes(b"m")
    from resumable import Manifest

    storage.commit(stage, "ckpt-000001", Manifest(epoch=1))
    direct = storage.list(check_files=False)
    storage.fs = GatedFS(storage.fs)
    wrapped = storage.list(check_files=False)
    assert [(i.name, i.epoch, i.checked) for i in wrapped] == [(i.name, i.epoch, i.checked) for i in direct]
    assert [i.checked for i in direct] == [False]


def test_credentials_of_anonymous_and_other_filesystems() -> None:
    assert gcsfs_compat.google_credentials(fsspec.filesystem("memory")) is None
    assert gcsfs_compat.google_credentials(_Bare()) is None
