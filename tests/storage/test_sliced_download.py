"""Big objects are downloaded from GCS as concurrent ranged reads (transfers.SLICED_MIN_BYTES)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from resumable import Manifest, RunStorage
from resumable.storage import gcsfs_compat, transfers


def test_a_big_checkpoint_downloads_in_slices_byte_for_byte(gcs_bucket: str, tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    data = random.Random(7).randbytes(transfers.SLICED_MIN_BYTES + transfers.SLICE_BYTES // 3)
    (staged / "model.keras").write_bytes(data)
    storage = RunStorage(f"{gcs_bucket}/run")
    storage.commit(staged, "ckpt-000001", Manifest(epoch=1))
    local = storage.fetch("ckpt-000001", tmp_path / "cache", progress=True)
    assert (local / "model.keras").read_bytes() == data
    assert not list(local.glob("*.part"))


def test_a_failing_slice_stops_the_others_and_closes_the_file(gcs_bucket: str, tmp_path: Path) -> None:
    """Pieces past the object's end are refused by the server: the error comes out, no fd is left."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon")
    path = f"{gcs_bucket.removeprefix('gs://')}/blob"
    fs.pipe_file(path, b"x" * 1000)
    out = tmp_path / "out"
    with pytest.raises(Exception):  # noqa: B017 - whatever gcsfs raises for a range past the end
        gcsfs_compat.run(fs, lambda: gcsfs_compat.get_file_in_slices(
            fs, path, str(out), 10_000, piece=500, at_once=2, on_piece=lambda n: None))
    assert out.exists()  # it was opened ...
    open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.islink(f"/proc/self/fd/{fd}")]
    assert str(out) not in open_files  # ... and is closed (other fds come and go with connections)
