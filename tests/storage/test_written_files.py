"""Files checksummed as they are written (resumable/storage/written_files.py, core/checksum.combine)."""

from __future__ import annotations

import os
import random
import time
import zlib
from pathlib import Path

import google_crc32c
import h5py
import numpy as np
import pytest

from resumable.core.checksum import CRC32_POLY, combine, crc32c_of_file
from resumable.storage.local_files import LinkInRunError
from resumable.storage.written_files import SMALL_WRITE, WrittenFiles


@pytest.mark.parametrize("split", [0, 1, 7, 4096, 99_999, 100_000])
def test_combine_joins_two_pieces_checksums_as_zlib_does(split: int) -> None:
    data = np.random.default_rng(split).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    first, second = data[:split], data[split:]
    assert combine(google_crc32c.value(first), google_crc32c.value(second), len(second)) == \
        google_crc32c.value(data)
    assert combine(zlib.crc32(first), zlib.crc32(second), len(second), CRC32_POLY) == zlib.crc32(data)


def extended(crc: int, length: int, extend: object) -> int:
    """``crc`` extended by ``length`` zero bytes, a MiB at a time (no buffer of that size)."""
    zeros = bytes(2**20)
    for at in range(0, length, len(zeros)):
        crc = extend(crc, zeros[:min(len(zeros), length - at)])  # type: ignore[operator]
    return crc


# A weight of 512 MiB or more (a 250M-parameter model's kernel, its Adam slots) is one write:
# every length up to the 64-bit offsets a file can have must combine right.
@pytest.mark.parametrize("length", [2**29 - 1, 2**29, 2**29 + 3, 2**30 + 5, 2**32 + 7])
def test_combine_joins_pieces_of_512_mib_and_more(length: int) -> None:
    head = b"written first"
    crc32c_whole = extended(google_crc32c.value(head), length, google_crc32c.extend)
    crc32c_piece = extended(0, length, google_crc32c.extend)
    assert combine(google_crc32c.value(head), crc32c_piece, length) == crc32c_whole
    crc32_whole = extended(zlib.crc32(head), length, lambda crc, data: zlib.crc32(data, crc))
    crc32_piece = extended(0, length, lambda crc, data: zlib.crc32(data, crc))
    assert combine(zlib.crc32(head), crc32_piece, length, CRC32_POLY) == crc32_whole


@pytest.mark.slow
def test_one_write_of_512_mib_is_checksummed_as_the_file_holds_it(tmp_path: Path) -> None:
    files = WrittenFiles(tmp_path / "ckpt")
    big = np.zeros(2**29 + 4096, dtype=np.uint8)  # calloc'd: hashing reads the zero page, no RAM
    big[::2**20] = 7
    with files.create("weights.h5") as file:
        file.write(b"a header, kept until the file closes")
        file.write(memoryview(big))
    path = tmp_path / "ckpt" / "weights.h5"
    assert files.entries["weights.h5"].crc32c == crc32c_of_file(path)


def test_an_hdf5_file_is_checksummed_from_its_writes_without_reading_it_back(tmp_path: Path) -> None:
    files = WrittenFiles(tmp_path / "ckpt")
    with files.create("weights.h5") as file, h5py.File(file, "w") as h5:
        for i in range(6):  # big datasets between HDF5's small headers, rewritten at close
            h5.create_dataset(f"big{i}", data=np.random.default_rng(i).normal(size=(200, 200)))
            h5.create_dataset(f"small{i}", data=np.arange(i + 1))
    entry = files.entries["weights.h5"]
    path = tmp_path / "ckpt" / "weights.h5"
    assert entry.size == path.stat().st_size and entry.crc32c == crc32c_of_file(path)
    assert files.reread == 0
    with h5py.File(path) as h5:
        assert np.array_equal(h5["small5"][()], np.arange(6))


def test_writes_anywhere_overwrites_holes_and_truncation_give_the_file_s_checksum(tmp_path: Path) -> None:
    rng = random.Random(3)
    files = WrittenFiles(tmp_path)
    with files.create("random.bin") as file:
        for _ in range(400):
            file.seek(rng.randrange(0, 4_000_000))
            file.write(os.urandom(rng.choice([1, 100, SMALL_WRITE - 1, SMALL_WRITE, 300_000])))
            if rng.random() < 0.03:
                file.truncate(rng.randrange(0, 4_000_000))
        file.seek(6_000_000)  # a hole up to the last write reads as zeros
        file.write(b"end")
    entry = files.entries["random.bin"]
    path = tmp_path / "random.bin"
    assert entry.size == path.stat().st_size == 6_000_003
    assert entry.crc32c == crc32c_of_file(path)
    assert files.reread > 0  # big writes cut by later ones: their rest was read back, and right


def test_files_are_new_and_never_written_through_a_link_below_the_run(tmp_path: Path) -> None:
    root = tmp_path / "run"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "ckpt-000001").mkdir(parents=True)
    (root / "ckpt-000001" / "model.keras").symlink_to(outside / "model.keras")
    (root / "ckpt-000002").symlink_to(outside, target_is_directory=True)
    files = WrittenFiles(root / "ckpt-000001", str(root))
    with pytest.raises(FileExistsError):
        files.create("model.keras")
    with pytest.raises(LinkInRunError):
        WrittenFiles(root / "ckpt-000002", str(root)).create("state.json")
    assert list(outside.iterdir()) == []


def test_entries_refuse_while_a_file_is_open(tmp_path: Path) -> None:
    files = WrittenFiles(tmp_path)
    file = files.create("a.bin")
    with pytest.raises(RuntimeError, match="still open: a.bin"):
        _ = files.entries
    file.close()
    assert files.entries["a.bin"].size == 0


def test_a_buffer_reused_as_soon_as_write_returns_was_checksummed_as_written(tmp_path: Path) -> None:
    """Big writes are hashed in another thread while they are written: `write` returns only once
    both are done, so a caller refilling its buffer at once (as HDF5 does) changes nothing."""
    files = WrittenFiles(tmp_path)
    buffer = bytearray(8 * SMALL_WRITE)
    with files.create("reused.bin") as file:
        for i in range(64):
            buffer[:] = bytes([i]) * len(buffer)
            file.write(buffer)
            buffer[:] = b"\xff" * len(buffer)  # what a hash still running would see
    assert files.entries["reused.bin"].crc32c == crc32c_of_file(tmp_path / "reused.bin")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_hashes_big_writes_too(tmp_path: Path) -> None:
    """A child forked after the parent hashed (a fork server's jobs) has none of its threads:
    it starts its own instead of waiting on one that does not exist."""
    data = os.urandom(4 * SMALL_WRITE)
    parent = WrittenFiles(tmp_path / "parent")
    parent.write_bytes("big.bin", data)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 with the right checksum; a hang is killed below
        try:
            child = WrittenFiles(tmp_path / "child")
            child.write_bytes("big.bin", data)
            os._exit(0 if child.entries["big.bin"] == parent.entries["big.bin"] else 1)
        finally:
            os._exit(2)
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's write hung")
    assert os.waitstatus_to_exitcode(status) == 0
