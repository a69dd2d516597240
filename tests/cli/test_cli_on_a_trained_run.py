"""The installed `resumable` command on a run this Keras trained: list, inspect, verify and prune.

tests/cli/test_cli.py builds its runs from tiny files; here the checkpoints are what
resumable.resume and run.fit wrote with the Keras and backend of this environment (each lane's),
read back by the console script pip installed, in a process that imports no Keras.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.lanes]

keras = pytest.importorskip("keras")

import resumable  # noqa: E402

X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = X[:, :1] * 3


def build() -> keras.Model:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def command(*args: str) -> subprocess.CompletedProcess[str]:
    """`resumable ARGS` as a user types it: the console script beside this Python, else -m."""
    script = Path(sys.executable).with_name("resumable")
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "resumable"]
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # the CLI needs no backend
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, env=env)


def test_list_inspect_verify_and_prune_a_run_trained_here(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    # every epoch committed (in the background, a newer checkpoint may replace one still waiting)
    run = resumable.resume(url, build_model=build, monitor="loss", keep_last=None, async_upload=False)
    run.fit(X, Y, epochs=4, batch_size=16, verbose=0)

    listed = command("list", url, "--json")
    assert listed.returncode == 0, listed.stderr
    checkpoints = json.loads(listed.stdout)["checkpoints"]
    assert [(c["epoch"], c["status"]) for c in checkpoints] == [(e, "ok") for e in (1, 2, 3, 4)]

    inspected = command("inspect", url, "--epoch", "4", "--json")
    assert inspected.returncode == 0, inspected.stderr
    manifest = json.loads(inspected.stdout)["manifest"]
    assert manifest["versions"]["keras"] == keras.__version__ and manifest["payload"] in manifest["files"]

    assert command("verify", url).returncode == 0
    pruned = command("prune", url, "--keep-last", "2", "--yes")
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(p.name for p in Path(url).glob("ckpt-*")) == ["ckpt-000003", "ckpt-000004"]

    payload = Path(url) / "ckpt-000004" / manifest["payload"]
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    damaged = command("verify", url)
    assert damaged.returncode == 1 and f"ckpt-000004/{manifest['payload']}" in damaged.stdout

    shutil.rmtree(Path(url) / "ckpt-000004")
    resumed = resumable.resume(url, build_model=build, monitor="loss")
    assert resumed.initial_epoch == 3
