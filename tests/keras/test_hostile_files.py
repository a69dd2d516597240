"""Files NumPy, h5py or Keras refuse, with the manifest's checksums right: resume() warns once,
calls the checkpoint damaged and resumes from the one before it; BackupAndRestore too.

Each case rewrites the newest checkpoint's file and its manifest entry, as whoever can write the
run folder can (see docs/reliability.md). The boundary itself: test_checkpoint_reading.py.
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import replace_payload_file, small_model

import resumable
from resumable import RunStorage
from resumable.keras.checkpoint import checkpoint_reading, snapshot, training_state
from resumable.keras.checkpoint.trainable import TRAINABLE_FILE

keras = pytest.importorskip("keras")

pytestmark = pytest.mark.slow

rng = np.random.default_rng(0)
X = rng.normal(size=(64, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
FIT: dict[str, Any] = {"batch_size": 32, "shuffle": False, "verbose": 0, "validation_data": (X[:32], Y[:32])}


def make_model() -> Any:
    return small_model(dropout=0.1)


def lora_model() -> Any:
    keras.utils.set_random_seed(3)
    base = keras.layers.Dense(16, activation="relu", name="base")
    model = keras.Sequential([keras.Input((8,)), base, keras.layers.Dense(1, name="out")])
    base.enable_lora(2)
    model.compile(optimizer="adam", loss="mse")
    return model


def trained(folder: Path, build: Callable[[], Any], **args: Any) -> Path:
    run = resumable.resume(str(folder), build_model=build, async_upload=False, **args)
    run.fit(X, Y, epochs=2, **FIT)
    return folder


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained(tmp_path_factory.mktemp("full") / "run", make_model)


@pytest.fixture(scope="module")
def trainable_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained(tmp_path_factory.mktemp("trainable") / "run", lora_model, save_trainable_only=True)


def copy_of(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def resumed_with_one_warning(url: Path, build: Callable[[], Any] | None, expected: str) -> resumable.Run:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = resumable.resume(str(url), build_model=build, async_upload=False)
    said = [str(w.message) for w in caught if "resumable:" in str(w.message)]
    assert len(said) == 1, said
    assert "ckpt-000002" in said[0] and expected in said[0] and checkpoint_reading.DAMAGED in said[0]
    assert "\n" not in said[0]
    assert run.checkpoint is not None and run.checkpoint.name == "ckpt-000001"
    return run


def object_array() -> bytes:
    return npz_bytes(**{"seed_generators/0": np.array([{"a": 1}], dtype=object)})


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 .npy header, of any shape we choose."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    body = text + b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


def deflated_zeros(size: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("seed_generators/0.npy", "w", force_zip64=True) as f:
        f.write(npy_header("|u1", (size,)))
        for _ in range(size // 2**20):
            f.write(bytes(2**20))
    return buffer.getvalue()


def lying_header() -> bytes:
    """A header asking for 4 TB over 8 bytes of data, the zip's own CRC right."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("seed_generators/0.npy", npy_header("<u4", (2**40,)) + bytes(8))
    return buffer.getvalue()


ARRAYS = {
    "object-array": (object_array, "arrays.npz holds 'seed_generators/0' of dtype object"),
    "not-a-zip": (lambda: b"garbage" * 1000, "arrays.npz is not a zip archive"),
    "lying-header": (lying_header, "does not match"),
    "inflates": (lambda: deflated_zeros(8 * 2**20), "arrays.npz would inflate to 8.0 MB"),
}


@pytest.mark.parametrize(("data", "expected"), ARRAYS.values(), ids=ARRAYS.keys())
def test_resume_falls_back_past_a_hostile_arrays_file(full_run: Path, tmp_path: Path,
                                                      data: Callable[[], bytes], expected: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_reading, "SLACK", 2**20)  # an 8 MB bomb stands for a 1 GB one
    url = copy_of(full_run, tmp_path)
    replace_payload_file(url, snapshot.ARRAYS_FILE, data())
    run = resumed_with_one_warning(url, make_model, expected)
    run.fit(X, Y, epochs=3, **FIT)  # the damaged one is replaced, the run goes on
    good = [i.name for i in RunStorage(str(url)).list() if i.ok]
    assert good == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]


def rewritten_keras(model_file: Path, **changes: bytes) -> bytes:
    """The .keras file with some members replaced."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(model_file) as source, zipfile.ZipFile(buffer, "w") as target:
        for member in source.infolist():
            target.writestr(member, changes.get(member.filename, source.read(member)))
    return buffer.getvalue()


def with_layer(config: dict[str, Any], layer: dict[str, Any]) -> bytes:
    config = json.loads(json.dumps(config))
    config["config"]["layers"].insert(1, layer)
    return json.dumps(config).encode()


LAMBDA = {"module": "keras.layers", "class_name": "Lambda", "config": {
    "name": "evil", "function": {"class_name": "__lambda__", "config": {
        "code": "4wEAAAAAAAAAAAAAAAEAAAACAAAAQwAAAHMEAAAAfABTACkBTqkAKQHaAXhyAQAAAHIBAAAA+gg8c3RkaW4+"
                "2gg8bGFtYmRhPgEAAABzAAAAAA==", "defaults": None, "closure": None}}}, "build_config": None}
OS_SYSTEM = {"module": "os", "class_name": "system", "config": {"name": "evil"}, "registered_name": None}


@pytest.mark.parametrize(("layer", "expected"), [
    (LAMBDA, "model.keras (loaded without build_model) cannot be read (ValueError: Requested the "
             "deserialization of a `Lambda` layer"),
    (OS_SYSTEM, "model.keras (loaded without build_model) cannot be read (TypeError"),
], ids=["lambda", "module-os"])
def test_resume_without_build_model_falls_back_past_what_safe_mode_refuses(
        full_run: Path, tmp_path: Path, layer: dict[str, Any], expected: str) -> None:
    url = copy_of(full_run, tmp_path)
    model_file = url / "ckpt-000002" / snapshot.MODEL_FILE
    with zipfile.ZipFile(model_file) as archive:
        config = json.loads(archive.read("config.json"))
    replace_payload_file(url, snapshot.MODEL_FILE, rewritten_keras(model_file, **{
        "config.json": with_layer(config, layer)}))
    run = resumed_with_one_warning(url, None, expected)
    assert run.model.count_params() == make_model().count_params()


def test_a_model_file_that_is_no_zip_or_holds_no_hdf5_falls_back(full_run: Path, tmp_path: Path) -> None:
    url = copy_of(full_run, tmp_path)
    replace_payload_file(url, snapshot.MODEL_FILE, b"garbage" * 100)
    resumed_with_one_warning(url, make_model, "model.keras is not a zip archive")
    url = copy_of(full_run, tmp_path / "second")
    model_file = url / "ckpt-000002" / snapshot.MODEL_FILE
    replace_payload_file(url, snapshot.MODEL_FILE, rewritten_keras(model_file, **{
        snapshot.WEIGHTS_FILE: b"\0" * 4096}))
    resumed_with_one_warning(url, None, "model.keras's model.weights.h5 cannot be read (OSError")


TRAINABLE = {
    "missing-key": (lambda arrays: {k: v for k, v in arrays.items() if k != "optimizer/0"},
                    "lacks 'optimizer/0'"),
    "wrong-shape": (lambda arrays: {**arrays, "weights/0": np.zeros((3, 3), "float32")},
                    "holds 'weights/0' as float32 (3, 3)"),
    "wrong-dtype": (lambda arrays: {**arrays, "weights/0": arrays["weights/0"].astype("float64")},
                    "holds 'weights/0' as float64"),
    "object": (lambda arrays: {**arrays, "weights/0": np.array([None], dtype=object)}, "of dtype object"),
}


@pytest.mark.parametrize(("change", "expected"), TRAINABLE.values(), ids=TRAINABLE.keys())
def test_resume_falls_back_past_a_hostile_trainable_file(trainable_run: Path, tmp_path: Path,
                                                         change: Callable[[dict[str, Any]], dict[str, Any]],
                                                         expected: str) -> None:
    url = copy_of(trainable_run, tmp_path)
    with np.load(url / "ckpt-000002" / TRAINABLE_FILE) as data:
        arrays = {key: data[key] for key in data.files}
    replace_payload_file(url, TRAINABLE_FILE, npz_bytes(**change(arrays)))
    run = resumed_with_one_warning(url, lora_model, expected)
    assert training_state.iterations(run.model) == 2  # ckpt-000001's two steps, loaded


def test_backup_and_restore_falls_back_past_a_hostile_arrays_file(full_run: Path, tmp_path: Path) -> None:
    url = copy_of(full_run, tmp_path)
    replace_payload_file(url, snapshot.ARRAYS_FILE, object_array())
    model = make_model()
    backup = resumable.BackupAndRestore(str(url), delete_checkpoint=False, async_upload=False)
    with pytest.warns(UserWarning, match="ckpt-000002: arrays.npz holds 'seed_generators/0' of dtype object"):
        history = model.fit(X, Y, epochs=3, callbacks=[backup], **FIT)
    assert history.epoch == [1, 2]  # restored from ckpt-000001
