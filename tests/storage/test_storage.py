"""The RunStorage contract end to end, on a local folder, memory:// and a real fake-gcs-server."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import FILES, commit, raw

from resumable import CheckpointNotFoundError, Manifest, RunStorage, Status
from resumable.core.checksum import crc32c_of_bytes
from resumable.core.manifest import MANIFEST_NAME

# ----------------------------------------------------------------- round trip


def test_empty_run(storage: RunStorage) -> None:
    assert storage.list() == []
    assert storage.latest() is None
    assert list(storage.newest_first()) == []
    assert storage.exists() is False
    with pytest.raises(CheckpointNotFoundError, match="ckpt-000001: no such checkpoint"):
        storage.get("ckpt-000001")


def test_commit_list_latest_get_fetch_verify(storage: RunStorage, tmp_path: Path) -> None:
    info = commit(storage, tmp_path, "ckpt-000003", Manifest(epoch=3, step=300, metrics={"loss": 0.25}))
    assert info.ok and info.name == "ckpt-000003" and info.url == f"{storage.url}/ckpt-000003"
    assert storage.exists() is True

    [listed] = storage.list()
    assert listed.status is Status.OK and listed.problem == ""
    assert (listed.epoch, listed.step, listed.metrics) == (3, 300, {"loss": 0.25})
    assert listed.size == sum(len(d) for d in FILES.values()) + len(
        raw(storage, "ckpt-000003", MANIFEST_NAME)
    )

    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000003" and latest.ok
    got = storage.get("ckpt-000003")
    assert got.manifest is not None
    assert {rel: (e.size, e.crc32c) for rel, e in got.manifest.files.items()} == {
        rel: (len(data), crc32c_of_bytes(data)) for rel, data in FILES.items()
    }
    assert got.manifest.created_at is not None

    cache = storage.fetch(latest, tmp_path / "cache")
    assert {p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()} == {
        *FILES,
        MANIFEST_NAME,
    }
    for rel, data in FILES.items():
        assert (cache / rel).read_bytes() == data
        assert raw(storage, "ckpt-000003", rel) == data
    assert Manifest.from_json((cache / MANIFEST_NAME).read_bytes(), "cache").epoch == 3
    assert storage.verify("ckpt-000003") == []
    # fetching by name into the same folder again is a no-op that still checks
    assert storage.fetch("ckpt-000003", tmp_path / "cache") == cache
