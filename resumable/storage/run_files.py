"""Compare-and-swap on small files directly in a run folder: what the writer's lease is made of.

`RunFiles` is mixed into `RunStorage`. Such a file (``lease.json``) is never a checkpoint:
listings skip files directly in the run folder. A version names what was read or written:
the object's generation on GCS, the bytes themselves elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from resumable.core.naming import check_name
from resumable.storage.local_files import create_whole, fsync


class RunFiles:
    """Conditional create, replace and delete of one small file in the run folder."""

    # Provided by RunStorage.
    fs: Any
    is_gcs: bool
    is_local: bool
    _path: Callable[..., str]
    _url: Callable[..., str]
    _call: Callable[[Any, str], Any]
    _errors: Callable[[str], contextlib.AbstractContextManager[None]]
    _replace_file: Callable[[str, bytes], None]

    _run_file_lock = threading.Lock()  # memory:// and other backends without preconditions

    def read_run_file(self, name: str) -> tuple[bytes, Any] | None:
        """``(bytes, version)`` of file ``name`` directly in the run folder, or None if absent."""
        path = self._run_file_path(name)

        def read() -> tuple[bytes, Any]:
            if self.is_gcs:
                bucket, key, _ = self.fs.split_path(path)
                headers, data = self.fs.call("GET", "b/{}/o/{}", bucket, key, alt="media")
                generation = headers.get("X-Goog-Generation") or self.fs.info(path).get("generation")
                return bytes(data), str(generation)
            data = bytes(self.fs.cat_file(path))
            return data, data

        try:
            with self._errors(self._url(name)):
                result: tuple[bytes, Any] = self._call(read, f"read {name}")
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
                return self._gcs_write(path, data, 0)
            if self.is_local:
                create_whole(path, data)
            else:
                self.fs.pipe_file(path, data, mode="create")
            return data

        try:
            with self._errors(self._url(name)):
                return self._call(create, f"create {name}")
        except FileExistsError:
            return None

    def replace_run_file(self, name: str, data: bytes, version: Any) -> Any | None:
        """Replace file ``name`` with ``data`` only if it still is ``version``; the new version, or None."""
        path = self._run_file_path(name)

        def swap() -> Any:
            if self.is_gcs:
                return self._gcs_write(path, data, int(version))
            with self._run_file_locked(path):
                if self._current(path) != version:
                    return None
                self._replace_file(path, data)
                if self.is_local:
                    fsync(os.path.dirname(path))
                return data

        try:
            with self._errors(self._url(name)):
                return self._call(swap, f"replace {name}")
        except (FileExistsError, FileNotFoundError):  # 412: another generation, or none
            return None

    def delete_run_file(self, name: str, version: Any) -> bool:
        """Delete file ``name`` only if it still is ``version``; False when it changed or is gone."""
        path = self._run_file_path(name)

        def delete() -> bool:
            if self.is_gcs:
                bucket, key, _ = self.fs.split_path(path)
                found = self.read_run_file(name)
                if found is None or found[1] != version:
                    return False
                self.fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(version))
                self.fs.invalidate_cache(path)
                return True
            with self._run_file_locked(path):
                if self._current(path) != version:
                    return False
                self.fs.rm_file(path)
                return True

        try:
            with self._errors(self._url(name)):
                deleted: bool = self._call(delete, f"delete {name}")
                return deleted
        except (FileExistsError, FileNotFoundError):
            return False

    def _run_file_path(self, name: str) -> str:
        check_name(name)
        return self._path(name)

    def _current(self, path: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

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
            os.close(fd)  # releases the lock

    def _gcs_write(self, path: str, data: bytes, generation: int) -> str:
        """One object write with ``ifGenerationMatch`` (0: only if absent); the new generation.

        gcsfs' pipe_file only offers the create-only precondition, so this sends its multipart
        request with any generation. A mismatch is HTTP 412, which gcsfs raises as FileExistsError.
        """
        from urllib.parse import quote

        bucket, key, _ = self.fs.split_path(path)
        meta = json.dumps({"name": key, "contentType": "application/json"})
        body = (
            "--==0==\nContent-Type: application/json; charset=UTF-8\n\n" + meta
            + "\n--==0==\nContent-Type: application/json\n\n"
        ).encode() + data + b"\n--==0==--"
        answer = self.fs.call(
            "POST", f"{self.fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
            uploadType="multipart", headers={"Content-Type": 'multipart/related; boundary="==0=="'},
            data=body, json_out=True, ifGenerationMatch=str(generation),
        )
        self.fs.invalidate_cache(path)
        return str(answer["generation"])
