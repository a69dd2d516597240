"""`resumable list / inspect / verify / prune` on what Keras wrote and `resume()` adopts: OrbaxCheckpoint
steps (alone, and beside a run's checkpoints), ModelCheckpoint files and a BackupAndRestore backup.
They are named as what they are, never "partial: an interrupted save" nor damaged, and never deleted.

The Keras layouts are written as Keras 3.15 writes them (file names; contents are not read by the
CLI); tests/keras/test_adopt.py runs the same commands on folders real Keras versions wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest
from test_cli import build_run, cli, remove_manifest, row

pytestmark = pytest.mark.lanes  # Keras-free and quick: the listing on each Colab's fsspec and gcsfs

# The files of an OrbaxCheckpoint step folder (Keras 3.15, orbax-checkpoint 0.12), as they are listed.
ORBAX_FILES = {"_CHECKPOINT_METADATA": b'{"item_handlers": {"pytree": "PyTreeCheckpointHandler"}}',
               "commit_success.txt": b"Checkpoint commit was successful to step",
               "pytree/_METADATA": b"{}", "pytree/manifest.ocdbt": b"\x00" * 113}


def write_steps(url: str, numbers: list[int]) -> dict[str, bytes]:
    """Orbax step folders in ``url``; every byte written, by path, to check nothing changed."""
    fs, root = fsspec.core.url_to_fs(url)
    written = {}
    for n in numbers:
        for rel, data in ORBAX_FILES.items():
            fs.makedirs(f"{root}/{n}/{rel}".rsplit("/", 1)[0], exist_ok=True)
            fs.pipe_file(f"{root}/{n}/{rel}", data)
            written[f"{n}/{rel}"] = data
    return written


def still_there(url: str, written: dict[str, bytes]) -> bool:
    fs, root = fsspec.core.url_to_fs(url)
    return all(fs.cat_file(f"{root}/{rel}") == data for rel, data in written.items())


@pytest.fixture(params=["local", "gcs"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "orbax")
    return f"{request.getfixturevalue('gcs_bucket')}/runs/orbax"


def test_a_folder_of_orbax_steps(capsys: pytest.CaptureFixture[str], url: str) -> None:
    written = write_steps(url, [1, 2])

    code, out, _ = cli(capsys, "list", url)
    assert code == 0 and row(out, "2")[-1] == "adoptable" and row(out, "1")[-1] == "adoptable", out
    assert "partial" not in out and "interrupted" not in out, out
    assert "2: adoptable: a Keras OrbaxCheckpoint step, adopted by resume()" in out
    assert "0 checkpoints and 2 Keras OrbaxCheckpoint steps" in out
    assert "resume() adopts the newest good Keras OrbaxCheckpoint step" in out and "afresh" not in out

    code, out, _ = cli(capsys, "list", url, "--json")
    listed = json.loads(out)["checkpoints"]
    assert [(c["name"], c["status"], c["kind"]) for c in listed] == [
        ("1", "adoptable", "Keras OrbaxCheckpoint step"), ("2", "adoptable", "Keras OrbaxCheckpoint step")]
    assert all("adopted by resume()" in c["problem"] for c in listed)

    code, out, _ = cli(capsys, "inspect", url, "--name", "2")
    assert code == 0 and "status      adoptable: a Keras OrbaxCheckpoint step" in out, out
    assert "Orbax's (no manifest)" in out and "not in the manifest" not in out

    code, out, _ = cli(capsys, "verify", url)
    assert code == 0 and "nothing to verify" in out and "2 Keras OrbaxCheckpoint steps (1, 2)" in out, out
    assert "failed" not in out
    code, out, _ = cli(capsys, "verify", url, "--json")
    assert code == 0 and json.loads(out)["ok"] is True

    code, out, _ = cli(capsys, "prune", url, "--keep-last", "1", "--yes")
    assert code == 0 and "never deleted: 2 Keras OrbaxCheckpoint steps" in out and "nothing to delete" in out
    assert still_there(url, written)

    if url.startswith("gs://"):  # written in place there: a step without its commit file is unfinished
        fs, root = fsspec.core.url_to_fs(url)
        fs.rm_file(f"{root}/2/commit_success.txt")
        del written["2/commit_success.txt"]
        code, out, _ = cli(capsys, "list", url)
        assert "2: adoptable: a Keras OrbaxCheckpoint step Orbax did not finish writing (no " \
            "commit_success.txt): resume() skips it" in out, out
        assert "1: adoptable: a Keras OrbaxCheckpoint step, adopted by resume()" in out
        assert cli(capsys, "prune", url, "--yes")[0] == 0 and still_there(url, written)


def test_orbax_steps_beside_a_runs_checkpoints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A folder resume() adopted a step of and then checkpointed in: prune deletes only checkpoints."""
    url = str(tmp_path / "run")
    written = write_steps(url, [0, 1])
    build_run(url, tmp_path, [0.9, 0.5, 0.3, 0.2])
    remove_manifest(url, "ckpt-000001")  # an interrupted save of ours: still called so

    code, out, _ = cli(capsys, "list", url, "--deep")
    assert row(out, "ckpt-000001")[-1] == "partial" and row(out, "1")[-1] == "adoptable", out
    assert "ckpt-000001: partial: no manifest" in out
    assert "4 checkpoints (3 ok, 1 partial) and 2 Keras OrbaxCheckpoint steps" in out
    assert "latest good: ckpt-000004" in out

    code, out, _ = cli(capsys, "verify", url)
    assert code == 0 and "verified 3 checkpoints" in out, out
    assert "not verified: a Keras OrbaxCheckpoint step" in out

    code, out, _ = cli(capsys, "verify", url, "--latest")
    assert code == 0 and "note: 1 partial folder (ckpt-000001)" in out, out  # the steps are no leftovers

    code, out, _ = cli(capsys, "prune", url, "--keep-last", "1", "--yes", "--json")
    plan = json.loads(out)
    assert sorted(plan["deleted"]) == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    assert [s["name"] for s in plan["adoptable"]] == ["0", "1"]
    assert still_there(url, written)
    assert sorted(p.name for p in Path(url).iterdir() if p.is_dir()) == ["0", "1", "ckpt-000004"]


def test_keras_model_files_and_a_backup_are_named_with_their_epoch(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    files = tmp_path / "keras"
    files.mkdir()
    for epoch, loss in ((1, 0.412), (2, 0.388), (3, 0.371)):
        (files / f"w-{epoch:02d}-{loss:.3f}.keras").write_bytes(b"PK" + bytes([epoch]) * 100)

    code, out, _ = cli(capsys, "list", str(files))
    assert code == 0 and row(out, "w-03-0.371.keras")[1] == "3" and row(out, "w-01-0.412.keras")[1] == "1"
    assert ("w-03-0.371.keras: unrecorded: a Keras ModelCheckpoint file (epoch 3, from its name), "
            "adopted by resume()") in out
    assert "resume() on this folder adopts the newest that loads of the files Keras wrote: " \
        "w-03-0.371.keras (a Keras ModelCheckpoint file, epoch 3)" in out
    code, out, _ = cli(capsys, "list", str(files), "--json")
    newest = json.loads(out)["files"][-1]
    assert (newest["kind"], newest["epoch"]) == ("Keras ModelCheckpoint file", 3)
    code, out, _ = cli(capsys, "verify", str(files))
    assert code == 0 and "nothing to verify" in out and "CORRUPT" not in out, out

    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "latest.weights.h5").write_bytes(b"\x89HDF" * 50)
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 4, "batch": -1}))
    code, out, _ = cli(capsys, "list", str(backup))
    assert row(out, "latest.weights.h5")[1] == "4", out
    assert "a Keras BackupAndRestore backup (epoch 4, from its training_metadata.json), adopted by " \
        "resume(build_model=...)" in out
    code, out, _ = cli(capsys, "inspect", str(backup), "--name", "latest.weights.h5", "--json")
    assert json.loads(out)["kind"] == "Keras BackupAndRestore backup" and json.loads(out)["epoch"] == 4
    assert sorted(p.name for p in backup.iterdir()) == ["latest.weights.h5", "training_metadata.json"]
