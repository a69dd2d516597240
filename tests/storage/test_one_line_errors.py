"""One line with what to do, for a read-only file system and in a notebook.

The read-only folder is a real read-only tmpfs, mounted in a user and mount namespace
(``unshare -rm``) so no privilege is needed; where the kernel refuses such namespaces the test
is skipped, and the translation itself is still checked on the error the OS raises.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resumable import RunStorage, StoragePermissionError
from resumable.core.errors import LeaseLostError, ResumableError, RunNotFoundError
from resumable.storage.errors import translate

COMMIT = """
import sys
from pathlib import Path
from resumable import RunStorage
from resumable.core.errors import ResumableError
from resumable.core.manifest import Manifest
stage = Path(sys.argv[2])
try:
    RunStorage(sys.argv[1] + "/run").commit(stage, "ckpt-000001", Manifest(epoch=1))
except ResumableError as e:
    print(f"{type(e).__name__}|{e}")
"""


def test_a_read_only_file_system_is_one_line_with_what_to_do(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a read-only file system")
    read_only, stage = tmp_path / "ro", tmp_path / "stage"
    read_only.mkdir()
    stage.mkdir()
    (stage / "model.keras").write_bytes(b"weights")
    shell = 'mount -t tmpfs -o ro tmpfs "$1" || exit 99; exec "$2" -c "$3" "$1" "$4"'
    done = subprocess.run(["unshare", "-rm", "sh", "-c", shell, "sh", str(read_only), sys.executable, COMMIT,
                           str(stage)], capture_output=True, text=True, timeout=120)
    if done.returncode == 99 or "unshare failed" in done.stderr:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    kind, message = done.stdout.strip().split("|", 1)
    assert kind == "StoragePermissionError", done.stdout
    assert message.startswith(f"{read_only}/run") and "\n" not in message
    assert "the file system is read-only" in message and "choose a run folder you can write to" in message
    assert "Errno" not in message


def test_erofs_translates_to_one_line() -> None:
    error = OSError(errno.EROFS, "Read-only file system")
    translated = translate(error, "/kaggle/input/run/ckpt-000001", "/kaggle/input/run", "/kaggle/input/run",
                           is_gcs=False, is_local=True)
    assert isinstance(translated, StoragePermissionError) and isinstance(translated, PermissionError)
    assert str(translated) == (
        "/kaggle/input/run/ckpt-000001: the file system is read-only (a read-only mount, "
        "or a shared folder you may only view); choose a run folder you can write to")


def test_a_typod_bucket_raises_one_line_without_the_librarys_chain(gcs_server: str) -> None:
    storage = RunStorage("gs://no-such-bucket-4f1e/runs/exp1")
    with pytest.raises(RunNotFoundError) as caught:
        list(storage.newest_first())  # what resume() reads first
    assert str(caught.value) == ("gs://no-such-bucket-4f1e/runs/exp1: not found; does the bucket "
                                 "gs://no-such-bucket-4f1e exist? Create it first")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained traceback


def test_a_notebook_shows_every_resumable_error_as_its_one_line() -> None:
    for error in (RunNotFoundError("gs://b/x: not found"), LeaseLostError("x: lost"), ResumableError("y")):
        assert error._render_traceback_() == [f"{type(error).__name__}: {error}"]
