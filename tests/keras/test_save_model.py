"""resumable.save_model and load_model: one-off saves to a local folder, Drive or gs:// (any fsspec
URL), in Keras' formats, landed whole with a checksum record, and read back checked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from keras_helpers import dropin_job, same_state

import resumable
from resumable import CorruptCheckpointError, DriveNotMountedError

keras = pytest.importorskip("keras")

X = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
Y = (X[:, :1] > 0).astype("float32")


def make_model() -> Any:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="mse", metrics=["accuracy"])
    return model


@pytest.mark.slow
def test_every_format_to_every_storage_and_back(run_url: str) -> None:
    """Local, memory:// and gs:// (a real fake-gcs-server); .keras, .weights.h5, .h5 and .hdf5."""
    model = make_model()
    model.fit(X, Y, epochs=2, batch_size=4, verbose=0)
    for name in ("model.keras", "model.weights.h5", "model.h5", "model.hdf5"):
        url = f"{run_url}/sub/{name}"
        record = resumable.save_model(model, url)
        assert resumable.verify_file(url) == record and record.details["step"] == 8
        if name.endswith(".weights.h5"):
            back = make_model()
            resumable.load_weights(back, url)
        else:
            back = resumable.load_model(url)
        assert same_state(back, model), name  # the weights and the optimizer state, every format
        back.fit(X, Y, epochs=1, batch_size=4, verbose=0)  # and training goes on from there
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        resumable.save_model(make_model(), f"{run_url}/sub/model.keras", overwrite=False)
    assert same_state(resumable.load_model(f"{run_url}/sub/model.keras"), model)  # untouched
    with pytest.raises(ValueError, match="ending in .keras"):
        resumable.save_model(model, f"{run_url}/sub/model.txt")
    resumable.save_model(model, f"{run_url}/folder.keras/x.keras")
    with pytest.raises(IsADirectoryError, match="a folder is there"):
        resumable.save_model(model, f"{run_url}/folder.keras")


@pytest.mark.slow
def test_gcs_without_tensorflow_gcs_support_lands_in_the_bucket(gcs_bucket: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain Keras' model.save("gs://...h5") without TensorFlow's GCS support "succeeds" into
    ./gs:/...: resumable's goes to the bucket, and a damaged copy is refused on load."""
    monkeypatch.chdir(tmp_path)
    model = make_model()
    model.fit(X, Y, epochs=1, batch_size=4, verbose=0)
    resumable.save_model(model, f"{gcs_bucket}/b/model.h5")
    assert list(tmp_path.iterdir()) == []  # nothing written to the local folder
    import fsspec

    fs = fsspec.filesystem("gs")
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{gcs_bucket}/b", refresh=True)) == [
        ".model.h5.resumable.json", "model.h5"]
    assert same_state(resumable.load_model(f"{gcs_bucket}/b/model.h5"), model)
    fs.pipe_file(f"{gcs_bucket}/b/model.h5", b"garbage")
    with pytest.raises(CorruptCheckpointError, match="does not match its checksum record"):
        resumable.load_model(f"{gcs_bucket}/b/model.h5")


def test_a_drive_path_is_refused_while_drive_is_not_mounted() -> None:
    if os.path.ismount("/content/drive"):
        pytest.skip("Google Drive is mounted here")
    with pytest.raises(DriveNotMountedError, match=r"drive.mount\('/content/drive'\)"):
        resumable.save_model(make_model(), "/content/drive/MyDrive/models/model.h5")
    assert not os.path.exists("/content/drive/MyDrive")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_killed_mid_save_leaves_the_previous_file(where: str, tmp_path: Path, request: Any) -> None:
    base = str(tmp_path) if where == "local" else request.getfixturevalue("gcs_bucket")
    url = f"{base}/model.keras"
    dropin_job("save_model", url, "--epochs", "3", "--kill-at-save", "2", killed=True)
    record = resumable.verify_file(url)
    assert record is not None and record.details["step"] == 4  # epoch 1's save, whole
    resumable.load_model(url)
    dropin_job("save_model", url, "--epochs", "2")
    record = resumable.verify_file(url)
    assert record is not None and record.details["step"] == 8
    if where == "local":
        assert sorted(p.name for p in tmp_path.iterdir()) == [".model.keras.resumable.json", "model.keras"]
