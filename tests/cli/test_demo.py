"""The README's first command: `resumable demo` trains, is killed, resumes and lists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

from resumable.cli.demo import EPOCHS, KILL_AFTER_EPOCH


@pytest.mark.slow
def test_demo_is_killed_resumes_and_finishes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "resumable", "demo", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "killed the training process" in out.stdout
    # TensorFlow's banner (twice per process in TF 2.21, three processes) shows once, if at all.
    for banner in ("absl::InitializeLog()", "oneDNN custom operations", "cpu_feature_guard"):
        assert out.stderr.count(banner) <= 1, (banner, out.stderr[-3000:])
    assert " ignoring " not in out.stderr, out.stderr[-3000:]  # the demo's own watching says nothing
    (run,) = tmp_path.glob("run-*")

    listing = subprocess.run(
        [sys.executable, "-m", "resumable", "list", str(run), "--json"],
        capture_output=True, text=True, check=True,
    )
    assert not re.search("InitializeLog|oneDNN|cpu_feature_guard", listing.stderr), listing.stderr  # no TF
    checkpoints = json.loads(listing.stdout)["checkpoints"]
    epochs = [c["epoch"] for c in checkpoints if c["status"] == "ok"]
    assert max(epochs) == EPOCHS
    # The first session started afresh; the second resumed where the kill left it, not at epoch 1.
    assert f"new run: starting at epoch 1 of {EPOCHS}" in out.stdout
    resumed = re.search(r"resumed from ckpt-(\d+): (\d+) epochs done", out.stdout)
    assert resumed, out.stdout[-3000:]
    assert int(resumed.group(1)) == int(resumed.group(2))
    assert KILL_AFTER_EPOCH <= int(resumed.group(2)) < EPOCHS
    # The final listing still shows the checkpoint the second session resumed from, and says so.
    table = out.stdout.split("== The checkpoints")[1]
    row = rf"^ckpt-{resumed.group(1)}\s+{int(resumed.group(2))}\s"
    assert re.search(row, table, flags=re.MULTILINE), table
    assert f"session 2 resumed from ckpt-{resumed.group(1)}, the last checkpoint session 1 committed" in table
    assert epochs == list(range(1, EPOCHS + 1))
    # And it ends saying that the resumed run matches one never killed.
    assert out.stdout.rstrip().splitlines()[-1].startswith(
        "resumed vs never killed: the final weights are bitwise equal"), out.stdout[-2000:]


def test_the_demo_folder_is_ignored_by_git() -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "resumable-demo/run-20260101-000000/x"], cwd=ROOT)
    assert ignored.returncode == 0, "resumable demo's default folder would show up as untracked"
