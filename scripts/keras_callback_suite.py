"""Run Keras' own tests of ModelCheckpoint and BackupAndRestore against resumable's drop-ins.

    python scripts/keras_callback_suite.py PATH_TO_KERAS_CHECKOUT [pytest args...]
    python scripts/keras_callback_suite.py --git-dir KERAS.git --rev v3.15.1

Copies ``keras/src/callbacks/model_checkpoint_test.py`` and ``backup_and_restore_test.py`` from
a Keras checkout (a work tree, or a git directory and revision) into a temporary folder, replaces
``callbacks.ModelCheckpoint(`` and ``callbacks.BackupAndRestore(`` with ``resumable.ModelCheckpoint(``
and ``resumable.BackupAndRestore(``, and runs pytest on them against the installed Keras. Keras'
test code is read from the checkout at run time, never stored in this repository. Exit status:
pytest's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = ("model_checkpoint_test.py", "backup_and_restore_test.py")
SOURCE = "keras/src/callbacks"
CLASSES = ("ModelCheckpoint", "BackupAndRestore")


def substitute(text: str) -> tuple[str, int]:
    """The test with resumable's classes in place of Keras'; and how many calls were replaced."""
    total = 0
    for name in CLASSES:
        text, count = re.subn(rf"\bcallbacks\.{name}\(", f"resumable.{name}(", text)
        total += count
    return "import resumable\n" + text, total


def read_tests(checkout: Path | None, git_dir: Path | None, rev: str) -> dict[str, str]:
    if git_dir is not None:
        return {name: subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{rev}:{SOURCE}/{name}"],
                                     check=True, capture_output=True, text=True).stdout for name in FILES}
    assert checkout is not None
    return {name: (checkout / SOURCE / name).read_text() for name in FILES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", nargs="?", type=Path, help="a Keras work tree")
    parser.add_argument("--git-dir", type=Path, help="a Keras git directory (bare or .git)")
    parser.add_argument("--rev", default="v3.15.1", help="the revision with --git-dir (default v3.15.1)")
    args, pytest_args = parser.parse_known_args(argv)
    if (args.checkout is None) == (args.git_dir is None):
        parser.error("give a Keras checkout or --git-dir")
    tests = read_tests(args.checkout, args.git_dir, args.rev)
    with tempfile.TemporaryDirectory(prefix="keras-callback-suite-") as folder:
        for name, text in tests.items():
            replaced, count = substitute(text)
            print(f"{name}: {count} constructor calls now resumable's", flush=True)
            (Path(folder) / name).write_text(replaced)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W",
                   "ignore::pytest.PytestUnknownMarkWarning", "-rA", folder, *pytest_args]
        return subprocess.run(command, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
