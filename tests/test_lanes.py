"""scripts/lanes.py: the pins file it reads, what it says of an install, a lane without its Python."""

from __future__ import annotations

import importlib.util
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
    assert lanes.build(lane, tmp_path / "x.whl", []) is False
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
