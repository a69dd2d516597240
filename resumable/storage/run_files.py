"""Compare-and-swap on small files directly in a run folder: what the writer's lease is made of.

`RunStorage` hands its run-file methods to a `RunFiles` over its `RunFolder`. Such a file
(``lease.json``) is never a checkpoint: listings skip files directly in the run folder. A
version names what was read or written: the object's generation on GCS, the bytes themselves
elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from resumable.core.naming import check_name
from resumable.storage import gcs_objects
from resumable.storage.folder import RunFolder
from resumable.storage.local_files import create_whole

READ_LIMIT = 1024 * 1024  # a run file (the lease) is a few hundred bytes; more is read no further


class RunFiles:
    """Conditional create, replace and delete of one small file in the run folder."""

    _run_file_lock = threading.Lock()  # memory:// and other backends without preconditions

    def __init__(self, folder: RunFolder) -> None:
        self._folder = folder

    # The folder's filesystem and kind, read at each call: a test may swap the filesystem.
    @property
    def fs(self) -> Any:
        return self._folder.fs

    @property
    def is_gcs(self) -> bool:
        return self._folder.is_gcs

    @property
    def is_local(self) -> bool:
        return self._folder.is_local

    def read_run_file(self, name: str) -> tuple[bytes, Any] | None:
        """``(bytes, version)`` of file ``name`` directly in the run folder, or None if absent."""
        path = self._run_file_path(name)

        def read() -> tuple[bytes, Any]:
            if self.is_gcs:
                return gcs_objects.read_with_generation(self.fs, path, READ_LIMIT)
            data = self._read_bounded(path)
            return data, data

        try:
            with self._folder.errors(self._folder.url_of(name)):
                result: tuple[bytes, Any] = self._folder.call(read, f"read {name}")
                return result
        except FileNotFoundError:
            return None

    def create_run_file(self, name: str, data: bytes) -> Any | None:
        """Create file ``name`` holding ``data`` only if it is absent; its version, or None if present.

        Readers never see it half-written: GCS' ``ifGenerationMatch=0``; locally a hard link
        of a complete temporary file (exclusive create where links are unsupported).
        """
        path = self._run_file_path(name)

        def create() -> Any:
            if self.is_gcs:
                return gcs_objects.write_if_generation(self.fs, path, data, 0)
            if self.is_local:
                create_whole(path, data)
            else:
                self.fs.pipe_file(path, data, mode="create")
            return data

        try:
            with self._folder.errors(self._folder.url_of(name)):
                return self._folder.call(create, f"create {name}")
        except FileExistsError:
            return None

    def replace_run_file(self, name: str, data: bytes, version: Any) -> Any | None:
        """Replace file ``name`` with ``data`` only if it still is ``version``; the new version, or None."""
        path = self._run_file_path(name)

        def swap() -> Any:
            if self.is_gcs:
                return gcs_objects.write_if_generation(self.fs, path, data, int(version))
            with self._run_file_locked(path):
                if self._current(path) != version:
                    return None
                self._folder.replace_file(path, data)  # fsynced with its folder entry locally
                return data

        try:
            with self._folder.errors(self._folder.url_of(name)):
                return self._folder.call(swap, f"replace {name}")
        except (FileExistsError, FileNotFoundError):  # 412: another generation, or none
            return None

    def run_file_age(self, name: str) -> float | None:
        """Seconds since file ``name`` was last written, where a reader may see it half-written
        (local disks and mounts: see `create_whole`); None where files appear whole (GCS,
        memory://) or when it is gone. By this machine's clock: negative if written "later".
        """
        if not self.is_local:
            return None
        path = self._run_file_path(name)
        try:
            with self._folder.errors(self._folder.url_of(name)):
                modified = self._folder.call(lambda: os.lstat(path).st_mtime, f"stat {name}")
        except FileNotFoundError:
            return None
        return time.time() - modified

    def run_file_server_age(self, name: str) -> float | None:
        """Seconds since file ``name`` was last written, by the storage's own clock alone (GCS:
        its answer's date minus the object's update time); None where the storage does not
        tell both (local disks and mounts: an mtime may come from the writing machine's clock,
        and a mount may show a write late) or when the file is gone."""
        if not self.is_gcs:
            return None
        path = self._run_file_path(name)
        try:
            with self._folder.errors(self._folder.url_of(name)):
                age: float | None = self._folder.call(lambda: gcs_objects.age_by_server(self.fs, path),
                                                      f"stat {name}")
                return age
        except FileNotFoundError:
            return None

    def delete_run_file(self, name: str, version: Any) -> bool:
        """Delete file ``name`` only if it still is ``version``; False when it changed or is gone."""
        path = self._run_file_path(name)

        def delete() -> bool:
            if self.is_gcs:
                return gcs_objects.delete_if_generation(self.fs, path, version)
            with self._run_file_locked(path):
                if self._current(path) != version:
                    return False
                self.fs.rm_file(path)
                return True

        try:
            with self._folder.errors(self._folder.url_of(name)):
                deleted: bool = self._folder.call(delete, f"delete {name}")
                return deleted
        except (FileExistsError, FileNotFoundError):
            return False

    def _run_file_path(self, name: str) -> str:
        check_name(name)
        return self._folder.path(name)

    def _current(self, path: str) -> bytes | None:
        try:
            return self._read_bounded(path)
        except FileNotFoundError:
            return None

    def _read_bounded(self, path: str) -> bytes:
        """At most ``READ_LIMIT + 1`` bytes of ``path``: a hostile 400 MB lease is never read whole."""
        limit = READ_LIMIT
        if self.is_local:  # a read sets its size aside first: ask for no more than the file holds
            limit = min(limit, os.stat(path).st_size)
        return bytes(self.fs.cat_file(path, start=0, end=limit + 1))

    @contextlib.contextmanager
    def _run_file_locked(self, path: str) -> Iterator[None]:
        """Read-compare-write without a writer in between: flock on the folder locally, else a lock."""
        if not self.is_local:
            with self._run_file_lock:
                yield
            return
        try:
            import fcntl
        except ImportError:  # not POSIX: the window is a few microseconds
            yield
            return
        folder = os.path.dirname(path)
        fd = os.open(folder, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # some FUSE mounts cannot lock: go on without
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            # Unlock, not only close: a process forked meanwhile (a PyDataset's multiprocessing
            # workers) shares this descriptor, and would hold the lock until it exits.
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
