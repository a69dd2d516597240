"""A stored zip member read in place (resumable/keras/checkpoint/zip_member.py)."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from resumable.keras.checkpoint import zip_member


def make_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> None:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_a_stored_member_reads_as_its_bytes_at_any_offset(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    make_zip(tmp_path / "a.zip", {"first.json": b"{}", "model.weights.h5": data, "last": b"x" * 10})
    with open(tmp_path / "a.zip", "rb") as file, zipfile.ZipFile(file) as archive:
        window = zip_member.stored_member(archive, file, "model.weights.h5")
        assert window is not None
        assert window.read() == data
        assert window.seek(-10, io.SEEK_END) == len(data) - 10 and window.read(100) == data[-10:]
        window.seek(12_345)
        buffer = bytearray(1000)
        assert window.readinto(buffer) == 1000 and bytes(buffer) == data[12_345:13_345]
        assert window.read(5) == data[13_345:13_350] and window.tell() == 13_350
        with pytest.raises(io.UnsupportedOperation):
            window.write(b"no")


def test_h5py_reads_an_hdf5_file_through_the_window(tmp_path: Path) -> None:
    values = np.random.default_rng(0).normal(size=(300, 70)).astype("float32")
    with h5py.File(tmp_path / "w.h5", "w") as f:
        f["vars/0"] = values
    weights = (tmp_path / "w.h5").read_bytes()
    make_zip(tmp_path / "m.keras", {"config.json": b"{}", "model.weights.h5": weights})
    with open(tmp_path / "m.keras", "rb") as file, zipfile.ZipFile(file) as archive:
        window = zip_member.stored_member(archive, file, "model.weights.h5")
        with h5py.File(window, "r") as f:
            np.testing.assert_array_equal(f["vars/0"][()], values)


def test_a_compressed_missing_or_cut_member_is_not_read_in_place(tmp_path: Path) -> None:
    make_zip(tmp_path / "c.zip", {"model.weights.h5": b"a" * 1000}, zipfile.ZIP_DEFLATED)
    with open(tmp_path / "c.zip", "rb") as file, zipfile.ZipFile(file) as archive:
        assert zip_member.stored_member(archive, file, "model.weights.h5") is None
        assert zip_member.stored_member(archive, file, "other") is None
    make_zip(tmp_path / "s.zip", {"model.weights.h5": b"a" * 1000})
    with open(tmp_path / "s.zip", "rb") as file, zipfile.ZipFile(file) as archive:
        info = archive.getinfo("model.weights.h5")
        info.file_size = 10**9  # the central directory claims more than the file holds
        assert zip_member.stored_member(archive, file, "model.weights.h5") is None


def test_resume_with_build_model_reads_the_weights_in_place(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import keras

    import resumable
    from resumable.keras import compat

    def build() -> keras.Model:
        keras.utils.set_random_seed(2)
        inputs = keras.Input((8,))
        model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(16)(inputs)))
        model.compile(optimizer="adam", loss="mse")
        return model

    x = np.random.default_rng(1).normal(size=(32, 8)).astype("float32")
    first = resumable.resume(str(tmp_path / "run"), build_model=build, monitor="loss")
    first.fit(x, x[:, :3], epochs=1, verbose=0)
    windows: list[object] = []
    original = compat.load_weights_from
    def load_weights_from(model: keras.Model, file: object) -> bool:
        windows.append(file)
        return original(model, file)

    monkeypatch.setattr(compat, "load_weights_from", load_weights_from)
    resumed = resumable.resume(str(tmp_path / "run"), build_model=build, monitor="loss")
    assert len(windows) == 1 and isinstance(windows[0], zip_member.MemberWindow)
    for a, b in zip([*first.model.weights, *first.model.optimizer.variables],
                    [*resumed.model.weights, *resumed.model.optimizer.variables], strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_resume_without_build_model_reads_the_weights_and_assets_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model, its compile arguments, weights, optimizer state and assets (a lookup layer's
    vocabulary), as keras.saving.load_model gives them, read from a window onto the member."""
    import keras

    from resumable.keras import compat
    from resumable.keras.checkpoint import files_to_model, model_to_files

    lookup = keras.layers.StringLookup(name="lookup")
    lookup.adapt(np.array(["cat", "dog", "emu", "dog"]))  # an adapted vocabulary is saved as an asset
    inputs = keras.Input((1,), dtype="string")
    ids = lookup(inputs)
    outputs = keras.layers.Dense(2)(keras.layers.Embedding(5, 4)(ids))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse")
    model.optimizer.build(model.trainable_variables)
    model_to_files.save(model, tmp_path / "ckpt", weights_only=False, state={})
    archives: list[object] = []
    original = compat.load_keras_archive

    def load_keras_archive(archive: object, weights: object) -> keras.Model | None:
        archives.append(weights)
        return original(archive, weights)

    monkeypatch.setattr(compat, "load_keras_archive", load_keras_archive)
    ours = files_to_model.load_model(tmp_path / "ckpt", None, where="ckpt")
    theirs = keras.saving.load_model(tmp_path / "ckpt" / "model.keras")
    assert len(archives) == 1 and isinstance(archives[0], zip_member.MemberWindow)
    with zipfile.ZipFile(tmp_path / "ckpt" / "model.keras") as archive:
        assert any(name.startswith("assets/") for name in archive.namelist())
    assert ours.get_layer("lookup").get_vocabulary() == theirs.get_layer("lookup").get_vocabulary()
    assert ours.optimizer.learning_rate.numpy() == pytest.approx(3e-3) and ours.loss == theirs.loss
    for a, b in zip([*ours.weights, *ours.optimizer.variables],
                    [*theirs.weights, *theirs.optimizer.variables], strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_a_member_written_in_place_at_any_offsets_is_a_valid_stored_member(tmp_path: Path) -> None:
    """h5py writes out of order; the member's size and CRC-32 come from the writes themselves."""
    import os
    import random

    from resumable.core.checksum import crc32c_of_file
    from resumable.keras.checkpoint.zip_member import write_in_place
    from resumable.storage.written_files import WrittenFiles

    content = bytearray(os.urandom(1_000_000))
    rng = random.Random(7)

    def write(member: Any) -> None:
        member.write(bytes(content[:4096]))  # a small header first
        pieces = [(at, min(at + 200_000, len(content))) for at in range(4096, len(content), 200_000)]
        rng.shuffle(pieces)
        for start, end in pieces:
            member.seek(start)
            member.write(bytes(content[start:end]))
        member.seek(10)  # the header rewritten at the end, as HDF5 does
        member.write(b"HEADER")
        content[10:16] = b"HEADER"

    files = WrittenFiles(tmp_path)
    with files.create("model.keras") as file, zipfile.ZipFile(file, "w") as archive:
        archive.writestr("config.json", "{}")
        write_in_place(archive, file, "model.weights.h5", write)
        archive.writestr("assets/vocab.txt", "a\nb\n")
    path = tmp_path / "model.keras"
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every member's CRC-32 checks out
        assert archive.read("model.weights.h5") == bytes(content)
        assert archive.getinfo("model.weights.h5").compress_type == zipfile.ZIP_STORED
        assert archive.read("assets/vocab.txt") == b"a\nb\n"
    assert files.entries["model.keras"].crc32c == crc32c_of_file(path) and files.reread == 0


def test_a_full_disk_while_writing_in_place_is_raised_as_itself(tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """ENOSPC from h5py's writes (the weights' truncate; found by the local-folder sweep)
    reaches the caller as the OSError it is, so that the save says "no space left ... free space".
    Before, closing the zip at the end of its ``with`` raised "Can't close the ZIP file while there
    is an open writing handle" in its place, and ZipFile.__del__ printed that again with a traceback."""
    import errno
    import gc

    from resumable.keras.checkpoint.zip_member import write_in_place
    from resumable.storage.written_files import WrittenFiles

    def write(member: Any) -> None:
        member.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    files = WrittenFiles(tmp_path)
    with pytest.raises(OSError) as caught, files.create("model.keras") as file, \
            zipfile.ZipFile(file, "w") as archive:
        archive.writestr("config.json", "{}")
        write_in_place(archive, file, "model.weights.h5", write)
    assert caught.value.errno == errno.ENOSPC
    del archive
    gc.collect()
    assert "Traceback" not in capfd.readouterr().err
