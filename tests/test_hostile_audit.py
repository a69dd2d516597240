"""scripts/hostile_audit.py: every hostile run folder, file, clock and server it tries is handled cleanly.

The script is what docs/reliability.md quotes; here all its counts must be zero.
"""

from __future__ import annotations

import sys

import pytest
from paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import hostile_audit  # noqa: E402


def test_no_hostile_folder_causes_a_traceback_a_loss_or_a_write_outside() -> None:
    outcomes = hostile_audit.audit(classes=False)
    assert len(outcomes) >= 30
    problems = {o.name: o.problems for o in outcomes if not o.clean}
    assert problems == {}
    assert {o.resumed for o in outcomes} == {"ckpt-000003", "ckpt-000004"}


@pytest.mark.slow
def test_no_hostile_file_clock_or_server_stops_a_writer_or_passes_as_good() -> None:
    """Files NumPy or Keras refuse, clocks that are off, failing servers, a checkpoint damaged after
    its commit: resume() falls back, live writers keep their lease, one line soon, nothing called good."""
    outcomes = hostile_audit.audit(folders=False)
    assert len(outcomes) >= 14
    problems = {o.name: o.problems for o in outcomes if not o.clean}
    assert problems == {}
    assert {o.resumed for o in outcomes if o.name.startswith(("arrays", "model"))} == {"ckpt-000001"}
