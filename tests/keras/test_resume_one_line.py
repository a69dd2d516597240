"""`resumable.resume` on a typo'd bucket: one line in a notebook, no chained library traceback in a script.

Real processes against the fake-gcs-server: a script run by Python, and the same code run as a
notebook cell by IPython (which shows what Jupyter and Colab show).
"""

from __future__ import annotations

import os
import subprocess
import sys

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
