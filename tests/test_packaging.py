"""The install promises: no hard TensorFlow requirement, no TensorFlow import for storage and CLI."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires

import pytest

pytestmark = pytest.mark.lanes


def test_tensorflow_is_only_an_extra() -> None:
    # Colab's TPU runtimes ship without TensorFlow and installing it there breaks their JAX.
    hard = [r for r in requires("keras-resumable") or [] if "extra ==" not in r]
    assert hard, "resumable declares no requirements at all"
    assert not [r for r in hard if r.lower().startswith("tensorflow")]
    assert any(r.startswith("keras") for r in hard)


def test_storage_and_cli_do_not_import_tensorflow_or_keras() -> None:
    code = (
        "import sys, resumable, resumable.storage, resumable.cli.app, resumable.core.policy\n"
        "heavy = sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_keras_floor_is_the_oldest_lane_and_the_requirement() -> None:
    import re

    import pytest
    from paths import ROOT

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from resumable._keras_floor import OLDEST_KERAS

    floor = ".".join(map(str, OLDEST_KERAS))
    assert f"keras>={floor}" in [r.replace(" ", "") for r in requires("keras-resumable") or []]
    lanes = tomllib.loads((ROOT / "requirements" / "lanes.toml").read_text())["lanes"].values()
    pinned = [re.fullmatch(r"keras==(\d+)\.(\d+)\.\d+", pin) for lane in lanes for pin in lane["pins"]]
    assert min((int(m[1]), int(m[2])) for m in pinned if m) == OLDEST_KERAS


def test_a_keras_below_the_floor_is_one_line_at_import() -> None:
    from resumable._keras_floor import too_old

    message = too_old("3.5.0")
    assert message is not None and "3.5.0" in message and "3.8" in message and "\n" not in message
    assert too_old("3.8.0") is None and too_old("3.15.1") is None and too_old("unknown") is None
    code = ("import importlib.metadata as m\n"
            "real = m.version\n"
            "m.version = lambda name: '3.5.0' if name == 'keras' else real(name)\n"
            "import resumable\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines() == [too_old("3.5.0")]


def test_the_dev_extra_lints_with_the_versions_ci_pins() -> None:
    """A contributor's `pip install -e ".[dev]"` runs the ruff and mypy that CI runs (.ci/run)."""
    import configparser

    from paths import ROOT

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    dev = {line.strip() for line in config["options.extras_require"]["dev"].splitlines()}
    lines = (ROOT / "requirements" / "lint.txt").read_text().splitlines()
    pins = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert pins == {p for p in dev if p.startswith(("ruff", "mypy"))} and len(pins) == 2, (pins, dev)
    assert all("==" in pin for pin in pins)
    assert "requirements/lint.txt" in (ROOT / ".ci" / "run").read_text()
