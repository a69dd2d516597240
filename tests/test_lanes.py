"""scripts/lanes.py: the pins file it reads, what it says of an install, a lane without its Python."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from paths import ROOT

pytest.importorskip("tomllib")  # Python 3.11+, as the script

spec = importlib.util.spec_from_file_location("lanes", ROOT / "scripts" / "lanes.py")
assert spec is not None and spec.loader is not None
lanes = importlib.util.module_from_spec(spec)
sys.modules["lanes"] = lanes
spec.loader.exec_module(lanes)


def test_every_lane_names_its_source_python_backend_and_tests() -> None:
    found, tools = lanes.read_lanes()
    assert {"newest", "colab", "colab-tpu", "colab-2025", "colab-2025-07", "torch"} <= set(found)
    assert any(tool.startswith("pytest") for tool in tools)
    for lane in found.values():
        assert lane.source and lane.title and lane.tests in ("readme", "lanes")
        assert lane.backend in ("tensorflow", "jax", "torch")
        assert all(not pin.startswith(("-", "git+", "http")) for pin in lane.pins)
    assert [lane.name for lane in found.values() if lane.tests == "readme"] == ["newest"]
    tpu = found["colab-tpu"]
    assert not any(pin.split("==")[0] in ("tensorflow", "gcsfs") for pin in tpu.pins)
    assert "keras==3.13.2" in found["colab"].pins and "keras==3.8.0" in found["colab-2025-07"].pins


def test_changes_name_what_an_install_added_changed_and_removed() -> None:
    before = {"fsspec": "2026.2.0", "grpcio": "1.83.0", "old": "1"}
    after = {"fsspec": "2026.2.0", "grpcio": "1.85.3", "gcsfs": "2026.2.0"}
    assert lanes.changes(before, after) == ["added gcsfs 2026.2.0", "changed grpcio 1.83.0 -> 1.85.3",
                                            "removed old 1"]


def test_refresh_takes_a_freeze_files_versions_and_keeps_what_it_lacks(tmp_path: Path) -> None:
    freeze = tmp_path / "pip-freeze.txt"
    freeze.write_text("Keras==3.14.0\nml_dtypes==0.7.0\ntorch @ https://example/torch.whl\n")
    pins = ("keras==3.13.2", "ml-dtypes==0.6.0", "rich==13.9.4")
    lane = lanes.Lane("x", "t", "3.13", "s", "jax", "lanes", pins)
    text = lanes.refreshed(lane, freeze)
    assert '"Keras==3.14.0"' in text and '"ml_dtypes==0.7.0"' in text and '"rich==13.9.4"' in text
    assert text.splitlines()[0] == "# not in pip-freeze.txt, kept: rich"


def test_a_lane_whose_python_is_missing_is_skipped_in_one_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(lanes, "find_python", lambda version: None)
    lane = lanes.Lane("colab-9", "t", "3.99", "s", "jax", "lanes", ())
    assert lanes.build(lane, tmp_path / "x.whl", []) is None
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("lanes: colab-9: skipped: Python 3.99 is not on this machine")


def test_find_python_finds_the_newest_patch_of_a_pyenv_version(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for version in ("3.13.0", "3.13.10", "3.13.9", "3.12.1"):
        (tmp_path / "versions" / version / "bin").mkdir(parents=True)
        (tmp_path / "versions" / version / "bin" / "python").write_text("")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setattr(lanes.shutil, "which", lambda name: None)  # no pyenv, no pythonX.Y on PATH
    assert lanes.find_python("3.13") == tmp_path / "versions" / "3.13.10" / "bin" / "python"
    assert lanes.find_python("3.11") is None


def fake_venv(root: Path, name: str = "colab-0123456789abcdef") -> lanes.Venv:
    """A folder shaped as a lane's venv: bin/python and two installed files."""
    lane = lanes.Lane("colab", "t", "3.13", "s", "tensorflow", "lanes", ("keras==3.13.2",))
    venv = lanes.Venv(lane, root / name)
    (venv.bin).mkdir(parents=True)
    (venv.bin / "python").write_text("")
    site = venv.path / "lib" / "python3.13" / "site-packages"
    (site / "keras").mkdir(parents=True)
    (site / "keras" / "__init__.py").write_text("x = 1\n")
    (site / "resumable").mkdir()
    (site / "resumable" / "__init__.py").write_text("")
    return venv


def finish_build(venv: lanes.Venv, key: str) -> None:
    venv.stamp_file.write_text(json.dumps({"key": key, "files": lanes.installed_files(venv)}))


def test_a_cached_venv_is_trusted_only_whole_and_for_its_key(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path)
    assert lanes.trusted(venv, "k1") == "its build never finished"  # killed mid-build: no stamp
    finish_build(venv, "k1")
    assert lanes.trusted(venv, "k1") is None
    assert lanes.trusted(venv, "k2") == "it was built for another key"
    site = venv.path / "lib" / "python3.13" / "site-packages"
    # What a run writes there, and resumable reinstalled from the checkout, change nothing.
    (site / "keras" / "__pycache__").mkdir()
    (site / "keras" / "__pycache__" / "x.pyc").write_text("bytecode")
    (site / "resumable" / "__init__.py").write_text("a newer resumable")
    (site / "keras_resumable-9.9.dist-info").mkdir()
    assert lanes.trusted(venv, "k1") is None
    (site / "keras" / "__init__.py").write_text("x")  # cut short
    assert lanes.trusted(venv, "k1") == "its installed files changed since it was built"
    finish_build(venv, "k1")
    (site / "keras" / "__init__.py").unlink()  # lost
    assert lanes.trusted(venv, "k1") == "its installed files changed since it was built"
    finish_build(venv, "k1")
    (venv.bin / "python").unlink()
    assert lanes.trusted(venv, "k1") == "its Python is gone"
    venv.stamp_file.write_text("{not json")
    assert lanes.trusted(venv, "k1") == "its stamp is unreadable"
    assert lanes.trusted(lanes.Venv(venv.lane, tmp_path / "missing"), "k1") == "none built yet"


def test_the_key_follows_pins_python_requirements_and_tools(tmp_path: Path) -> None:
    lane = lanes.Lane("colab", "t", "3.11", "s", "tensorflow", "lanes", ("keras==3.13.2",))
    python = Path(sys.executable)
    key = lanes.lane_key(lane, lane.pins, python, ["pytest>=7"])
    assert len(key) == 16 and key == lanes.lane_key(lane, lane.pins, python, ["pytest>=7"])
    assert key != lanes.lane_key(lane, ("keras==3.14.0",), python, ["pytest>=7"])
    assert key != lanes.lane_key(lane, lane.pins, python, ["pytest>=8"])
    assert lanes.resolved_pins(lane, python) == lane.pins  # all pinned: no look-up


def test_prune_keeps_the_newest_venvs_of_the_lane_alone(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lanes, "CACHE", tmp_path)
    names = ["colab-000000000000000a", "colab-000000000000000b", "colab-000000000000000c",
             "colab-tpu-000000000000000d", "colab-notes"]
    for age, name in enumerate(names):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1000 + age, 1000 + age))
    lane = lanes.Lane("colab", "t", "3.13", "s", "tensorflow", "lanes", ())
    lanes.prune(lane, keep=tmp_path / "colab-000000000000000a")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "colab-000000000000000a", "colab-000000000000000c", "colab-notes", "colab-tpu-000000000000000d"]


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines() if "python -m pytest" in line and "venv" in line)
    assert command in (ROOT / ".ci" / "run").read_text()
