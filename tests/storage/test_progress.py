"""Transfer progress: a bar where a line can be rewritten, readable lines in logs (no TTY)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from resumable import RunStorage
from resumable.core.manifest import Manifest
from resumable.storage import progress
from resumable.storage.progress import WaitLine, byte_progress, interactive

MB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_a_few_plain_lines_and_a_summary() -> None:
    log, clock = io.StringIO(), Clock()
    with byte_progress(236 * MB, "upload model.keras", stream=log, clock=clock) as moved:
        for _ in range(236):  # 1 MB every 1/8 s: 29.5 s
            clock.now += 0.125
            moved.update(MB)
    lines = log.getvalue().splitlines()
    assert len(lines) == 3, lines  # at 10 s, at 20 s, then the summary
    assert lines[0] == "resumable: upload model.keras: 80.0 MB of 236.0 MB (33%), 8.0 MB/s"
    assert lines[-1] == "resumable: upload model.keras: 236.0 MB in 29.5 s (8.0 MB/s)"
    assert "\r" not in log.getvalue()


def test_a_short_transfer_prints_only_its_summary_and_a_stopped_one_says_so() -> None:
    log, clock = io.StringIO(), Clock()
    with byte_progress(8 * MB, "download model.keras", stream=log, clock=clock) as moved:
        clock.now += 2
        moved.to(8 * MB)
    assert log.getvalue() == "resumable: download model.keras: 8.0 MB in 2.0 s (4.0 MB/s)\n"
    log = io.StringIO()
    with pytest.raises(OSError), byte_progress(8 * MB, "upload x", stream=log, clock=clock) as moved:
        moved.update(3 * MB)
        raise OSError("cut")
    assert log.getvalue() == "resumable: upload x: stopped after 3.0 MB of 8.0 MB\n"


def test_on_a_terminal_a_tqdm_bar_cleared_at_the_end() -> None:
    term = Terminal()
    assert interactive(term)
    with byte_progress(8 * MB, "upload model.keras", stream=term) as moved:
        moved.update(8 * MB)
    shown = term.getvalue()
    assert "resumable: upload model.keras" in shown and "\r" in shown
    assert "in 0." not in shown  # no summary line on a terminal: the bar said it


def test_in_a_notebook_the_bar_then_a_summary_that_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    out = io.StringIO()  # a kernel's stderr is no TTY
    assert interactive(out)
    with byte_progress(8 * MB, "upload model.keras", stream=out) as moved:
        moved.update(8 * MB)
    assert out.getvalue().splitlines()[-1].startswith("resumable: upload model.keras: 8.0 MB in ")


def test_wait_line_counts_down_on_a_terminal_and_says_twice_in_a_log() -> None:
    term, clock = Terminal(), Clock()
    with WaitLine("resumable: waiting up to 40 s for X", stream=term, clock=clock) as wait:
        for left in (40, 39.5, 39, 12):
            wait.left(left)
        clock.now += 31
        wait.end("not renewed, taking it over")
    shown = term.getvalue()
    assert "(40 s left)" in shown and "(12 s left)" in shown and shown.count("(40 s left)") == 1
    assert shown.endswith(": not renewed, taking it over (31 s)\n")
    log = io.StringIO()
    with WaitLine("resumable: waiting up to 40 s for X", stream=log, clock=clock) as wait:
        wait.left(12)
        wait.end("renewed, so its writer is alive")
    assert log.getvalue().splitlines() == ["resumable: waiting up to 40 s for X",
                                           "resumable: renewed, so its writer is alive (0 s)"]


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_a_commit_and_fetch_in_a_log_print_one_summary_per_big_file(
        run_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Real transfers with stderr captured (no TTY): readable lines, no bar stuck at 0%."""
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "model.keras").write_bytes(bytes(range(256)) * (20 * 4096))  # 20 MB
    (stage / "state.json").write_bytes(b"{}")
    storage = RunStorage(run_url)
    info = storage.commit(stage, "ckpt-000001", Manifest(epoch=1), progress=True)
    storage.fetch(info, tmp_path / "cache", progress=True)
    err = capfd.readouterr().err
    summary = r"^resumable: upload model\.keras: 20\.0 MB in [\d.]+ s \([\d.]+ [KMG]?B/s\)$"
    assert re.search(summary, err, re.M), err
    assert re.search(r"^resumable: download model\.keras: 20\.0 MB in [\d.]+ s", err, re.M), err
    assert "state.json" not in err  # small files: nothing
    assert "0%|" not in err and "\r" not in err
