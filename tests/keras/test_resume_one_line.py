"""`resumable.resume` says one line: where it continues (or that a run starts), on stderr; on a
typo'd bucket, its one error line in a notebook, no chained library traceback in a script.

Real processes against the fake-gcs-server: a script run by Python, and the same code run as a
notebook cell by IPython (which shows what Jupyter and Colab show).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

CODE = """
import keras, resumable
def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model
resumable.resume("gs://no-such-bucket-7c2d/runs/exp1", build_model=build)
"""
LINE = ("RunNotFoundError: gs://no-such-bucket-7c2d/runs/exp1: not found; does the bucket "
        "gs://no-such-bucket-7c2d exist? Create it first")


@pytest.mark.parametrize("how", ["script", "notebook"])
def test_resume_on_a_typod_bucket_says_one_line(how: str, gcs_server: str) -> None:
    if how == "script":
        command = [sys.executable, "-c", CODE]
    else:
        command = [sys.executable, "-m", "IPython", "--no-banner", "--quick", "--colors=NoColor", "-c", CODE]
    # IPython warns, naming site-packages, when another virtualenv than its own is activated
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0 or how == "notebook", output
    assert output.count("no-such-bucket-7c2d exist?") == 1, output
    assert "direct cause" not in output and "During handling" not in output, output
    assert "gcsfs" not in output and "site-packages" not in output, output
    line = next(x for x in output.splitlines() if "no-such-bucket-7c2d exist?" in x)
    assert line.endswith(LINE), line
    if how == "notebook":
        assert "Traceback" not in output and "resumable/" not in output, output


# ---------------------------------------------------------------------- every resume: one line on stderr

RESUME = """
import sys, keras, numpy as np, resumable
def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model
run = resumable.resume(sys.argv[1], build_model=build, monitor="loss")
run.fit(np.ones((8, 4), "float32"), np.ones((8, 1), "float32"), epochs=run.initial_epoch + 1, verbose=0)
"""


def _dead_lease(url: str) -> None:
    """The writer lease a killed session left: its process is gone."""
    import datetime as dt

    from resumable import RunStorage
    from resumable.storage import this_machine
    from resumable.storage.lease import LEASE_NAME, LeaseInfo

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    now = dt.datetime.now(dt.timezone.utc)
    gone = LeaseInfo(token="x", host=this_machine.HOST, pid=int(child.stdout), started=now, renewed=now,
                     timeout=600, boot_id=this_machine.BOOT_ID)
    assert RunStorage(url).run_files.create_run_file(LEASE_NAME, gone.to_json()) is not None


def test_every_resume_says_one_line_on_stderr(tmp_path: Path) -> None:
    """A new run, then a notebook resuming it after its kernel died holding the lease: one line
    each on stderr (a notebook shows it), the lease's takeover folded into the resume's."""
    url = str(tmp_path / "run")
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "TF_CPP_MIN_LOG_LEVEL": "3"}
    first = subprocess.run([sys.executable, "-c", RESUME, url], capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=300)
    assert first.returncode == 0, first.stderr
    assert [line for line in first.stderr.splitlines() if "resumable" in line] == [
        f"resumable: starting a new run in {url}"]
    _dead_lease(url)
    code = f"import sys; sys.argv = ['job', {url!r}]\n" + RESUME
    notebook = [sys.executable, "-m", "IPython", "--no-banner", "--quick", "--colors=NoColor", "-c", code]
    second = subprocess.run(notebook, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    said = [line for line in (second.stdout + second.stderr).splitlines() if "resumable" in line]
    assert len(said) == 1, second.stdout + second.stderr
    assert re.fullmatch(rf"resumable: resumed {re.escape(url)} from ckpt-000001 \(loss [0-9.e-]+\): training "
                        r"continues at epoch 2 \(taking over the writer lease of a process that is gone\)",
                        said[0]), said
    assert "resumable: resumed" in second.stderr


def test_an_uncompiled_model_from_build_model_is_refused_in_one_line(tmp_path: Path) -> None:
    import keras

    import resumable

    def build() -> keras.Model:
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])  # compile forgotten

    with pytest.raises(ValueError) as refused:
        resumable.resume(str(tmp_path / "run"), build_model=build)
    assert str(refused.value) == (
        "build_model() returned a model that is not compiled: call model.compile(...) inside build_model")
