"""GCS object names may hold `.` and `..` segments: such "folders" are never checkpoints.

A hostile run on fake-gcs-server holds a complete, checksum-correct checkpoint named `..`
with the highest epoch. Were it listed, resuming would download it into the cache's parent
folder and `prune` would act on paths outside the run.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from resumable import RunStorage
from resumable.cli.app import main
from resumable.core.checksum import crc32c_of_bytes
from resumable.core.errors import ResumableError
from resumable.core.manifest import FileEntry, Manifest
from resumable.manager.run_manager import RunManager

PAYLOAD = b"hostile payload"
HOSTILE = [  # relative to the run prefix
    "../manifest.json", "../model.keras",  # a complete checkpoint named ".."
    "./manifest.json", "./model.keras",  # and one named "."
    "ckpt-000001/../../evil", "ckpt-000005/../model.keras", "ckpt-000006/./model.keras",
]


def put_hostile_objects(bucket: str, prefix: str) -> None:
    from google.cloud import storage  # writes the names exactly as given (gcsfs would normalise some)

    blobs = storage.Client(project="test").bucket(bucket.removeprefix("gs://"))
    manifest = Manifest(epoch=99, step=990, files={"model.keras": FileEntry(len(PAYLOAD),
                                                                         crc32c_of_bytes(PAYLOAD))})
    for rel in HOSTILE:
        data = manifest.to_json() if rel.endswith("manifest.json") else PAYLOAD
        blobs.blob(f"{prefix}/{rel}").upload_from_string(data)


def object_names(bucket: str) -> set[str]:
    from google.cloud import storage

    return {blob.name for blob in storage.Client(project="test").list_blobs(bucket.removeprefix("gs://"))}


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def hostile_run(gcs_bucket: str, tmp_path: Path) -> str:
    url = f"{gcs_bucket}/runs/exp1"
    manager = RunManager(url, staging_dir=tmp_path / "writer", async_upload=False)
    manager.writer.acquire()
    for epoch in (1, 2):
        staged = manager.writer.stage(f"ckpt-{epoch:06d}")
        staged.mkdir(parents=True)
        (staged / "model.keras").write_bytes(bytes([epoch]) * 64)
        manager.writer.submit(staged, f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 10))
    manager.release()
    put_hostile_objects(gcs_bucket, "runs/exp1")
    return url


def test_dot_folders_are_never_listed(hostile_run: str) -> None:
    storage = RunStorage(hostile_run)
    assert [c.name for c in storage.list()] == ["ckpt-000001", "ckpt-000002"]
    assert [c.name for c in storage.list(check_files=False)] == ["ckpt-000001", "ckpt-000002"]
    assert all(c.ok for c in storage.list())
    assert [c.name for c in storage.newest_first()] == ["ckpt-000002", "ckpt-000001"]
    for name in (".", ".."):
        with pytest.raises(ResumableError, match="plain folder name"):
            storage.get(name)


def test_resume_fetches_inside_the_cache_only(hostile_run: str, tmp_path: Path) -> None:
    reader = RunManager(hostile_run, staging_dir=tmp_path / "reader")
    before = tree_digest(tmp_path)
    found = reader.fetch_newest(warn=pytest.fail)
    assert found is not None
    info, local = found
    assert info.name == "ckpt-000002"
    assert local.resolve().is_relative_to(reader.cache_root.resolve())
    assert not any(path.read_bytes() == PAYLOAD for path in tmp_path.rglob("*") if path.is_file())
    assert tree_digest(tmp_path) != before  # the download did land, inside the cache


def test_prune_and_verify_leave_dot_objects_alone(hostile_run: str, gcs_bucket: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    hostile = {f"runs/exp1/{rel}" for rel in HOSTILE}
    assert main(["verify", hostile_run]) == 0
    assert main(["prune", hostile_run, "--keep-last", "1", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "ckpt-000001" in out and ".." not in out.replace("...", "")
    names = object_names(gcs_bucket)
    assert hostile <= names  # never touched: not ours to delete
    assert "runs/exp1/ckpt-000002/manifest.json" in names
    assert "runs/exp1/ckpt-000001/manifest.json" not in names
    assert os.environ.get("STORAGE_EMULATOR_HOST")  # the objects above came from the emulator
