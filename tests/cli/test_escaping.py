"""Terminal output is clean: strings read from a run folder are printed with control characters escaped.

A checkpoint named ``ckpt\\x1b[2J`` must not clear the terminal of whoever lists the run, a
metric name holding ``\\x1b[31m`` must not paint it, and a name holding a newline must not
print a line of its own (a fake "ok" row). The run below is committed by RunStorage with such
names everywhere a run provides text: checkpoint and file names, metric names, versions,
state; then every command prints it, as a table and as JSON.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from resumable import RunStorage
from resumable.cli.app import main
from resumable.core.display import printable
from resumable.core.manifest import MANIFEST_NAME, Manifest

CLEAR = "\x1b[2J\x1b[H"  # ANSI: clear the screen, cursor home
RED = "\x1b[31m"
TITLE = "\x1b]0;owned\x07"  # OSC: set the terminal's title
NAMES = [
    "ckpt-000001",
    f"ckpt-000002{CLEAR}",
    "ckpt-000003\nckpt-000009  9  90  ok  latest",  # a fake row
    "ckpt-000004\x9b31m\x7f",  # C1 CSI, DEL
]
METRIC = f"val{RED}_loss"


def control_characters(text: str) -> list[str]:
    """Characters a terminal would act on, other than the newlines between lines."""
    return [c for c in text if c != "\n" and not c.isprintable()]


@pytest.fixture
def run(tmp_path: Path) -> str:
    url = str(tmp_path / "run")
    storage = RunStorage(url)
    for epoch, name in enumerate(NAMES, start=1):
        stage = tmp_path / "stage" / str(epoch)
        stage.mkdir(parents=True)
        (stage / "model.keras").write_bytes(bytes([epoch]) * 100)
        (stage / f"notes{TITLE}.txt").write_bytes(b"n")
        manifest = Manifest(
            epoch=epoch, step=epoch * 10, metrics={"loss": 1 / epoch, METRIC: 2 / epoch},
            versions={"resumable": "0.1.0", "keras": f"3.15{RED}", f"tool{CLEAR}": "1\x9b\x7f"},
            state={"monitor": METRIC, "mode": "min", f"note{TITLE}": f"hi{CLEAR}"}, payload="model.keras",
        )
        storage.commit(stage, name, manifest)
    return url


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


COMMANDS = {
    "list": ["list"],
    "list-deep": ["list", "--deep"],
    "inspect": ["inspect", "--name", NAMES[1]],
    "inspect-latest": ["inspect"],
    "verify": ["verify"],
    "prune-dry-run": ["prune", "--keep-last", "1", "--dry-run"],
    "prune": ["prune", "--keep-last", "1", "--yes"],
}


@pytest.mark.parametrize("argv", COMMANDS.values(), ids=COMMANDS.keys())
def test_tables_escape_control_characters(run: str, capsys: pytest.CaptureFixture[str],
                                           argv: list[str]) -> None:
    code, out, err = run_cli(capsys, argv[0], run, *argv[1:])
    assert code == 0, err
    assert control_characters(out + err) == []
    assert "\\x1b" in out  # shown, escaped: the user still sees what the name holds


def test_a_newline_in_a_name_prints_no_line_of_its_own(run: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(capsys, "list", run)
    rows = out.split("\n\n")[0].splitlines()
    assert len(rows) == 1 + len(NAMES)  # the header and one row per checkpoint
    assert not any(row.startswith("ckpt-000009") for row in out.splitlines())
    assert "ckpt-000003\\nckpt-000009" in out
    assert f"ckpt-000002{printable(CLEAR)}" in out and "ckpt-000004\\x9b31m\\x7f" in out
    header = rows[0].split()
    assert "val\\x1b[31m_loss" in header  # the metric's column


@pytest.mark.parametrize("argv", [["list"], ["list", "--deep"], ["inspect", "--name", NAMES[1]], ["verify"],
                                  ["prune", "--keep-last", "1", "--dry-run"]])
def test_json_escapes_every_control_character_and_keeps_the_names(
        run: str, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run_cli(capsys, argv[0], run, *argv[1:], "--json")
    assert code == 0
    assert control_characters(out) == [] and out.isascii()  # C1 and DEL too, not only C0
    assert NAMES[1] in out.encode().decode("unicode_escape")
    found = json.dumps(json.loads(out))
    assert "\\u001b" in found and "\\u009b" in out and "\\u007f" in out


def test_a_corrupt_checkpoint_s_problem_is_escaped(run: str, capsys: pytest.CaptureFixture[str],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    manifest = Path(run) / NAMES[3] / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["files"][f"gone{CLEAR}.bin"] = {"size": 1, "crc32c": "00000000"}  # listed, never stored
    manifest.write_text(json.dumps(data))
    for argv in (["list", run, "--deep"], ["verify", run], ["inspect", run, "--name", NAMES[3]]):
        _, out, err = run_cli(capsys, *argv)
        assert f"gone{printable(CLEAR)}.bin missing" in out or f"gone{printable(CLEAR)}.bin: missing" in out
        assert control_characters(out + err) == []
    with caplog.at_level(logging.WARNING, logger="resumable"):
        assert next(RunStorage(run).newest_first()).name == NAMES[2]
    assert "skipping" in caplog.text and control_characters(caplog.text) == []


def test_an_error_line_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "list", str(tmp_path / f"no-such{CLEAR}run"))
    assert code == 2 and err.startswith("error: ") and "\\x1b[2J" in err
    assert control_characters(out + err) == [] and err.count("\n") == 1


def test_printable_escapes_control_characters_only() -> None:
    plain = "ckpt-000001 caf\u00e9 \u6f22 \U0001f600 a\\b"
    assert printable(plain) == plain
    assert printable("\x00\x07\t\n\r\x1b\x7f\x80\x9b\x9f") == "\\x00\\x07\\t\\n\\r\\x1b\\x7f\\x80\\x9b\\x9f"
    # a bidi override, a zero-width space, a lone surrogate
    assert printable("\u202e\u200b\ud800") == "\\u202e\\u200b\\ud800"
    assert printable(printable(CLEAR)) == printable(CLEAR)  # escaping twice changes nothing more
