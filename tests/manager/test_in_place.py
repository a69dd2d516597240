"""A local run's checkpoints written straight into their folder (manager/commits.py: InPlace)."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from resumable.core.errors import CheckpointExistsError
from resumable.core.manifest import FileEntry, Manifest
from resumable.manager.run_manager import RunManager
from resumable.storage import RunStorage
from resumable.storage.records import Status
from resumable.storage.written_files import WrittenFiles

PAYLOAD = os.urandom(3 * 2**20)


def write_files(folder: Path, root: str | None) -> dict[str, FileEntry]:
    files = WrittenFiles(folder, root)
    with files.create("model.keras") as file:
        file.write(PAYLOAD)
    files.write_bytes("state.json", b"{}")
    return files.entries


def commit(manager: RunManager, epoch: int) -> None:
    name = f"ckpt-{epoch:06d}"
    manager.writer.submit(manager.writer.stage(name), name, Manifest(epoch=epoch, step=epoch),
                   files=SimpleNamespace(write=write_files))


def commit_once(tmp_path: Path) -> None:
    """ckpt-000001 committed into ``tmp_path / "run"`` by a manager that then lets the run go."""
    manager = RunManager(str(tmp_path / "run"), staging_dir=tmp_path / "staging", async_upload=False)
    manager.writer.acquire()
    try:
        commit(manager, 1)
    finally:
        manager.release()


def test_files_land_in_the_run_without_a_staged_copy_and_check_out(tmp_path: Path) -> None:
    commit_once(tmp_path)
    info = RunStorage(str(tmp_path / "run")).get("ckpt-000001")
    assert info.status is Status.OK and info.manifest is not None
    assert info.manifest.files["model.keras"].size == len(PAYLOAD)
    assert RunStorage(str(tmp_path / "run")).verify("ckpt-000001") == []
    assert (tmp_path / "run" / "ckpt-000001" / "model.keras").read_bytes() == PAYLOAD
    assert not any(p.is_file() for p in (tmp_path / "staging").rglob("*"))  # nothing staged, nothing cached


def cached_pages(path: Path) -> int:
    """How many of the file's pages the kernel holds in its page cache (mincore(2))."""
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    with path.open("rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        start = ctypes.c_char.from_buffer(mapped)
        resident = (ctypes.c_ubyte * pages)()
        try:
            if libc.mincore(ctypes.byref(start), ctypes.c_size_t(size), resident) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del start  # the mapping closes only once no ctypes object points into it
        return sum(r & 1 for r in resident)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise and mincore: Linux")
def test_a_committed_files_pages_are_left_to_the_kernel(tmp_path: Path) -> None:
    # Cached, a checkpoint's bytes make the kernel reclaim memory before the next checkpoint's
    # write: on this machine 10x slower (docs/benchmarks.md). They are read back by a later session.
    commit_once(tmp_path)
    written = tmp_path / "run" / "ckpt-000001" / "model.keras"
    pages = (written.stat().st_size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    assert cached_pages(written) < pages // 4
    control = tmp_path / "control.bin"  # the same bytes written and fsynced, not dropped: cached
    with control.open("wb") as file:
        file.write(PAYLOAD)
        file.flush()
        os.fsync(file.fileno())
    assert cached_pages(control) == pages


def test_a_committed_checkpoint_is_never_written_over(tmp_path: Path) -> None:
    manager = RunManager(str(tmp_path / "run"), staging_dir=tmp_path / "staging", async_upload=False)
    manager.writer.acquire()
    try:
        commit(manager, 1)
        before = (tmp_path / "run" / "ckpt-000001" / "manifest.json").read_bytes()
        with pytest.raises(CheckpointExistsError, match="already committed"):
            commit(manager, 1)
    finally:
        manager.release()
    assert (tmp_path / "run" / "ckpt-000001" / "manifest.json").read_bytes() == before
    assert RunStorage(str(tmp_path / "run")).verify("ckpt-000001") == []


KILLED_JOB = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from manager.test_in_place import commit, PAYLOAD
from resumable.core.manifest import Manifest
from resumable.manager.run_manager import RunManager
from types import SimpleNamespace

from resumable.storage.written_files import WrittenFiles

manager = RunManager({url!r}, staging_dir={staging!r}, async_upload=False)
manager.writer.acquire()
commit(manager, 1)

def torn(folder, root):  # killed in the middle of model.keras, as a runtime dies
    files = WrittenFiles(folder, root)
    file = files.create("model.keras")
    file.write(PAYLOAD[: len(PAYLOAD) // 2])
    os.kill(os.getpid(), signal.SIGKILL)

manager.writer.submit(manager.writer.stage("ckpt-000002"), "ckpt-000002", Manifest(epoch=2, step=2),
               files=SimpleNamespace(write=torn))
"""


def test_a_process_killed_while_writing_in_place_leaves_a_partial_folder_never_used(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    tests = str(Path(__file__).parent.parent)
    job = KILLED_JOB.format(tests=tests, url=url, staging=str(tmp_path / "staging"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(job)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert (tmp_path / "run" / "ckpt-000002" / "model.keras").stat().st_size == len(PAYLOAD) // 2
    storage = RunStorage(url)
    statuses = {info.name: info.status for info in storage.list()}
    assert statuses == {"ckpt-000001": Status.OK, "ckpt-000002": Status.PARTIAL}
    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000001"

    manager = RunManager(url, staging_dir=tmp_path / "staging", async_upload=False, takeover=True)
    manager.writer.acquire()
    try:
        commit(manager, 2)  # the torn leftovers are cleared, then written again whole
    finally:
        manager.release()
    assert storage.verify("ckpt-000002") == []
    assert (tmp_path / "run" / "ckpt-000002" / "model.keras").read_bytes() == PAYLOAD
