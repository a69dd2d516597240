"""The newest checkpoint damaged after it was committed: `verify --latest` checks it and fails,
`list` never calls it the latest good (though the run index, written at commit, says "ok")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import build_run, cli, flip_byte, row, truncate

from resumable.storage import RunStorage


@pytest.fixture(params=["local", "gcs"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    return f"{request.getfixturevalue('gcs_bucket')}/runs/exp1"


def test_verify_latest_checks_the_newest_even_when_damaged(capsys: pytest.CaptureFixture[str], url: str,
                                                           tmp_path: Path) -> None:
    build_run(url, tmp_path)
    flip_byte(url, "ckpt-000006")  # same size: only reading it tells
    code, out, _ = cli(capsys, "verify", url, "--latest")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["CORRUPT", "ckpt-000006"]
    assert f"  {url}/ckpt-000006/model.keras: crc32c" in out
    assert "verification failed: 1 of 1 checkpoints corrupt" in lines
    assert lines[-1] == (f"resume() skips it and uses ckpt-000005 (epoch 5), the newest one listed good; "
                         f"`resumable verify {url}` checks all")
    code, out, _ = cli(capsys, "verify", url, "--latest", "--json")
    assert code == 1
    data = json.loads(out)
    assert not data["ok"] and [c["name"] for c in data["checkpoints"]] == ["ckpt-000006"]
    assert data["checkpoints"][0]["status"] == "corrupt"


def test_verify_latest_of_a_healthy_run_still_passes(capsys: pytest.CaptureFixture[str], url: str,
                                                     tmp_path: Path) -> None:
    build_run(url, tmp_path)
    code, out, _ = cli(capsys, "verify", url, "--latest")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["ok", "ckpt-000006"]


def test_list_never_calls_a_checkpoint_damaged_since_its_commit_the_latest_good(
        capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path) -> None:
    build_run(url, tmp_path)
    assert RunStorage(url).list(check_files=False)[-1].status.value == "ok"  # as the index says
    truncate(url, "ckpt-000006")
    code, out, _ = cli(capsys, "list", url)
    assert code == 0
    assert row(out, "ckpt-000006")[-1] == "corrupt"
    assert "latest good: ckpt-000005 (epoch 5, step 50)" in out.splitlines()
    code, out, _ = cli(capsys, "list", url, "--json")
    data = json.loads(out)
    assert data["latest"] == "ckpt-000005"
    assert {c["name"]: c["status"] for c in data["checkpoints"]}["ckpt-000006"] == "corrupt"


def test_list_on_gcs_sees_a_same_size_change_through_the_listing_s_crc32c(
        capsys: pytest.CaptureFixture[str], gcs_bucket: str, tmp_path: Path) -> None:
    url = f"{gcs_bucket}/runs/exp1"
    build_run(url, tmp_path)
    flip_byte(url, "ckpt-000006")
    code, out, _ = cli(capsys, "list", url)
    assert code == 0 and "latest good: ckpt-000005 (epoch 5, step 50)" in out.splitlines()


def test_list_walks_back_past_several_damaged_ones(capsys: pytest.CaptureFixture[str], url: str,
                                                   tmp_path: Path) -> None:
    build_run(url, tmp_path)
    for name in ("ckpt-000006", "ckpt-000005", "ckpt-000004"):
        truncate(url, name)
    code, out, _ = cli(capsys, "list", url)
    assert code == 0 and "latest good: ckpt-000003 (epoch 3, step 30)" in out.splitlines()
