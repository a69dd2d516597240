"""examples/colab_resume.ipynb in a real Jupyter kernel: killed mid-training, run again, run a third time.

What a Colab user does: run the notebook from the top, lose the runtime in the middle of
training (the kernel dies with SIGKILL, no chance to clean up), reconnect, run it from the top
again. The notebook must continue at the epoch of the newest committed checkpoint and finish;
a third run must find the run complete and train nothing.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from nbclient.exceptions import DeadKernelError  # noqa: E402
from paths import ROOT  # noqa: E402

from resumable.storage import RunStorage  # noqa: E402

NOTEBOOK = ROOT / "examples" / "colab_resume.ipynb"
EPOCHS = 6
KILL_AFTER_EPOCH = 2
PAUSE = "1.0"  # seconds per epoch (the notebook's RESUMABLE_EPOCH_PAUSE): time for the kill to land
CELL_TIMEOUT = 300


@pytest.fixture
def notebook_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kernel inherits this environment: a run folder under tmp_path, few epochs, no display."""
    run_dir = tmp_path / "runs" / "exp1"
    monkeypatch.setenv("RESUMABLE_RUN_DIR", str(run_dir))
    monkeypatch.setenv("RESUMABLE_EPOCHS", str(EPOCHS))
    monkeypatch.setenv("RESUMABLE_EPOCH_PAUSE", PAUSE)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    # "python3" must be this interpreter's ipykernel, not a user-wide kernel spec for another Python.
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return run_dir


def _client(workdir: Path) -> Any:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT, startup_timeout=120,
        resources={"metadata": {"path": str(workdir)}},
    )


def _stdout(client: Any) -> str:
    """Everything the notebook's cells printed, in order."""
    return "".join(
        out.get("text", "")
        for cell in client.nb.cells if cell.cell_type == "code"
        for out in cell.get("outputs", []) if out.get("output_type") == "stream"
    )


def _errors(client: Any) -> list[str]:
    return [
        f"{out.get('ename')}: {out.get('evalue')}"
        for cell in client.nb.cells if cell.cell_type == "code"
        for out in cell.get("outputs", []) if out.get("output_type") == "error"
    ]


def _initial_epoch(client: Any) -> int:
    found = re.findall(r"^initial_epoch=(\d+) ", _stdout(client), flags=re.MULTILINE)
    assert len(found) == 1, _stdout(client)[-3000:]
    return int(found[0])


def _trained(client: Any) -> int:
    found = re.findall(r"^trained this session: (\d+) epochs", _stdout(client), flags=re.MULTILINE)
    assert len(found) == 1, _stdout(client)[-3000:]
    return int(found[0])


def _committed(run_dir: Path) -> dict[str, tuple[Any, Any]]:
    """Every checkpoint with its epoch and commit time: what a run that trains nothing leaves alone."""
    return {c.name: (c.epoch, c.created) for c in RunStorage(str(run_dir)).list()}


async def _until_committed(client: Any, execution: asyncio.Future[Any], run_dir: Path, epoch: int) -> None:
    """Wait, while the notebook runs, until the run folder holds a good checkpoint of ``epoch`` or later."""
    storage = RunStorage(str(run_dir))
    deadline = time.monotonic() + 240
    while True:
        await asyncio.sleep(0.1)
        assert not execution.done(), f"the notebook ended first: {_stdout(client)[-3000:]}"
        assert time.monotonic() < deadline, f"no checkpoint of epoch {epoch}: {_stdout(client)[-3000:]}"
        latest = storage.latest() if run_dir.exists() else None
        if latest is not None and latest.epoch is not None and latest.epoch >= epoch:
            return


async def _run_and_kill(client: Any, run_dir: Path) -> int:
    """Execute the notebook; SIGKILL its kernel once epoch KILL_AFTER_EPOCH is committed.

    Returns the epoch of the newest good checkpoint once the kernel is dead: where a resume
    must continue.
    """
    storage = RunStorage(str(run_dir))
    execution = asyncio.ensure_future(client.async_execute())
    await _until_committed(client, execution, run_dir, KILL_AFTER_EPOCH)
    km = client.km
    # The kernel is the interpreter running the tests (ipykernel resolves "python" to it).
    assert km.format_kernel_cmd()[0] == sys.executable
    pid = km.provisioner.pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(DeadKernelError):
        await asyncio.wait_for(execution, timeout=120)
    at_kill = storage.latest()
    assert at_kill is not None and at_kill.epoch is not None
    return at_kill.epoch


@pytest.mark.slow
def test_notebook_survives_a_kernel_kill_and_resumes(notebook_env: Path, tmp_path: Path) -> None:
    run_dir = notebook_env

    # Session 1: a new run, killed with SIGKILL mid-training.
    first = _client(tmp_path)
    resume_at = asyncio.run(_run_and_kill(first, run_dir))
    assert _initial_epoch(first) == 0
    assert KILL_AFTER_EPOCH <= resume_at < EPOCHS, "the kill did not land mid-training"
    assert "trained this session" not in _stdout(first), "the fit cell finished before the kill"

    # Session 2: a new kernel runs the notebook from the top; it continues and finishes.
    second = _client(tmp_path)
    second.execute()
    assert not _errors(second)
    assert _initial_epoch(second) == resume_at
    assert f"resumed from ckpt-{resume_at:06d}" in _stdout(second)
    assert _trained(second) == EPOCHS - resume_at
    assert f"run: {EPOCHS} of {EPOCHS} epochs done" in _stdout(second)
    assert f"history: {EPOCHS} epochs; this session started after epoch {resume_at}" in _stdout(second)
    assert f"Epoch {resume_at + 1}/{EPOCHS}" in _stdout(second)
    assert f"Epoch {resume_at}/{EPOCHS}" not in _stdout(second)
    latest = RunStorage(str(run_dir)).latest()
    assert latest is not None and latest.epoch == EPOCHS
    assert f"latest good: ckpt-{EPOCHS:06d} (epoch {EPOCHS}," in _stdout(second)  # the list cell
    committed = _committed(run_dir)

    # Session 3: the run is complete; the whole notebook runs and trains nothing.
    third = _client(tmp_path)
    third.execute()
    assert not _errors(third)
    assert _initial_epoch(third) == EPOCHS
    assert _trained(third) == 0
    assert f"complete: {EPOCHS} of {EPOCHS} epochs done" in _stdout(third)
    assert f"history: {EPOCHS} epochs" in _stdout(third)
    assert _committed(run_dir) == committed


INTERRUPTED_FIT_CELLS = [
    """import json, os, time
import keras, numpy as np, resumable
from resumable.storage.lease import read_lease
from resumable.storage import RunStorage
RUN = os.environ["RESUMABLE_TEST_RUN"]
x = np.random.rand(64, 4).astype("float32")
y = np.random.rand(64, 1).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("adam", "mse")
callback = resumable.CheckpointCallback(RUN)
slow = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: time.sleep(0.5))""",
    # a plain model.fit, not run.fit: Keras calls no on_train_end when Ctrl-C stops it
    "model.fit(x, y, epochs=200, callbacks=[callback, slow], verbose=0)",
    """holder = read_lease(RunStorage(RUN))
print("lease:", json.dumps(holder.describe() if holder else None))
print("pending:", json.dumps(callback.manager.writer.uploader.pending))""",
]


@pytest.mark.slow
def test_a_plain_fit_stopped_in_a_notebook_cell_gives_the_lease_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Colab's stop button (SIGINT to the kernel) during a plain model.fit: once the cell has
    ended, the checkpoints saved are committed and the run folder is free for `resumable prune`
    or another process; before, the lease stayed held and renewed until the kernel exited."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("RESUMABLE_TEST_RUN", str(run_dir))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in INTERRUPTED_FIT_CELLS])
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT, startup_timeout=120,
                                     allow_errors=True, resources={"metadata": {"path": str(tmp_path)}})

    async def run_and_interrupt() -> None:
        execution = asyncio.ensure_future(client.async_execute())
        await _until_committed(client, execution, run_dir, 2)
        await client.km.interrupt_kernel()  # what Colab's stop button does
        await asyncio.wait_for(execution, timeout=120)

    asyncio.run(run_and_interrupt())
    assert [e.split(":")[0] for e in _errors(client)] == ["KeyboardInterrupt"], _stdout(client)[-3000:]
    assert "lease: null" in _stdout(client), _stdout(client)[-3000:]
    assert "pending: []" in _stdout(client)
    assert not (run_dir / "lease.json").exists()
    infos = RunStorage(str(run_dir)).list()
    assert infos and all(i.ok for i in infos)
    assert infos[-1].epoch is not None and infos[-1].epoch >= 2
