"""The checkpoint reading boundary, file by file: whatever NumPy, zip or h5py would refuse, or
would inflate without bound, is one CorruptCheckpointError line; good files read back as saved.

End to end (resume() falling back past such a file) in test_hostile_files.py.
"""

from __future__ import annotations

import io
import pickle
import struct
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from resumable import CorruptCheckpointError
from resumable.keras.checkpoint import checkpoint_reading as reading

h5py = pytest.importorskip("h5py")

WHERE = "gs://b/run/ckpt-000002"


def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    """The one line the boundary raises, checked for its shape."""
    with pytest.raises(CorruptCheckpointError) as caught:
        call(*args, **kwargs)
    text = str(caught.value)
    assert text.startswith(f"{WHERE}: ") and text.endswith(reading.DAMAGED)
    assert "\n" not in text and len(text) < 400
    return text


def npz(path: Path, **arrays: Any) -> Path:
    np.savez(path, **arrays)
    return path


# ----------------------------------------------------------------------------- .npz


def test_a_good_npz_reads_back_as_saved(tmp_path: Path) -> None:
    saved = {"seed_generators/0": np.arange(2, dtype="uint32"), "lora/0": np.ones((3, 4), "float16"),
             "metrics/0": np.float32(2.5), "flag": np.array([True, False]), "fortran": np.asfortranarray(
                 np.arange(6.0).reshape(2, 3))}
    read = reading.read_npz(npz(tmp_path / "arrays.npz", **saved), WHERE)
    assert read.keys() == saved.keys()
    for key, value in saved.items():
        np.testing.assert_array_equal(read[key], value)
        assert read[key].dtype == np.asarray(value).dtype
    read["lora/0"][0, 0] = 7  # writable, like np.load's
    reading.check_npz(tmp_path / "arrays.npz", WHERE)


class Planted:
    """Unpickling it would create a file: the proof that no pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_an_object_array_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    planted = tmp_path / "pickle-ran"
    path = tmp_path / "arrays.npz"
    np.savez(path, weights=np.array([Planted(planted)], dtype=object))
    pickle.loads(pickle.dumps(Planted(tmp_path / "probe")))
    assert (tmp_path / "probe").exists()  # the planted object would indeed run, if unpickled
    text = refused(reading.read_npz, path, WHERE)
    assert "arrays.npz holds 'weights' of dtype object, not numbers" in text
    assert not planted.exists()


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "is not a zip archive"),
    (b"not a zip at all" * 100, "is not a zip archive"),
    (b"PK\x05\x06" + struct.pack("<4H2IH", 0, 0, 1, 1, 46, 0, 0), "cannot be read (BadZipFile"),
])
def test_a_file_that_is_no_zip_is_refused(tmp_path: Path, data: bytes, reason: str) -> None:
    (tmp_path / "arrays.npz").write_bytes(data)
    assert reason in refused(reading.read_npz, tmp_path / "arrays.npz", WHERE)


def test_a_member_that_is_no_npy_array_is_refused(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "arrays.npz", "w") as archive:
        archive.writestr("notes.txt", "hello")
    text = refused(reading.read_npz, tmp_path / "arrays.npz", WHERE)
    assert "holds 'notes.txt', which is no .npy array" in text


def npy_bytes(header: str, data: bytes = b"") -> bytes:
    """A version 1.0 .npy file with a header of our choosing."""
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    body = text + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body + data


@pytest.mark.parametrize(("header", "data", "reason"), [
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", b"\0" * 8, "does not match"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", b"\0" * 8, "does not match"),
    ("{'descr': '<U4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 16, "not numbers"),
    ("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", b"\0" * 4, "not numbers"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (-1,), }", b"", "with shape (-1,)"),
    ("[1, 2]", b"", "cannot be read"),
])
def test_a_header_that_lies_or_names_no_numbers_is_refused_before_anything_is_allocated(
        tmp_path: Path, header: str, data: bytes, reason: str) -> None:
    with zipfile.ZipFile(tmp_path / "arrays.npz", "w") as archive:
        archive.writestr("weights.npy", npy_bytes(header, data))
    tracemalloc.start()
    try:
        assert reason in refused(reading.read_npz, tmp_path / "arrays.npz", WHERE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # never the 8 TB the first header asks for


def deflated(path: Path, name: str, size: int) -> None:
    """A member of ``size`` zero bytes, deflated: a few KB on disk per MB inside."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, archive.open(name, "w",
                                                                                   force_zip64=True) as f:
        f.write(npy_bytes(f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({size},), }}"))
        chunk = bytes(2**20)
        for _ in range(size // len(chunk)):
            f.write(chunk)


def test_an_npz_that_would_inflate_without_bound_is_refused_uninflated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "SLACK", 2**20)  # the bound a 64 MB bomb would meet at 64 MiB
    path = tmp_path / "arrays.npz"
    deflated(path, "weights.npy", 16 * 2**20)
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    try:
        text = refused(reading.read_npz, path, WHERE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "would inflate to 16.0 MB from" in text and "more than resumable ever writes" in text
    assert peak < 2**20


def test_the_bound_lets_through_what_fits(tmp_path: Path) -> None:
    path = tmp_path / "arrays.npz"
    deflated(path, "weights.npy", 4 * 2**20)  # well inside the 64 MiB slack
    assert reading.read_npz(path, WHERE)["weights"].shape == (4 * 2**20,)


def test_an_archive_of_too_many_members_is_refused_before_zipfile_lists_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "MAX_MEMBERS", 10)
    npz(tmp_path / "arrays.npz", **{f"a{i}": np.zeros(1) for i in range(11)})
    text = refused(reading.read_npz, tmp_path / "arrays.npz", WHERE)
    assert "holds 11 members, more than any real one" in text


def test_a_member_whose_bytes_changed_is_refused(tmp_path: Path) -> None:
    path = npz(tmp_path / "arrays.npz", weights=np.arange(1000, dtype="float64"))
    data = bytearray(path.read_bytes())
    data[500] ^= 0xFF  # inside the array's bytes: the zip's own CRC-32 no longer matches
    path.write_bytes(bytes(data))
    assert "Bad CRC-32" in refused(reading.read_npz, path, WHERE)


# ----------------------------------------------------------------------------- against a layout

LAYOUT = {"weights/0": ([3, 2], "float32"), "optimizer/0": ([], "int64")}


def test_an_npz_matching_its_layout_reads_back(tmp_path: Path) -> None:
    path = npz(tmp_path / "trainable.npz", **{"weights/0": np.ones((3, 2), "float32"),
                                              "optimizer/0": np.int64(4)})
    assert reading.read_npz(path, WHERE, LAYOUT)["optimizer/0"] == 4


def test_a_dtype_npy_cannot_name_is_read_as_its_unsigned_stand_in(tmp_path: Path) -> None:
    path = npz(tmp_path / "trainable.npz", **{"weights/0": np.ones((3, 2), "uint16")})
    reading.check_npz(path, WHERE, {"weights/0": ([3, 2], "bfloat16")})


@pytest.mark.parametrize(("arrays", "reason"), [
    ({"weights/0": np.ones((3, 2), "float32")}, "lacks 'optimizer/0', which the checkpoint's layout names"),
    ({"weights/0": np.ones((2, 3), "float32"), "optimizer/0": np.int64(4)},
     "holds 'weights/0' as float32 (2, 3), the layout says float32 (3, 2)"),
    ({"weights/0": np.ones((3, 2), "float64"), "optimizer/0": np.int64(4)},
     "holds 'weights/0' as float64 (3, 2)"),
    ({"weights/0": np.ones((3, 2), "float32"), "optimizer/0": np.int64(4), "weights/1": np.zeros(1)},
     "holds 'weights/1', which the checkpoint's layout does not name"),
])
def test_an_npz_that_differs_from_its_layout_is_refused(tmp_path: Path, arrays: dict[str, Any],
                                                        reason: str) -> None:
    path = npz(tmp_path / "trainable.npz", **arrays)
    assert reason in refused(reading.read_npz, path, WHERE, LAYOUT)
    assert reason in refused(reading.check_npz, path, WHERE, LAYOUT)


# ----------------------------------------------------------------------------- HDF5 and .keras


def test_a_good_h5_passes(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "model.weights.h5", "w") as f:
        f.create_dataset("vars/0", data=np.zeros((100, 10), "float32"))
    path = tmp_path / "model.weights.h5"
    reading.check_h5(path, path.stat().st_size, WHERE, path.name)


def test_a_file_that_is_no_h5_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.weights.h5"
    path.write_bytes(b"\0" * 4096)
    text = refused(reading.check_h5, path, 4096, WHERE, path.name)
    assert "model.weights.h5 cannot be read (OSError" in text


def test_an_h5_whose_datasets_would_inflate_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "SLACK", 2**20)
    path = tmp_path / "model.weights.h5"
    with h5py.File(path, "w") as f:  # 64 MB of zeros, chunked and compressed: a few KB on disk
        f.create_dataset("vars/0", shape=(2**24,), dtype="float32", chunks=(2**20,), compression="gzip",
                         fillvalue=0)
    text = refused(reading.check_h5, path, path.stat().st_size, WHERE, path.name)
    assert "declares 64.0 MB of weights in" in text


def test_an_h5_that_reads_other_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"x" * 64)
    path = tmp_path / "model.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("vars/0", shape=(64,), dtype="uint8",
                         external=[(str(tmp_path / "secret.bin"), 0, 64)])
    text = refused(reading.check_h5, path, path.stat().st_size, WHERE, path.name)
    assert "from outside itself" in text


def test_an_h5_linking_another_file_is_refused(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("x", data=np.zeros(2))
    path = tmp_path / "model.weights.h5"
    with h5py.File(path, "w") as f:
        f["vars"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/")
    assert "links 'vars' to another file" in refused(reading.check_h5, path, path.stat().st_size, WHERE,
                                                     path.name)


def keras_file(path: Path, weights: bytes, *, compress: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", "{}")
        archive.writestr("config.json", "{}")
        archive.writestr("model.weights.h5", weights, compress_type=compress)
    return path


def h5_bytes() -> bytes:
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.create_dataset("vars/0", data=np.ones(10, "float32"))
    return buffer.getvalue()


def test_a_keras_file_is_checked_with_the_weights_inside(tmp_path: Path) -> None:
    reading.check_keras_file(keras_file(tmp_path / "model.keras", h5_bytes()), WHERE)
    bad = keras_file(tmp_path / "bad.keras", b"\0" * 4096)
    assert "bad.keras's model.weights.h5 cannot be read" in refused(reading.check_keras_file, bad, WHERE)


def test_a_keras_file_that_would_inflate_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "SLACK", 2**20)
    path = keras_file(tmp_path / "model.keras", bytes(8 * 2**20), compress=zipfile.ZIP_DEFLATED)
    assert "model.keras would inflate to 8.0 MB" in refused(reading.check_keras_file, path, WHERE)


# ----------------------------------------------------------------------------- around a library


@pytest.mark.parametrize("error", [
    ValueError("Requested the deserialization of a `Lambda` layer ...\nsafe_mode=False"),
    TypeError("Could not locate class 'system'."), KeyError("vars"), OSError("Unable to open file"),
    zipfile.BadZipFile("File is not a zip file"), RecursionError("maximum recursion depth exceeded"),
])
def test_a_library_s_refusal_is_the_damaged_checkpoint_s_line(error: Exception) -> None:
    def load() -> None:
        with reading.refusals(WHERE, "model.keras"):
            raise error

    text = refused(load)
    assert text.startswith(f"{WHERE}: model.keras cannot be read ({type(error).__name__}: ")


@pytest.mark.parametrize("error", [
    OSError(28, "No space left on device"), MemoryError(), KeyboardInterrupt(),
    ValueError("resumable does not know X in Keras 3.0"),
])
def test_what_says_nothing_about_the_file_passes_unchanged(error: BaseException) -> None:
    with pytest.raises(type(error)), reading.refusals(WHERE, "model.keras"):
        raise error
