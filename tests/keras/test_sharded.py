"""Checkpoints whose weights go to shards (max_shard_size): written, moved and resumed exactly.

On a Keras that writes no shards (3.8 to 3.10: one file instead, said once), the local runs'
checkpoints are rewritten in shards after training (tests/reshard.py), as a newer Keras on
another Colab runtime would have written them: they must resume on every Keras.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from forked import job_env, run_job
from paths import JOBS
from reshard import reshard

import resumable
from resumable import CheckpointMismatchError, CheckpointNotFoundError, RunStorage
from resumable.core.checksum import crc32c_of_file
from resumable.keras import compat
from resumable.manager.arrival import Arrival
from resumable.storage import transfers
from resumable.storage.transfers import Transfers

pytestmark = pytest.mark.slow

TINY = 4e-6  # GiB: about 4 KiB, so this model's weights and Adam's state need several shards
SHARDS = compat.can_shard()  # whether this Keras writes them (probed once)
X = np.random.default_rng(3).normal(size=(64, 16)).astype("float32")
Y = X[:, :2] * 0.5


def build() -> keras.Model:
    keras.utils.set_random_seed(11)
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
    model.compile(optimizer="adam", loss="mse")
    return model


def state_of(model: keras.Model) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v) for v in [*model.weights, *model.optimizer.variables]]


def assert_same(a: keras.Model, b: keras.Model) -> None:
    for x, y in zip(state_of(a), state_of(b), strict=True):
        np.testing.assert_array_equal(x, y)


def train(url: str, epochs: int, **options: Any) -> resumable.Run:
    """A run of ``epochs`` whose checkpoints are sharded: by this Keras, or else rewritten so
    (local runs only: a bucket's runs need a Keras that shards)."""
    if not SHARDS and "://" in url:
        pytest.skip(f"Keras {keras.__version__} writes no shards; the local tests resume rewritten ones")
    run = resumable.resume(url, build_model=build, monitor="loss", max_shard_size=TINY, **options)
    run.fit(X, Y, epochs=epochs, batch_size=16, verbose=0)
    if not SHARDS:
        reshard(Path(url), int(TINY * 2**30))
    return run


@pytest.mark.lanes
@pytest.mark.skipif(not SHARDS, reason="this Keras writes no shards (test_a_keras_that_cannot_shard...)")
def test_weights_over_the_limit_go_to_shards_each_checked(tmp_path: Path) -> None:
    run = train(str(tmp_path / "run"), 2)
    (info,) = [c for c in RunStorage(str(tmp_path / "run")).list() if c.epoch == 2]
    assert info.manifest is not None and info.manifest.payload == "model.weights.json"
    shards = sorted(f for f in info.manifest.files if f.endswith(".weights.h5"))
    assert len(shards) >= 3 and shards[0] == "model_00000.weights.h5"
    assert {"config.json", "metadata.json", "state.json"} <= set(info.manifest.files)
    assert "model.keras" not in info.manifest.files
    # Keras' own format: plain Keras reads it back, shard by shard
    folder = tmp_path / "run" / info.name
    plain = keras.models.model_from_json((folder / "config.json").read_text())
    plain.compile(optimizer="adam", loss="mse")
    plain.optimizer.build(plain.trainable_variables)
    plain.load_weights(str(folder / "model.weights.json"))
    assert_same(plain, run.model)


@pytest.mark.lanes
@pytest.mark.skipif(SHARDS, reason="this Keras writes shards (test_weights_over_the_limit...)")
def test_a_keras_that_cannot_shard_writes_one_file_that_plain_keras_reads(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    compat.messages.warn_once.cache_clear()
    compat.sharding_works.cache_clear()
    with caplog.at_level("WARNING", logger="resumable"):
        run = resumable.resume(str(tmp_path / "run"), build_model=build, monitor="loss", max_shard_size=TINY)
        run.fit(X, Y, epochs=2, batch_size=16, verbose=0)
    said = [r.getMessage() for r in caplog.records if "one file" in r.getMessage()]
    assert len(said) == 1 and keras.__version__ in said[0] and "\n" not in said[0], said
    (info,) = [c for c in RunStorage(str(tmp_path / "run")).list() if c.epoch == 2]
    assert info.manifest is not None and info.manifest.payload == "model.keras"
    plain = keras.saving.load_model(str(tmp_path / "run" / info.name / "model.keras"))
    assert_same(plain, run.model)


@pytest.mark.lanes
@pytest.mark.parametrize("reader", ["keras", "merged"])
@pytest.mark.parametrize("with_build_model", [False, True])
def test_a_sharded_checkpoint_resumes_exactly(tmp_path: Path, with_build_model: bool, reader: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Read by Keras' sharded store where it behaves, else merged into one file for load_weights
    and load_model (Keras 3.8 to 3.10 always take that way)."""
    if reader == "merged":
        monkeypatch.setattr(compat, "load_sharded_weights", lambda *args: False)
        monkeypatch.setattr(compat, "load_unzipped_model", lambda *args: None)
    straight = train(str(tmp_path / "straight"), 3)
    train(str(tmp_path / "run"), 2)
    resumed = resumable.resume(str(tmp_path / "run"), build_model=build if with_build_model else None,
                               monitor="loss", max_shard_size=TINY)
    assert resumed.initial_epoch == 2
    resumed.fit(X, Y, epochs=3, batch_size=16, verbose=0)
    assert_same(resumed.model, straight.model)


@pytest.mark.lanes
def test_weights_only_shards_need_build_model(tmp_path: Path) -> None:
    run = train(str(tmp_path / "run"), 1, save_weights_only=True)
    (info,) = RunStorage(str(tmp_path / "run")).list()
    assert info.manifest is not None and info.manifest.payload == "model.weights.json"
    assert "config.json" not in info.manifest.files
    with pytest.raises(CheckpointNotFoundError, match="holds weights only"):
        resumable.resume(str(tmp_path / "run"))
    assert_same(resumable.resume(str(tmp_path / "run"), build_model=build, monitor="loss").model, run.model)


def test_below_the_limit_one_model_keras_as_before(tmp_path: Path) -> None:
    run = resumable.resume(str(tmp_path / "run"), build_model=build, monitor="loss")  # default: 1 GiB
    run.fit(X, Y, epochs=1, verbose=0)
    (info,) = RunStorage(str(tmp_path / "run")).list()
    assert info.manifest is not None and info.manifest.payload == "model.keras"
    assert not any(f.endswith(".weights.h5") or f.endswith(".json") and f != "state.json"
                   for f in info.manifest.files)


@pytest.mark.lanes
def test_a_damaged_shard_falls_back_to_the_older_checkpoint(tmp_path: Path) -> None:
    train(str(tmp_path / "run"), 2, keep_last=None)
    shard = tmp_path / "run" / "ckpt-000002" / "model_00001.weights.h5"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"ckpt-000002/model_00001\.weights\.h5: .*damaged"):
        resumed = resumable.resume(str(tmp_path / "run"), build_model=build, monitor="loss")
    assert resumed.initial_epoch == 1


def test_a_sharded_checkpoint_that_does_not_fit_is_refused_in_one_line(tmp_path: Path) -> None:
    train(str(tmp_path / "run"), 1)

    def other() -> keras.Model:
        inputs = keras.Input((16,))
        hidden = keras.layers.Dense(8, name="hidden")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
        model.compile(optimizer="adam", loss="mse")
        return model

    with pytest.raises(CheckpointMismatchError) as caught:
        resumable.resume(str(tmp_path / "run"), build_model=other)
    assert "\n" not in str(caught.value) and "hidden" in str(caught.value)


def forge_shard_map(folder: Path, text: bytes) -> None:
    """Replace a checkpoint's shard map, its manifest updated to vouch for it: as a hostile or
    buggy writer would leave it (the checksums check out)."""
    (folder / "model.weights.json").write_bytes(text)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["model.weights.json"] = {"size": len(text),
                                               "crc32c": crc32c_of_file(folder / "model.weights.json")}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.lanes
@pytest.mark.parametrize(("names", "said"), [
    ("../../outside/precious.h5", "names '../../outside/precious.h5', which is no shard"),
    ("state.json", "names 'state.json', which is no shard"),
    ("model_00099.weights.h5", "names a shard the checkpoint does not hold"),
    ("manifest.json", "names 'manifest.json', which is no shard"),
    (None, "has no weight_map object"),
])
@pytest.mark.parametrize("with_build_model", [False, True])
def test_a_shard_map_naming_other_files_is_a_damaged_checkpoint(tmp_path: Path, names: str | None, said: str,
                                                               with_build_model: bool) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "precious.h5").write_bytes(b"keep me")
    train(str(tmp_path / "run"), 2, keep_last=None)
    folder = tmp_path / "run" / "ckpt-000002"
    shards = json.loads((folder / "model.weights.json").read_text())
    if names is None:
        del shards["weight_map"]
    else:
        shards["weight_map"][next(iter(shards["weight_map"]))] = names
    forge_shard_map(folder, json.dumps(shards).encode())
    with pytest.warns(UserWarning) as warned:
        resumed = resumable.resume(str(tmp_path / "run"), build_model=build if with_build_model else None,
                                   monitor="loss")
    messages = [str(w.message) for w in warned if "damaged" in str(w.message)]
    assert len(messages) == 1 and f"ckpt-000002: model.weights.json: {said}" in messages[0], messages
    assert "\n" not in messages[0]
    assert resumed.initial_epoch == 1
    assert (tmp_path / "outside" / "precious.h5").read_bytes() == b"keep me"


@pytest.mark.parametrize("size", [0, -1.0, float("nan"), "1", True])
def test_a_bad_max_shard_size_is_one_line(tmp_path: Path, size: Any) -> None:
    with pytest.raises(ValueError, match=r"^Invalid value for argument `max_shard_size`\. .*GiB"):
        resumable.CheckpointCallback(str(tmp_path / "run"), max_shard_size=size)


def test_from_gcs_shards_go_up_together_and_are_loaded_as_they_come_down(
        gcs_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last shard's download waits until the loader has read the first one: only a loader
    that reads shards as they land gets there (one that waited for all would time out)."""
    monkeypatch.setattr(transfers, "TOGETHER_MIN_BYTES", 1)  # every file counts as big here
    uploaders: set[str] = set()
    original_upload = Transfers.upload

    def upload(self: Transfers, *args: Any, **kwargs: Any) -> Any:
        uploaders.add(threading.current_thread().name)
        return original_upload(self, *args, **kwargs)

    monkeypatch.setattr(Transfers, "upload", upload)
    url = gcs_bucket + "/runs/sharded"
    straight = train(str(tmp_path / "straight"), 2)
    train(url, 1, staging_dir=tmp_path / "staging-1")
    assert any(name.startswith("resumable-files") for name in uploaders)

    first_read = threading.Event()
    original_wait = Arrival.wait_for

    def wait_for(self: Arrival, rel: str) -> Path:
        found = original_wait(self, rel)
        if rel == "model_00000.weights.h5":
            first_read.set()
        return found

    (info,) = RunStorage(url).list()
    shards = sorted(f for f in (info.manifest.files if info.manifest else {}) if f.endswith(".weights.h5"))
    original_fetch = Transfers._fetch_file
    gate: list[bool] = []

    def fetch_file(self: Transfers, name: str, rel: str, *args: Any, **kwargs: Any) -> Any:
        if rel == shards[-1]:
            gate.append(first_read.wait(timeout=20))
        return original_fetch(self, name, rel, *args, **kwargs)

    monkeypatch.setattr(Arrival, "wait_for", wait_for)
    monkeypatch.setattr(Transfers, "_fetch_file", fetch_file)
    resumed = resumable.resume(url, build_model=build, monitor="loss", max_shard_size=TINY,
                               staging_dir=tmp_path / "staging-2")
    assert len(shards) >= 3 and gate == [True]
    assert resumed.initial_epoch == 1
    resumed.fit(X, Y, epochs=2, batch_size=16, verbose=0)
    assert_same(resumed.model, straight.model)


def test_a_shard_that_comes_down_damaged_falls_back_to_the_older_checkpoint(
        gcs_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored shard is good (the listing's CRC32C agrees); its download is not, after the
    loader has begun with the first shards."""
    url = gcs_bucket + "/runs/damaged"
    train(url, 2, keep_last=None, staging_dir=tmp_path / "staging-1")
    original = Transfers._download
    spoiled: list[str] = []

    def download(self: Transfers, remote: str, local: str, *args: Any, **kwargs: Any) -> None:
        original(self, remote, local, *args, **kwargs)
        if remote.endswith("ckpt-000002/model_00002.weights.h5"):
            data = bytearray(Path(local).read_bytes())
            data[len(data) // 2] ^= 0xFF
            Path(local).write_bytes(bytes(data))
            spoiled.append(remote)

    monkeypatch.setattr(Transfers, "_download", download)
    with pytest.warns(UserWarning, match=r"ckpt-000002/model_00002\.weights\.h5: .*damaged"):
        resumed = resumable.resume(url, build_model=build, monitor="loss", staging_dir=tmp_path / "staging-2")
    assert spoiled and resumed.initial_epoch == 1
    assert not list((tmp_path / "staging-2").rglob("*.part"))
    straight = train(str(tmp_path / "straight"), 1)
    assert_same(resumed.model, straight.model)


def test_jax_resumes_a_sharded_checkpoint_exactly(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    done = run_job(JOBS / "sharded_job.py", [str(tmp_path / "run")], env=job_env("jax"), cwd=JOBS)
    assert done.returncode == 0 and "EQUAL" in done.stdout, done.stdout + done.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "ckpt-000002" / "manifest.json").read_text())
    assert manifest["payload"] == "model.weights.json"
