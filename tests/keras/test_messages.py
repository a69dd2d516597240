"""What a user reads: a lost lease said once, save lines in order, the run's own epoch numbers.

Real fits, real processes: stdout (and stderr) are captured as a terminal or notebook shows them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from forked import run_job
from paths import JOBS, ROOT

import resumable
from resumable import RunStorage

TAKEOVER_JOB = JOBS / "takeover_job.py"
LEASE_JOB = JOBS / "lease_job.py"
# Without VIRTUAL_ENV: IPython warns, naming site-packages, when another virtualenv is activated.
ENV = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "TF_CPP_MIN_LOG_LEVEL": "3"}

# ---------------------------------------------------------------------- a run taken over: one line


def _holder(how: str, url: str, flag: Path, out: Path) -> subprocess.Popen[bytes]:
    argv = [url, "--wait-for", str(flag)]
    if how == "script":
        command = [sys.executable, str(TAKEOVER_JOB), *argv]
    else:  # a notebook cell: IPython's run_cell shows what an exception leaves, as Jupyter and Colab do
        code = f"import sys; sys.argv = {['job', *argv]!r}; exec(open({str(TAKEOVER_JOB)!r}).read())"
        command = [sys.executable, "-m", "IPython", "--no-banner", "--quick", "--colors=NoColor", "-c", code]
    return subprocess.Popen(command, stdout=out.open("wb"), stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)


def _wait_for_line(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no {text!r} line; output:\n{path.read_text(errors='replace')}")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["script", "notebook"])
def test_a_run_taken_over_says_so_once_in_one_line(how: str, tmp_path: Path) -> None:
    url, flag, out = str(tmp_path / "run"), tmp_path / "go-on", tmp_path / "holder.out"
    holder = _holder(how, url, flag, out)
    _wait_for_line(out, "HOLDING", holder)  # epoch 1 committed; the holder waits inside epoch 2
    taker = run_job(LEASE_JOB, [url, "--epochs", "2", "--takeover"], env=ENV, timeout=180)
    assert "DONE epochs=2" in taker.stdout, taker.stdout + taker.stderr
    flag.touch()  # the holder goes on: its save of epoch 2 finds the lease taken over
    assert holder.wait(180) != 0
    output = out.read_text(errors="replace")

    assert output.count("lost its writer lease") == 1, output
    line = next(x for x in output.splitlines() if "lost its writer lease" in x)
    assert line.startswith(("LeaseLostError: ", "resumable.core.errors.LeaseLostError: "))
    assert "takeover=True" in line  # what to do
    for deep in ("callback.py", "run_manager.py", "run_writer.py", "uploader.py", "lease.py", "site-packages",
                 "Warning"):
        assert deep not in output, output
    if how == "notebook":
        assert "Traceback" not in output, output
    assert "DONE" not in output
    # The holder committed nothing after the takeover; the taker's epoch 2 stands.
    assert [c.name for c in RunStorage(url).list()] == ["ckpt-000001", "ckpt-000002"]


# ---------------------------------------------------------------------- verbose=1: save lines in order

ORDER_SCRIPT = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import keras, numpy as np, resumable
def build():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model
run = resumable.resume(sys.argv[1], build_model=build, monitor="loss", verbose=1)
x = np.random.default_rng(0).normal(size=(512, 4)).astype("float32")
class Slow(keras.callbacks.Callback):  # progress bar updates come at most every 50 ms
    def on_train_batch_end(self, batch, logs=None):
        __import__("time").sleep(0.004)
run.fit(x, x.sum(1, keepdims=True), epochs=3, batch_size=8, verbose=1, callbacks=[Slow()])
"""


def _visible_lines(stdout: str) -> list[str]:
    """The lines a terminal or notebook ends up showing: each progress bar line as last drawn."""
    lines = []
    for raw in stdout.split("\n"):
        shown = raw.split("\r")[-1].replace("\b", "")
        lines.append(re.sub(r"\x1b\[[0-9;]*m", "", shown).strip())
    return [line for line in lines if line]


@pytest.mark.slow
def test_verbose_save_lines_come_between_progress_bars_in_order(tmp_path: Path) -> None:
    script = tmp_path / "order.py"
    script.write_text(ORDER_SCRIPT)
    done = run_job(script, [str(tmp_path / "run")], env=ENV)
    assert done.returncode == 0, done.stderr
    lines = _visible_lines(done.stdout)
    saved = [i for i, line in enumerate(lines) if ": saved " in line]
    assert [lines[i].split(":")[0] for i in saved] == ["Epoch 1", "Epoch 2", "Epoch 3"], lines
    final_bar = re.compile(r"^64/64 .*loss: ")
    for i in saved:
        assert lines[i].startswith("Epoch ") and "━" not in lines[i], lines
        before = lines[i - 1]
        assert ": saved " in before or final_bar.match(before), f"mid-bar: {before!r} then {lines[i]!r}"
        if i + 1 < len(lines):
            after = lines[i + 1]
            assert ": saved " in after or re.match(r"^Epoch \d/3$", after), f"{lines[i]!r} then {after!r}"
    # each one after its own epoch's bar
    headers = {line: i for i, line in enumerate(lines) if re.match(r"^Epoch \d/3$", line)}
    assert [headers[f"Epoch {k}/3"] < i for k, i in zip((1, 2, 3), saved, strict=True)] == [True] * 3


# ---------------------------------------------------------------------- the run's words


def _build() -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def _data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(1).normal(size=(80, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


class _StopAt(keras.callbacks.Callback):
    """Ctrl-C at a batch of an epoch: run.fit saves a mid-epoch checkpoint there."""

    def __init__(self, epoch: int, batch: int) -> None:
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if (self.epoch, batch) == self.at:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_a_mid_epoch_resume_shows_the_runs_epoch_numbers(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "run")
    x, y = _data()
    run = resumable.resume(url, build_model=_build, monitor="loss")
    with pytest.raises(KeyboardInterrupt):
        run.fit(x, y, epochs=4, batch_size=8, verbose=2, callbacks=[_StopAt(1, 3)])
    capsys.readouterr()

    run = resumable.resume(url, build_model=_build, monitor="loss")
    assert (run.initial_epoch, run.callback.resume_batch) == (1, 4)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and re.fullmatch(  # the resume's one line: the batch training continues at
        rf"resumable: resumed {re.escape(url)} from ckpt-000001-step-000000014 \(loss [0-9.e-]+\): "
        r"training continues at epoch 2, batch 5", said[0]), said
    history = run.fit(x, y, epochs=4, batch_size=8, verbose=2)
    out = capsys.readouterr().out

    headers = re.findall(r"^Epoch \d+/\d+$", out, flags=re.MULTILINE)
    assert headers == ["Epoch 2/4", "Epoch 3/4", "Epoch 4/4"], out
    assert "resumable: epoch 2 continues at batch 5" in out
    assert len(history.history["loss"]) == 3 and run.initial_epoch == 4


@pytest.mark.slow
def test_a_run_with_more_epochs_than_asked_says_what_happened(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "run")
    x, y = _data()
    resumable.resume(url, build_model=_build, monitor="loss").fit(x, y, epochs=3, batch_size=40, verbose=0)
    capsys.readouterr()

    run = resumable.resume(url, build_model=_build, monitor="loss")
    history = run.fit(x, y, epochs=2, batch_size=40, verbose=0)
    assert history.history == {} and run.initial_epoch == 3
    out = capsys.readouterr().out  # verbose=0: nothing printed
    assert out == ""
    run.fit(x, y, epochs=2, batch_size=40)
    out = capsys.readouterr().out
    assert f"resumable: {url}: the run already has 3 epochs; nothing to train for epochs=2" in out
    assert "of 2 epochs done" not in out
    run.fit(x, y, epochs=3, batch_size=40)
    assert f"resumable: {url}: complete: 3 of 3 epochs done" in capsys.readouterr().out
