"""`resume()` on a gs:// folder (a real fake-gcs-server) adopts what Keras' callbacks left there:
ModelCheckpoint files, a BackupAndRestore backup, OrbaxCheckpoint steps. Each continues as plain
Keras continues from the same files, says one line, and leaves every object as it was.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from keras_helpers import same_state, small_model
from test_adopt import X, Y, _Stop, adopted_lines, continued, resumed, train
from test_adopt_orbax import fresh_copy

import resumable

keras = pytest.importorskip("keras")

pytestmark = pytest.mark.slow  # Keras' side runs on the lanes in test_adopt.py

_RUNS_OWN = ("ckpt-", "index.json", "lease.json")


def uploaded(local: Path, url: str) -> dict[str, Any]:
    """``local``'s files put under ``url``; the objects there, with their checksums."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon")
    fs.put(f"{local}/", f"{url}/", recursive=True)
    return objects(url)


def objects(url: str) -> dict[str, Any]:
    """Every object under ``url`` but the run's own, with its CRC32C and generation: a rewrite shows."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon")
    fs.invalidate_cache()
    root = url.removeprefix("gs://")
    found = fs.find(root, detail=True)
    return {name[len(root) + 1:]: (info.get("crc32c"), info.get("generation"), info["size"])
            for name, info in found.items() if not name[len(root) + 1:].startswith(_RUNS_OWN)}


def test_keras_modelcheckpoint_files_in_a_bucket(tmp_path: Path, gcs_bucket: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    local = tmp_path / "ck"
    train(3, [keras.callbacks.ModelCheckpoint(str(local / "w-{epoch:02d}-{loss:.3f}.keras"))])
    newest = next(local.glob("w-03-*.keras"))
    expected = continued(keras.saving.load_model(newest), 3, 5)
    url = f"{gcs_bucket}/ck"
    before = uploaded(local, url)

    run, said = resumed(url, 5, capsys, build_model=small_model)

    lines = adopted_lines(said)
    adopted = f"adopted {newest.name} (a keras.callbacks.ModelCheckpoint file, epoch 3) in {url}"
    assert len(lines) == 1 and adopted in lines[0], said
    assert run.initial_epoch == 5 and same_state(run.model, expected)
    assert objects(url) == before  # never rewritten, never deleted
    again = resumable.resume(url, build_model=small_model, monitor="loss")  # its own checkpoint wins
    assert again.checkpoint is not None and again.checkpoint.name == "ckpt-000005"


def test_a_keras_backup_in_a_bucket(tmp_path: Path, gcs_bucket: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    local = tmp_path / "backup"
    with pytest.raises(RuntimeError):
        train(5, [keras.callbacks.BackupAndRestore(str(local), double_checkpoint=True), _Stop()])
    expected = small_model()
    expected.optimizer.build(expected.trainable_variables)
    expected.load_weights(local / "latest.weights.h5")
    continued(expected, 3, 5)
    url = f"{gcs_bucket}/backup"
    before = uploaded(local, url)

    run, said = resumed(url, 5, capsys, build_model=small_model)

    assert "adopted latest.weights.h5 (a keras.callbacks.BackupAndRestore backup, epoch 3)" in said, said
    assert same_state(run.model, expected)
    assert objects(url) == before


def test_orbax_steps_in_a_bucket(tmp_path: Path, gcs_bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed")
    local = tmp_path / "orbax"
    model = small_model()
    keras.utils.set_random_seed(11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(*_data(), epochs=3, callbacks=[keras.callbacks.OrbaxCheckpoint(str(local), max_to_keep=2)],
                  batch_size=8, verbose=0)
    url = f"{gcs_bucket}/orbax"
    before = uploaded(local, url)
    import gcsfs

    gcsfs.GCSFileSystem(token="anon").rm(f"{url.removeprefix('gs://')}/2/commit_success.txt")
    before.pop("2/commit_success.txt")  # step 2 as a writer killed before its commit left it
    expected = continued(fresh_copy(_epoch_two()), 2, 4)  # the Orbax run's model after two epochs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run, said = resumed(url, 4, capsys, build_model=small_model)

    unfinished = [str(w.message) for w in caught if "no commit_success.txt" in str(w.message)]
    assert len(unfinished) == 1 and f"{url}/2:" in unfinished[0], [str(w.message) for w in caught]
    assert "adopted step 1 (a keras.callbacks.OrbaxCheckpoint step, epoch 2)" in said, said
    assert same_state(run.model, expected)
    assert objects(url) == before


def _data() -> tuple[Any, Any]:
    return X, Y


def _epoch_two() -> Any:
    model = small_model()
    keras.utils.set_random_seed(11)
    model.fit(*_data(), epochs=2, batch_size=8, verbose=0)
    return model
