"""The `resumable` command, called as `main([...])` and as a subprocess, locally and on fake-gcs-server.

Runs are built with RunStorage.commit from tiny files: no Keras needed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fsspec
import pytest
from paths import ROOT

from resumable.cli.app import build_parser, main
from resumable.core.display import format_table, human_size, utc_time, utc_times
from resumable.core.manifest import MANIFEST_NAME, Manifest
from resumable.storage import RunStorage
from resumable.storage.lease import LeaseInfo

VAL_LOSSES = [0.9, 0.5, 0.1, 0.2, 0.95, 0.4]  # epochs 1..6; the best is epoch 3
ALL = [f"ckpt-{epoch:06d}" for epoch in range(1, 7)]


def build_run(url: str, tmp_path: Path, val_losses: list[float] = VAL_LOSSES) -> list[str]:
    """Commit one tiny checkpoint per epoch; return their names, oldest first."""
    storage = RunStorage(url)
    names = []
    for epoch, val_loss in enumerate(val_losses, start=1):
        stage = tmp_path / f"stage-{epoch}"
        stage.mkdir()
        (stage / "model.keras").write_bytes(bytes(range(256)) * epoch)
        (stage / "state.json").write_bytes(b'{"rng": 42}')
        manifest = Manifest(
            epoch=epoch, step=epoch * 10, metrics={"loss": val_loss + 0.05, "val_loss": val_loss},
            versions={"keras": "3.15.1", "tensorflow": "2.21.0"},
            state={"monitor": "val_loss", "callbacks": {"EarlyStopping": {"wait": 1}}},
        )
        names.append(storage.commit(stage, f"ckpt-{epoch:06d}", manifest).name)
    return names


def remove_manifest(url: str, name: str) -> None:
    fs, root = fsspec.core.url_to_fs(url)
    fs.rm_file(f"{root}/{name}/{MANIFEST_NAME}")


def flip_byte(url: str, name: str, rel: str = "model.keras", at: int = 10) -> None:
    fs, root = fsspec.core.url_to_fs(url)
    path = f"{root}/{name}/{rel}"
    data = bytearray(fs.cat_file(path))
    data[at] ^= 0xFF
    fs.pipe_file(path, bytes(data))


def truncate(url: str, name: str, rel: str = "model.keras", size: int = 10) -> None:
    fs, root = fsspec.core.url_to_fs(url)
    path = f"{root}/{name}/{rel}"
    fs.pipe_file(path, fs.cat_file(path)[:size])


def remaining(url: str) -> list[str]:
    return [info.name for info in RunStorage(url).list()]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def row(out: str, name: str) -> list[str]:
    """The table row of checkpoint ``name``, split on runs of spaces."""
    found = [line.split() for line in out.splitlines() if name in line.split()[:2]]
    assert len(found) == 1, out
    return found[0]


@pytest.fixture(params=["local", "gcs"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    return f"{request.getfixturevalue('gcs_bucket')}/runs/exp1"


@pytest.fixture
def damaged_run(url: str, tmp_path: Path) -> str:
    """Epochs 1..6; epoch 2 partial (no manifest), epoch 5 truncated (corrupt in any listing)."""
    build_run(url, tmp_path)
    remove_manifest(url, "ckpt-000002")
    truncate(url, "ckpt-000005")
    return url


# ------------------------------------------------------------------ list


def test_list_shows_status_latest_and_best(capsys: pytest.CaptureFixture[str], damaged_run: str) -> None:
    code, out, err = cli(capsys, "list", damaged_run, "--deep")
    assert code == 0, err
    lines = out.splitlines()
    headers = ["NAME", "EPOCH", "STEP", "loss", "val_loss", "SIZE", "CREATED", "STATUS", "NOTE"]
    assert lines[0].split() == headers
    assert [line.split()[0] for line in lines[1:7]] == ALL  # newest last
    assert row(out, "ckpt-000001")[1:5] == ["1", "10", "0.95", "0.9"]
    assert row(out, "ckpt-000002")[-1] == "partial"
    assert row(out, "ckpt-000002")[1:5] == ["-", "-", "-", "-"]  # no manifest: no epoch, step or metrics
    assert row(out, "ckpt-000003")[-2:] == ["ok", "best"]
    assert row(out, "ckpt-000005")[-1] == "corrupt"
    assert row(out, "ckpt-000006")[-2:] == ["ok", "latest"]
    assert "6 checkpoints (4 ok, 1 partial, 1 corrupt)" in out
    assert "latest good: ckpt-000006 (epoch 6, step 60)" in lines
    assert any(line.startswith("best val_loss: ckpt-000003 (epoch 3, val_loss=0.1;") for line in lines)
    assert "ckpt-000005: corrupt: model.keras has 10 bytes, manifest says 1280" in lines
    assert not any("statuses from the run index" in line for line in lines)


def test_list_reads_the_index_and_still_sees_interrupted_commits(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """Without --deep: folder names plus the run index; unindexed folders are checked one by one."""
    build_run(url, tmp_path, VAL_LOSSES[:3])
    fs, root = fsspec.core.url_to_fs(url, auto_mkdir=True) if "://" not in url else fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/ckpt-000004/model.keras", b"half a model")  # a commit killed mid-upload
    fs.pipe_file(f"{root}/ckpt-000005/model.keras", b"model")  # killed while writing its manifest
    fs.pipe_file(f"{root}/ckpt-000005/{MANIFEST_NAME}", b'{"format": "resumable.chec')
    truncate(url, "ckpt-000002")  # damage after the commit: only --deep or verify can see it
    code, out, err = cli(capsys, "list", url)
    assert code == 0, err
    assert [row(out, name)[-1] for name in ("ckpt-000004", "ckpt-000005")] == ["partial", "corrupt"]
    assert row(out, "ckpt-000002")[-1] == "ok"
    assert row(out, "ckpt-000003")[-3:] == ["ok", "latest,", "best"]
    assert "statuses from the run index; --deep checks every file's size" in out
    code, out, _ = cli(capsys, "list", url, "--deep")
    assert row(out, "ckpt-000002")[-1] == "corrupt"
    data = json.loads(cli(capsys, "list", url, "--json")[1])
    checked = {c["name"]: (c["status"], c["files_checked"]) for c in data["checkpoints"]}
    assert checked == {
        "ckpt-000001": ("ok", False), "ckpt-000002": ("ok", False),
        "ckpt-000003": ("ok", True),  # the one called the latest good: checked from its own files
        "ckpt-000004": ("partial", True), "ckpt-000005": ("corrupt", True),
    }


def test_list_json_for_scripts(capsys: pytest.CaptureFixture[str], damaged_run: str) -> None:
    code, out, _ = cli(capsys, "ls", damaged_run, "--json", "--deep")
    assert code == 0
    data = json.loads(out)
    statuses = {c["name"]: c["status"] for c in data["checkpoints"]}
    assert statuses == dict(zip(ALL, ["ok", "partial", "ok", "ok", "corrupt", "ok"], strict=True))
    assert data["latest"] == "ckpt-000006"
    assert data["best"] == {"name": "ckpt-000003", "monitor": "val_loss", "mode": "min", "value": 0.1}
    first = data["checkpoints"][0]
    assert (first["epoch"], first["step"], first["metrics"]["val_loss"]) == (1, 10, 0.9)
    assert first["size"] > 256 and first["created"]


def test_list_monitor_chooses_the_column_and_the_best(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = str(tmp_path / "run")
    build_run(url, tmp_path)
    code, out, _ = cli(capsys, "list", url, "--monitor", "val_loss", "--mode", "max")
    assert code == 0
    assert out.splitlines()[0].split()[3:5] == ["val_loss", "SIZE"]
    assert row(out, "ckpt-000005")[-2:] == ["ok", "best"]


def test_list_of_an_empty_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = cli(capsys, "list", str(tmp_path))
    assert (code, out) == (0, f"no checkpoints in {tmp_path}\n")


# ------------------------------------------------------------------ inspect


def test_inspect_shows_the_latest_good_manifest(capsys: pytest.CaptureFixture[str], damaged_run: str) -> None:
    code, out, _ = cli(capsys, "inspect", damaged_run)
    assert code == 0
    lines = [line.split() for line in out.splitlines()]
    assert ["checkpoint", "ckpt-000006"] in lines
    assert ["epoch", "6"] in lines and ["step", "60"] in lines
    assert ["versions", "keras", "3.15.1,", "tensorflow", "2.21.0"] in lines
    assert ["val_loss", "0.4"] in lines
    assert lines[[w[:1] for w in lines].index(["model.keras"])][:3] == ["model.keras", "1.5", "KB"]
    assert ["monitor", '"val_loss"'] in lines
    assert ["EarlyStopping", '{"wait":', "1}"] in lines


def test_inspect_epoch_and_name_json(capsys: pytest.CaptureFixture[str], damaged_run: str) -> None:
    code, out, _ = cli(capsys, "inspect", damaged_run, "--epoch", "3", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["name"] == "ckpt-000003"
    assert data["manifest"]["files"]["model.keras"]["size"] == 768
    assert data["manifest"]["state"]["callbacks"] == {"EarlyStopping": {"wait": 1}}
    code, out, _ = cli(capsys, "inspect", damaged_run, "--name", "ckpt-000002", "--json")
    assert code == 0
    assert (json.loads(out)["status"], json.loads(out)["manifest"]) == ("partial", None)


# ------------------------------------------------------------------ verify


def test_verify_catches_a_flipped_byte(capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path) -> None:
    build_run(url, tmp_path)
    flip_byte(url, "ckpt-000004")
    code, out, _ = cli(capsys, "verify", url, "--latest")  # the latest good one is intact
    assert code == 0
    assert out.splitlines()[-1] == "verified 1 checkpoint: all files match their manifests"
    code, out, _ = cli(capsys, "verify", url)  # every checkpoint, as the README says
    assert code == 1
    assert f"  {url}/ckpt-000004/model.keras: crc32c" in out
    assert out.splitlines()[-1] == "verification failed: 1 of 6 checkpoints corrupt"
    code, out, _ = cli(capsys, "verify", url, "--epoch", "4")
    assert code == 1
    assert f"  {url}/ckpt-000004/model.keras: crc32c" in out
    code, out, _ = cli(capsys, "verify", url, "--all", "--json")
    assert code == 1
    results = {c["name"]: c for c in json.loads(out)["checkpoints"]}
    assert [n for n, c in results.items() if c["status"] != "ok"] == ["ckpt-000004"]
    assert len(results["ckpt-000004"]["problems"]) == 1


def test_verify_all_names_every_bad_file(capsys: pytest.CaptureFixture[str], damaged_run: str) -> None:
    flip_byte(damaged_run, "ckpt-000003", rel="state.json", at=0)
    code, out, _ = cli(capsys, "verify", damaged_run, "--all")
    assert code == 1
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines if not line.startswith(" ")][:6] == [
        ["ok", "ckpt-000001"], ["partial", "ckpt-000002"], ["CORRUPT", "ckpt-000003"],
        ["ok", "ckpt-000004"], ["CORRUPT", "ckpt-000005"], ["ok", "ckpt-000006"],
    ]
    assert f"  {damaged_run}/ckpt-000003/state.json: crc32c" in out
    assert f"  {damaged_run}/ckpt-000005/model.keras: size 10 bytes, manifest says 1280" in lines
    assert lines[-1] == "verification failed: 2 of 5 checkpoints corrupt"


def test_verify_latest_mentions_partial_folders_it_left_out(capsys: pytest.CaptureFixture[str],
                                                           damaged_run: str) -> None:
    code, out, _ = cli(capsys, "verify", damaged_run, "--latest")
    assert code == 0
    assert [line.split()[:2] for line in out.splitlines()][0] == ["ok", "ckpt-000006"]
    note = next(line for line in out.splitlines() if line.startswith("note: "))
    assert "1 partial folder (ckpt-000002)" in note and f"resumable prune {damaged_run}" in note


def test_list_inspect_and_verify_agree_on_a_checkpoints_size(capsys: pytest.CaptureFixture[str],
                                                            url: str, tmp_path: Path) -> None:
    build_run(url, tmp_path)
    stored = sum(f["size"] for f in RunStorage(url).fs.ls(f"{RunStorage(url).root}/ckpt-000003", detail=True))
    shown = human_size(stored)  # every file stored, the manifest included
    sizes = set()
    for deep in ([], ["--deep"]):
        _, out, _ = cli(capsys, "list", url, *deep)
        sizes.add(" ".join(row(out, "ckpt-000003")[5:7]))
    _, out, _ = cli(capsys, "inspect", url, "--name", "ckpt-000003")
    size_line = next(line for line in out.splitlines() if line.startswith("size"))
    sizes.add(" ".join(size_line.split()[1:3]).rstrip(":"))
    _, out, _ = cli(capsys, "verify", url, "--name", "ckpt-000003")
    sizes.add(" ".join(out.splitlines()[0].split()[-2:]))
    assert sizes == {shown}, sizes
    for command in (["list", url, "--json"], ["list", url, "--deep", "--json"],
                    ["inspect", url, "--epoch", "3", "--json"]):
        _, out, _ = cli(capsys, *command)
        data = json.loads(out)
        listed = data.get("checkpoints", [data])
        found = next(c for c in listed if c["name"] == "ckpt-000003")["size"]
        assert found == stored, command


def test_verify_without_any_good_checkpoint_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    build_run(url, tmp_path, [0.5])
    remove_manifest(url, "ckpt-000001")
    code, out, _ = cli(capsys, "verify", url)
    assert code == 1
    assert out.splitlines()[-1].startswith("verification failed: no good checkpoint")


# ------------------------------------------------------------------ prune


def test_prune_dry_run_deletes_nothing(capsys: pytest.CaptureFixture[str], damaged_run: str) -> None:
    code, out, _ = cli(capsys, "prune", damaged_run, "--keep-last", "1", "--dry-run")
    assert code == 0
    assert remaining(damaged_run) == ALL
    assert row(out, "ckpt-000001")[0] == "DELETE"
    assert row(out, "ckpt-000003")[0] == "keep"
    assert out.splitlines()[-1].startswith("dry run: would delete 4 checkpoints")


@pytest.mark.parametrize(
    ("options", "kept"),
    [
        # the best by the recorded monitor (epoch 3) survives; the leftovers 2 and 5 go
        (["--keep-last", "2"], ["ckpt-000003", "ckpt-000004", "ckpt-000006"]),
        (["--keep-last", "1", "--keep-best", "2", "--monitor", "val_loss"],
         ["ckpt-000003", "ckpt-000004", "ckpt-000006"]),
        # corrupt epoch 5 has the highest loss, but only good checkpoints can be best
        (["--keep-last", "1", "--monitor", "loss", "--mode", "max"], ["ckpt-000001", "ckpt-000006"]),
        (["--keep-every", "2"], ["ckpt-000003", "ckpt-000004", "ckpt-000006"]),
        (["--keep-last", "1", "--monitor", "val_loss", "--mode", "max", "--keep-every", "3"],
         ["ckpt-000001", "ckpt-000003", "ckpt-000006"]),
        ([], ["ckpt-000001", "ckpt-000003", "ckpt-000004", "ckpt-000006"]),  # only leftovers
    ],
)
def test_prune_keeps_exactly_the_expected_set(
    capsys: pytest.CaptureFixture[str], damaged_run: str, options: list[str], kept: list[str]
) -> None:
    code, out, err = cli(capsys, "prune", damaged_run, *options, "--yes")
    assert code == 0, err
    assert remaining(damaged_run) == kept
    assert out.splitlines()[-1].startswith(f"deleted {6 - len(kept)} checkpoints, freed ")


def test_prune_json_reports_the_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    build_run(url, tmp_path)
    code, out, _ = cli(capsys, "prune", url, "--keep-last", "1", "--json", "--yes")
    assert code == 0
    data = json.loads(out)
    assert (data["deleted"], data["kept"]) == (["ckpt-000001", "ckpt-000002", "ckpt-000004", "ckpt-000005"],
                                               ["ckpt-000003", "ckpt-000006"])
    reasons = {d["name"]: d["reasons"] for d in data["decisions"]}
    assert reasons["ckpt-000003"] == ["best val_loss=0.1"]
    assert remaining(url) == data["kept"]


def test_prune_refuses_while_a_writer_holds_the_lease(capsys: pytest.CaptureFixture[str], url: str,
                                                     tmp_path: Path) -> None:
    build_run(url, tmp_path)
    now = datetime.now(timezone.utc)
    holder = LeaseInfo(token="t", host="colab-vm-2", pid=4242, started=now, renewed=now, timeout=600)
    storage = RunStorage(url)
    assert storage.run_files.create_run_file("lease.json", holder.to_json()) is not None
    code, out, err = cli(capsys, "prune", url, "--keep-last", "1", "--yes")
    assert code == 2
    assert err.startswith(f"error: {url} is being written by host 'colab-vm-2', process 4242, since ")
    assert "pass --force" in err and err.count("\n") == 1
    assert out == ""  # refused before showing a plan it would not carry out
    assert remaining(url) == ALL
    code, out, err = cli(capsys, "prune", url, "--keep-last", "1", "--yes", "--force")
    assert code == 0, err
    assert "warning: deleting while host 'colab-vm-2'" in err
    assert remaining(url) == ["ckpt-000003", "ckpt-000006"]
    found = storage.run_files.read_run_file("lease.json")
    assert found is not None and found[0] == holder.to_json()  # the writer's lease is left alone


def test_prune_holds_the_lease_while_deleting_and_gives_it_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "run")
    build_run(url, tmp_path)
    seen: list[bool] = []
    original = RunStorage.delete_many

    def watched(self: RunStorage, infos: Any) -> Iterator[str]:
        for name in original(self, infos):  # each one just deleted
            seen.append(self.run_files.read_run_file("lease.json") is not None)
            yield name

    monkeypatch.setattr(RunStorage, "delete_many", watched)
    code, _, err = cli(capsys, "prune", url, "--keep-last", "1", "--yes")
    assert code == 0, err
    assert seen == [True] * 4
    assert RunStorage(url).run_files.read_run_file("lease.json") is None


def test_prune_refuses_without_a_terminal_or_yes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    build_run(url, tmp_path)
    code, out, err = cli(capsys, "prune", url, "--keep-last", "1")
    assert code == 2
    assert err.startswith("error: refusing to delete without confirmation")
    assert out == ""  # no plan printed for a deletion that will not happen
    assert remaining(url) == ALL


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prune", "{url}", "--keep-last", "-1"], "error: --keep-last must be >= 1, got -1"),
        (["prune", "{url}", "--keep-last", "0", "--yes"], "error: --keep-last must be >= 1, got 0"),
        (["prune", "{url}", "--keep-every", "0", "--yes"], "error: --keep-every must be >= 1, got 0"),
        (["prune", "{url}", "--keep-last", "x"], "error: argument --keep-last: invalid int value: 'x'"),
        (["prune", "{url}", "--keep-last", "1", "--monitor", "val_acc", "--yes"],
         "error: --monitor val_acc: no checkpoint recorded this metric; recorded: loss, val_loss"),
        (["prune", "{url}", "--mode", "lowest"], "error: argument --mode: invalid choice: 'lowest'"),
        (["inspect", "{url}", "--epoch", "-2"], "error: --epoch must be >= 0, got -2"),
        (["inspect", "{url}", "--epoch", "9"], "error: {url}: no checkpoint of epoch 9;"),
        (["verify", "{url}", "--name", "ckpt-9"], "error: {url}: no checkpoint named 'ckpt-9';"),
        (["verify", "{url}", "--epoch", "1", "--name", "x"],
         "error: argument --name: not allowed with argument --epoch"),
        (["list", "{url}/missing"], "error: {url}/missing: not found;"),
        (["list", "{url}/ckpt-000001"], "error: {url}/ckpt-000001 is one checkpoint, not a run folder;"),
        (["list"], "error: the following arguments are required: URL; see `resumable list --help`"),
        (["remove", "{url}"], "error: argument COMMAND: invalid choice: 'remove'"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_deletes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    url = str(tmp_path / "run")
    build_run(url, tmp_path)
    code, out, err = cli(capsys, *(a.format(url=url) for a in args))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(message.format(url=url)), err
    assert remaining(url) == ALL


def test_an_unknown_bucket_exits_2(capsys: pytest.CaptureFixture[str], gcs_server: str) -> None:
    code, _, err = cli(capsys, "prune", "gs://no-such-bucket-4e1f/run", "--keep-last", "1", "--yes")
    assert code == 2
    assert err.startswith("error: gs://no-such-bucket-4e1f/run: not found") and err.count("\n") == 1, err


def test_a_missing_gcs_folder_exits_2(capsys: pytest.CaptureFixture[str], gcs_bucket: str) -> None:
    code, _, err = cli(capsys, "list", f"{gcs_bucket}/nothing/here")
    assert code == 2
    assert err == f"error: {gcs_bucket}/nothing/here: not found; check the path and that the folder exists\n"


# ------------------------------------------------------------------ as a program


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resumable", *args], capture_output=True, text=True,
                          timeout=120, env=os.environ.copy())


def test_subprocess_on_gcs_lists_json_and_prunes(gcs_bucket: str, tmp_path: Path) -> None:
    url = f"{gcs_bucket}/runs/exp1"
    build_run(url, tmp_path)
    remove_manifest(url, "ckpt-000002")
    listed = run_module("list", url, "--json", "--deep")
    assert listed.returncode == 0, listed.stderr
    assert [c["status"] for c in json.loads(listed.stdout)["checkpoints"]][:2] == ["ok", "partial"]
    pruned = run_module("prune", url, "--keep-last", "-1")
    assert pruned.returncode == 2
    assert pruned.stderr == "error: --keep-last must be >= 1, got -1\n"
    pruned = run_module("prune", url, "--keep-last", "1", "--yes")
    assert pruned.returncode == 0, pruned.stderr
    assert remaining(url) == ["ckpt-000003", "ckpt-000006"]


def test_subprocess_error_has_no_traceback(tmp_path: Path) -> None:
    result = run_module("verify", str(tmp_path / "absent"))
    assert result.returncode == 2
    absent = tmp_path / "absent"
    assert result.stderr == f"error: {absent}: not found; check the path and that the folder exists\n"


def test_the_cli_imports_neither_tensorflow_nor_keras() -> None:
    code = "import resumable.cli.app, sys; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["False", "False"], result.stderr


# ------------------------------------------------------------------ help, demo, formatting


@pytest.mark.parametrize("args", [["--help"], ["prune", "--help"], ["verify", "--help"]])
def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, out, _ = cli(capsys, *args)
    assert code == 0
    assert "exit codes:\n  0  success\n  1  verification failed" in out


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_main_builds_only_the_subcommand_it_runs_and_its_help_is_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """argparse spends about half a millisecond per subcommand: `list` builds only its own."""
    full = subcommands(build_parser())
    assert sorted(full) == ["demo", "inspect", "list", "ls", "prune", "verify"]
    for command, parser in full.items():
        only = subcommands(build_parser(command))
        assert set(only) == ({"list", "ls"} if command in ("list", "ls") else {command})
        assert only[command].format_help() == parser.format_help()
    assert subcommands(build_parser("lst")).keys() == full.keys()  # unknown: all, for the error's choices
    code, out, _ = cli(capsys, "--help")
    assert code == 0 and all(command in out for command in full)


def test_demo_calls_resumable_demo_main_with_the_folder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str | None] = []
    fake = types.ModuleType("resumable.cli.demo")
    fake.main = lambda folder: calls.append(folder) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "resumable.cli.demo", fake)
    assert main(["demo", "/tmp/here"]) == 7
    assert main(["demo"]) == 7
    assert calls == ["/tmp/here", None]


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KB"), (1536, "1.5 KB"), (5 * 1024**2, "5.0 MB"),
     (3 * 1024**3, "3.0 GB"), (2 * 1024**5, "2048.0 TB")],
)
def test_human_size(size: int, text: str) -> None:
    assert human_size(size) == text


@pytest.mark.parametrize(("text", "shown"), [
    ("2026-11-22T06:10:03+00:00", "2026-11-22T06:10:03Z"),  # as manifests record it: sliced
    ("2026-11-22T07:10:03+01:00", "2026-11-22T06:10:03Z"),
    ("2026-11-22T06:10:03.999+00:00", "2026-11-22T06:10:03Z"),
    ("2026-11-22T06:10:03Z", "2026-11-22T06:10:03Z"),
    ("2026-11-22T06:10:03", "2026-11-22T06:10:03Z"),  # no offset: UTC, as manifests mean it
    ("2026-11-21T23:30:00-08:00", "2026-11-22T07:30:00Z"),  # across midnight
    ("yesterday at 6", "-"), ("abcdefghijklmnopqrs+00:00", "-"), ("", "-"), (None, "-"),
])
def test_utc_time(text: str | None, shown: str) -> None:
    assert utc_time(text) == shown
    assert utc_times([text, text]) == [shown, shown]


def test_list_shows_times_in_utc_whatever_the_local_zone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "run")
    build_run(url, tmp_path, [0.5])
    (info,) = RunStorage(url).list()
    assert info.manifest is not None
    created = datetime.fromisoformat(info.manifest.created).strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30, were the table in local time
    time.tzset()
    try:
        for deep in ([], ["--deep"]):  # from the index, then from the manifest
            code, out, err = cli(capsys, "list", url, *deep)
            assert code == 0, err
            assert created in out.splitlines()[1].split(), out
        code, out, err = cli(capsys, "inspect", url)
        assert code == 0, err
        assert re.search(rf"^created +{created}$", out, re.M), out
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_format_table_aligns_columns() -> None:
    assert format_table(["NAME", "SIZE", "X"], [["a", "1 KB", ""], ["bcd", "12.5 MB", "y"]], right={1}) == [
        "NAME     SIZE  X",
        "a        1 KB",
        "bcd   12.5 MB  y",
    ]


def test_the_list_benchmark_runs_small(gcs_server: str) -> None:
    script = ROOT / "benchmarks" / "bench_list.py"
    result = subprocess.run([sys.executable, str(script), "--checkpoints", "20", "--repeat", "1"],
                            capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "built gs://" in lines[0] and "with 20 checkpoints (41 objects)" in lines[0]
    assert lines[2].split() == ["MEASURE", "BEST", "OF", "1", "VS", "LS"]
    measures = [re.split(r"\s{2,}", line)[0] for line in lines[3:10]]
    assert measures == ["gcsfs.ls", "gcsfs.find", "find + cat", "RunStorage.list deep", "RunStorage.list",
                        "resumable list", "resumable list --deep"]
    assert lines[-1].startswith("resumable list / gcsfs.ls = ")


def test_the_list_benchmark_calls_one_measure_for_perf_stat(gcs_server: str) -> None:
    """--only calls one measure on a run it keeps on the emulator (see docs/benchmarks.md)."""
    script = ROOT / "benchmarks" / "bench_list.py"
    args = [sys.executable, str(script), "--checkpoints", "5", "--only", "resumable list", "--calls", "2"]
    outputs = []
    for _ in range(2):
        result = subprocess.run(args, capture_output=True, text=True, timeout=120, env=os.environ.copy())
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.splitlines())
    assert [lines[-1] for lines in outputs] == ["called resumable list 2 times"] * 2
    assert "built gs://bench-list-5/runs/bench" in outputs[0][0]
    assert "reused gs://bench-list-5/runs/bench" in outputs[1][0]  # its index rewritten, nothing else
