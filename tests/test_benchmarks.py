"""The benchmarks run end to end in their tiny versions (their numbers are not checked)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from forked import JAX_CACHE

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "bench_save.py"


@pytest.mark.slow
def test_bench_save_tiny_prints_its_tables(gcs_server: str) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "TF_CPP_MIN_LOG_LEVEL": "3",
             **JAX_CACHE},  # the JAX jobs' compilation cache: its processes compile one model
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "**TensorFlow**" in out and "**JAX**" in out
    configs = ["no checkpoints", "ModelCheckpoint .keras, local", "resumable, local", "resumable, gs://"]
    loads = ["keras.saving.load_model, local .keras", "resume(local, build_model)", "resume(local)",
             "gcsfs get_file + load_model, gs://", "resume(gs://, build_model)", "resume(gs://)"]
    if importlib.util.find_spec("orbax") and importlib.util.find_spec("orbax.checkpoint"):
        configs += ["OrbaxCheckpoint, local", "OrbaxCheckpoint, gs://"]
        loads += ["keras.saving.load_model, Orbax folder"]
    else:
        assert "OrbaxCheckpoint configurations skipped" in out
    for row in configs:
        assert out.count(f"\n{row} ") == 4, row  # its values and its ratios, on each backend
    for row in loads:
        assert out.count(f"\n{row} ") == 2, row
    for target in ("blocked per save, resumable to a local folder / ModelCheckpoint",
                   "peak RSS over baseline, resumable, local", "epoch time, resumable to a local folder",
                   "resume(gs://) / gcsfs get_file + load_model",
                   "epoch time: resumable to a local folder / ModelCheckpoint"):
        assert out.count(target) == 2, target
    if "OrbaxCheckpoint, local" in configs:
        for target in ("epoch time: resumable to a local folder / OrbaxCheckpoint",
                       "wait at the end of fit: resumable to a local folder / OrbaxCheckpoint",
                       "last save, all fit waited for it: resumable to a local folder / OrbaxCheckpoint"):
            assert out.count(target) == 2, target
    assert "written to" not in out  # the tiny run never rewrites the docs


def test_bench_run_length_tiny_prints_every_row(gcs_server: str) -> None:
    """The run-length benchmark end to end on a tiny run, both places, ``--before`` included."""
    script = SCRIPT.parent / "bench_run_length.py"
    result = subprocess.run(
        [sys.executable, str(script), "--checkpoints", "12", "--rounds", "1",
         "--before", str(SCRIPT.parent.parent)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(("local ", "gs "))]
    measures = ["resume:", "list", "prune", "prune"]  # a measure's first word
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (where, "12", m) for where in ("local", "gs") for m in measures for _ in ("now", "before")]
    assert all(r[-1] == "1" for r in rows)  # one round each


MULTIHOST = Path(__file__).parent.parent / "benchmarks" / "bench_multihost.py"


@pytest.mark.slow
@pytest.mark.skipif(not (importlib.util.find_spec("tensorstore") and importlib.util.find_spec("jax")),
                    reason="needs jax and tensorstore")
def test_bench_multihost_tiny_prints_its_tables() -> None:
    configs = "none,resumable"
    if importlib.util.find_spec("orbax") and importlib.util.find_spec("orbax.checkpoint"):
        configs += ",orbax"
    result = subprocess.run(
        [sys.executable, str(MULTIHOST), "--tiny", "--configs", configs], capture_output=True, text=True,
        timeout=900, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **JAX_CACHE},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "2 processes x 2 CPU devices, one mesh of 4; the split kernel 64 x 512" in out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| configuration")}
    blocked = rows["resumable, local"][0]
    assert blocked != "-" and float(blocked.split()[0]) > 0, rows  # measured, not left out
    if "orbax" in configs:
        assert rows["OrbaxCheckpoint, local"][0] != "-" and "ratio" in rows, rows
    assert "wrote" not in out  # the tiny run never rewrites the docs


def test_bench_disk_prints_each_measure_with_its_rounds(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "bench_disk.py"), "--mb", "2", "--rounds", "3",
         "--folder", str(tmp_path)], capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == f"2 MB, 3 rounds, in {tmp_path}: median [min-max] seconds"
    for measure in ("memory copy", "write into a new file", "write, then fsync"):
        row = next(line for line in lines if line.startswith(measure))
        assert len(row.split("each round: ")[1].split()) == 3, row
    assert list(tmp_path.iterdir()) == []  # its files are gone


def test_bench_upload_sends_the_file_each_way_and_prints_a_row_each() -> None:
    """Its own fake-gcs-server; each way's object is checked for its size before it is deleted."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "bench_upload.py"), "--mb", "9", "--rounds", "2"],
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("9 MB to fake-gcs-server on loopback, 2 rounds")
    for way in ("resumable", "single-request upload", "gcsfs put_file",
                "floor: a session, one PUT from memory", "floor: one POST from memory",
                "floor: 4 sessions at once, composed"):
        row = next(line for line in lines if line.startswith(way + " "))
        assert row.endswith("x") and row.count("[") == 3, row
    held = lines[lines.index("a listing sent while a body is held after its first piece:") + 1:]
    assert held[0].startswith("  resumable: answered in ")  # its session's body holds nothing up
    assert held[1].startswith("  single-request upload: ")
