"""`resumable list / inspect / verify` on a folder of resumable.ModelCheckpoint files, locally and on
fake-gcs-server. The files land through the real single-file writer (FileTarget.land): no Keras."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

from resumable.cli.app import main
from resumable.storage.single_file import FileTarget

# (name, epoch, batch, val_accuracy): the best val_accuracy is a mid-epoch save's, which is never "best"
FILES = [("w-01.hdf5", 1, None, 0.50), ("w-02-batch.hdf5", 2, 3, 0.99), ("w-02.hdf5", 2, None, 0.70),
         ("w-03.hdf5", 3, None, 0.60)]


def write_files(url: str, tmp_path: Path) -> None:
    for i, (name, epoch, batch, accuracy) in enumerate(FILES):
        local = tmp_path / f"stage-{name}"
        local.write_bytes(bytes([i]) * (1000 + i))
        details = {"epoch": epoch, "batch": batch, "step": epoch * 4 + (batch or 0),
                   "monitor": "val_accuracy", "mode": "max", "best": None,
                   "metrics": {"loss": 1 - accuracy, "val_accuracy": accuracy},
                   "weights_only": False, "keras": "3.15.1", "saved_at": f"2026-11-22T06:1{i}:00+00:00"}
        FileTarget(f"{url}/{name}").land(local, details)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_model_checkpoint_folder_is_listed_inspected_and_verified(
        where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: Any) -> None:
    url = str(tmp_path / "ckpt") if where == "local" else request.getfixturevalue("gcs_bucket") + "/ckpt"
    write_files(url, tmp_path)

    code, out, _ = run(capsys, "list", url)
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("w-")}
    assert list(rows) == ["w-01.hdf5", "w-02-batch.hdf5", "w-02.hdf5", "w-03.hdf5"]  # oldest first
    assert rows["w-02.hdf5"].split()[-1] == "best" and rows["w-03.hdf5"].split()[-1] == "latest"
    assert "4 model files (4 ok)" in out and "best val_accuracy: w-02.hdf5 (epoch 2" in out
    code, out, _ = run(capsys, "list", url, "--json")
    listed = json.loads(out)
    assert listed["kind"] == "model files" and listed["latest"] == "w-03.hdf5"
    assert listed["best"] == {"name": "w-02.hdf5", "monitor": "val_accuracy", "mode": "max", "value": 0.7}
    assert [f["status"] for f in listed["files"]] == ["ok"] * 4 and listed["files"][1]["batch"] == 3

    code, out, _ = run(capsys, "inspect", url, "--epoch", "2")
    assert code == 0 and "w-02.hdf5" in out and "val_accuracy  0.7" in out
    code, out, _ = run(capsys, "inspect", url, "--name", "w-01.hdf5", "--json")
    assert json.loads(out)["record"]["crc32c"] == json.loads(out)["crc32c"]
    assert run(capsys, "verify", url) [:2] == (0, run_verify_text())

    # damage: the same size with other bytes (seen by verify; on GCS by list too), a file without
    # a record, a record without its file, and what killed writers leave
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/w-02.hdf5", b"x" * 1002)
    fs.pipe_file(f"{root}/keras.keras", b"written by Keras")
    fs.rm_file(f"{root}/w-01.hdf5")
    fs.pipe_file(f"{root}/.w-03.hdf5.4242.partial", b"half")
    fs.pipe_file(f"{root}/.w-03.hdf5.resumable.json.4242.tmp", b"{")
    code, out, _ = run(capsys, "verify", url)
    assert code == 1
    assert "CORRUPT    w-01.hdf5" in out and "CORRUPT    w-02.hdf5" in out and "unrecorded keras.keras" in out
    assert "verification failed: 2 of 5 files corrupt" in out
    code, out, _ = run(capsys, "list", url)
    assert code == 0 and "w-01.hdf5: corrupt: missing" in out and ".tmp" in out and ".partial" in out
    assert "w-03.hdf5.4242" not in [line.split()[0] for line in out.splitlines() if line.strip()]
    code, out, _ = run(capsys, "verify", url, "--latest", "--json")
    assert code == 0 and json.loads(out)["files"] == [{"name": "w-03.hdf5", "status": "ok", "problems": []}]


def run_verify_text() -> str:
    return "\n".join([f"ok         {name}  {size}" for name, size in
                      (("w-01.hdf5", "1000 B"), ("w-02-batch.hdf5", "1001 B"), ("w-02.hdf5", "1002 B"),
                       ("w-03.hdf5", "1003 B"))] + ["verified 4 files: all match their checksum records", ""])


def test_bad_input_on_a_model_checkpoint_folder_exits_2_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "ckpt")
    write_files(url, tmp_path)
    for args, message in [
        (["inspect", url, "--name", "nope.h5"], f"error: {url}: no model file named 'nope.h5';"),
        (["inspect", url, "--epoch", "9"], f"error: {url}: no model file of epoch 9;"),
        (["list", url, "--monitor", "val_acc"],
         "error: --monitor val_acc: no model file recorded this metric;"),
        (["prune", url, "--keep-last", "1", "--yes"],
         f"error: {url} holds model files (resumable.ModelCheckpoint"),
    ]:
        code, out, err = run(capsys, *args)
        assert code == 2 and out == "" and err.startswith(message) and err.count("\n") == 1, (args, err)
    assert len(list(Path(url).iterdir())) == 2 * len(FILES)  # nothing deleted

    (Path(url) / "elsewhere.keras").symlink_to(tmp_path / "stage-w-01.hdf5")  # never read through
    code, out, _ = run(capsys, "verify", url)
    assert code == 1 and "CORRUPT    elsewhere.keras" in out and "symbolic link" in out

    only_keras = tmp_path / "keras-only"
    only_keras.mkdir()
    (only_keras / "model.keras").write_bytes(b"by Keras")
    code, out, _ = run(capsys, "verify", str(only_keras))
    assert code == 1 and "no file in" in out and "has a checksum record" in out
