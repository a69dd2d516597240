"""scripts/hostile_audit.py: every hostile run folder it builds is handled cleanly.

The script is what docs/reliability.md quotes; here its four counts must all be zero.
"""

from __future__ import annotations

import sys

from paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import hostile_audit  # noqa: E402


def test_no_hostile_folder_causes_a_traceback_a_loss_or_a_write_outside() -> None:
    outcomes = hostile_audit.audit()
    assert len(outcomes) >= 30
    problems = {o.name: o.tracebacks + o.outside_changed + o.committed_lost + o.control_chars
                for o in outcomes if not o.clean}
    assert problems == {}
    assert {o.resumed for o in outcomes} == {"ckpt-000003", "ckpt-000004"}
