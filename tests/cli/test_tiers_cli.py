"""`list`, `inspect` and `prune` of a run with a local tier (#55): each checkpoint's tier shown, the
local tier found from the run id (under --local-tier, or the default place), and prune never
touching the local tier nor the durable newest. Runs are built with RunStorage.commit from tiny
files, as a run with a local tier leaves them: no Keras needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resumable.cli.app import main
from resumable.core.manifest import Manifest
from resumable.manager import tiers
from resumable.storage import RunStorage


def commit(storage: RunStorage, tmp_path: Path, name: str, epoch: int, step: int, batch: int = 0) -> None:
    stage = tmp_path / "stage" / storage.url.replace("/", "_") / name
    stage.mkdir(parents=True)
    (stage / "model.keras").write_bytes(bytes(range(256)) * (step + 1))
    storage.commit(stage, name, Manifest(epoch=epoch, step=step, batch=batch, metrics={"loss": 1.0 / step},
                                         state={"monitor": "loss", "mode": "min"}, payload="model.keras"))


@pytest.fixture
def two_tiers(tmp_path: Path) -> tuple[str, Path, str]:
    """A durable run of 4 epochs (4 steps each), and its local tier holding epoch 5 batch 2."""
    url = str(tmp_path / "drive" / "run")
    durable = RunStorage(url)
    for epoch in range(1, 5):
        commit(durable, tmp_path, f"ckpt-{epoch:06d}", epoch, epoch * 4)
    run_id = tiers.record_run_id(durable)
    root = tmp_path / "local"
    local = RunStorage(str(root / run_id))
    tiers.record_run_id(local, run_id)
    commit(local, tmp_path, "ckpt-000004-step-000000018", 4, 18, batch=2)
    return url, root, "ckpt-000004-step-000000018"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    out, _ = capsys.readouterr()
    return code, out


def test_list_shows_each_checkpoints_tier_and_which_one_resume_takes(
        capsys: pytest.CaptureFixture[str], two_tiers: tuple[str, Path, str]) -> None:
    url, root, local_name = two_tiers
    code, out = run(capsys, "list", url, "--local-tier", str(root))
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("ckpt-")}
    assert rows["ckpt-000004"][1] == "durable" and rows[local_name][1] == "local"
    assert [rows[name][1] for name in rows] == ["durable"] * 4 + ["local"]
    assert f"newest {local_name} (epoch 5, batch 2), newer than the durable latest: resume() takes it" in out
    assert "latest good: ckpt-000004" in out  # the durable tier's latest, as before

    code, out = run(capsys, "list", url, "--local-tier", str(root), "--json")
    listed = json.loads(out)
    assert [(c["name"], c["tier"]) for c in listed["checkpoints"]][-2:] == [
        ("ckpt-000004", "durable"), (local_name, "local")]
    assert listed["local_tier"] == str(root / Path(listed["checkpoints"][-1]["url"]).parent.name)


def test_list_without_a_local_tier_shows_no_tier_column(capsys: pytest.CaptureFixture[str],
                                                         two_tiers: tuple[str, Path, str],
                                                         tmp_path: Path) -> None:
    url, _, _ = two_tiers
    code, out = run(capsys, "list", url, "--local-tier", str(tmp_path / "elsewhere"))
    assert code == 0 and "TIER" not in out and "local tier" not in out
    listed = json.loads(run(capsys, "list", url, "--local-tier", str(tmp_path / "elsewhere"), "--json")[1])
    assert {c["tier"] for c in listed["checkpoints"]} == {"durable"} and listed["local_tier"] is None


def test_the_default_local_tier_place_is_looked_in(capsys: pytest.CaptureFixture[str],
                                                   two_tiers: tuple[str, Path, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, root, local_name = two_tiers
    monkeypatch.setattr(tiers, "default_root", lambda: root)
    code, out = run(capsys, "list", url)
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("ckpt-")}
    assert code == 0 and rows[local_name] == "local"


def test_another_runs_local_folder_is_not_listed(capsys: pytest.CaptureFixture[str],
                                                 two_tiers: tuple[str, Path, str]) -> None:
    url, root, _ = two_tiers
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    (folder / "run.json").write_text(json.dumps({"format": "resumable.run", "run_id": "e" * 32}))
    code, out = run(capsys, "list", url, "--local-tier", str(root))
    assert code == 0 and "TIER" not in out


def test_inspect_finds_a_local_checkpoint_and_says_its_tier(capsys: pytest.CaptureFixture[str],
                                                            two_tiers: tuple[str, Path, str]) -> None:
    url, root, local_name = two_tiers
    code, out = run(capsys, "inspect", url, "--local-tier", str(root), "--name", local_name)
    assert code == 0
    assert ["tier", "local"] in [line.split() for line in out.splitlines()]
    shown = json.loads(run(capsys, "inspect", url, "--local-tier", str(root), "--name", local_name,
                           "--json")[1])
    assert shown["tier"] == "local" and shown["step"] == 18
    shown = json.loads(run(capsys, "inspect", url, "--local-tier", str(root), "--json")[1])
    assert shown["tier"] == "durable" and shown["name"] == "ckpt-000004"


def test_prune_never_deletes_the_newest_of_either_tier(capsys: pytest.CaptureFixture[str],
                                                       two_tiers: tuple[str, Path, str]) -> None:
    url, root, local_name = two_tiers
    code, _ = run(capsys, "prune", url, "--keep-last", "1", "--keep-best", "1", "--monitor", "loss",
                  "--yes")
    assert code == 0
    assert [c.name for c in RunStorage(url).list()] == ["ckpt-000004"]  # the durable newest
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    assert [c.name for c in RunStorage(str(folder)).list()] == [local_name]  # the local tier untouched
