"""The save benchmark runs end to end in its tiny version (its numbers are not checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "bench_save.py"


@pytest.mark.slow
def test_bench_save_tiny_prints_its_tables(gcs_server: str) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for row in ("1. no checkpointing", "2. ModelCheckpoint .keras, local",
                "3. CheckpointCallback gs://, background", "4. CheckpointCallback gs://, async_upload=False"):
        assert row in out
    assert "background uploads, 3/2: blocked per save" in out and "resume: `resume()`" in out
    assert "CPU/epoch, this process" in out
    assert "written to" not in out  # the tiny run never rewrites the docs
