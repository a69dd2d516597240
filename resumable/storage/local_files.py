"""Local disks and mounts (Google Drive's included): durable writes, and never a step outside the run.

Durable writes: `fsync`, and `create_whole` for small files that must never be seen
half-written (the writer lease).

Never outside the run folder: a run folder may hold a symbolic link (``<run>/ckpt-000003 ->
/elsewhere``, ``model.keras -> ~/model.keras``) or files that share their data with another
name (a ``cp -al`` backup of the run). Below the run folder's root, files are read with
`open_inside` (or after `link_below`, where the read goes through fsspec), emptied and deleted
with `empty_inside`, `check_inside`, `remove_inside` and `remove_folder_inside`, and written
after `clear_for_write` or `make_parents_inside`: each folder on the way is opened with
``O_NOFOLLOW`` (`LinkInRunError` at a link), a link is unlinked rather than what it points at,
a file that has another name is never emptied, and a write always makes a new file. The root
itself may be a link: that is the user's choice of where the run lives.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading

from resumable.core.errors import StorageError

LINK_PROBLEM = "a symbolic link, never followed (a run folder holds its own files: replace it with a copy)"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted in a run must not block an open


class LinkInRunError(StorageError):
    """A symbolic link (or a ``..``) below a run folder's root, where resumable expects its own file."""


# ---------------------------------------------------------------------- durable writes


def create_whole(path: str, data: bytes) -> None:
    """Create ``path`` holding ``data``; FileExistsError if it exists. Never seen half-written.

    Any failure after the name appeared (a mount's EIO on fsync) removes it again before
    raising: its bytes may never reach the disk, and a retry must create it afresh.
    """
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    created: os.stat_result | None = None
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        fsync(temporary)
        try:
            os.link(temporary, path)  # exclusive, and the content is complete before the name appears
            created = os.stat(temporary)
        except FileExistsError:
            raise
        except OSError:  # no hard links (some FUSE mounts): exclusive create, then write (lease.TORN_GRACE)
            with open(path, "xb") as f:
                created = os.fstat(f.fileno())
                f.write(data)
            fsync(path)
        fsync(folder)
    except BaseException:
        if created is not None:
            _unlink_if_same(path, created)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def fsync(path: str) -> None:
    """Flush a file or a folder entry to disk; mounts that cannot fsync are let be.

    EIO and every other error raise: on Drive's mount a failed fsync is a failed upload.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        _fsync_fd(fd)
    finally:
        os.close(fd)


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # some mounts cannot fsync
            raise


def sync_inside(root: str, path: str, *, drop_cached: bool = False) -> os.stat_result:
    """`fsync` a file below ``root``, opened without following a link (LinkInRunError); its stat.

    ``drop_cached``: then let the kernel drop the file's pages from its cache. A checkpoint's
    files are read back by a later session, if ever; kept cached, they make the kernel reclaim
    memory before it can take the next checkpoint's bytes (on this machine a write of 287 MB into
    a new file took 0.8 s that way, 0.07 s with pages at hand: docs/benchmarks.md).
    """
    fd = open_inside(root, path)
    try:
        found = os.fstat(fd)
        _fsync_fd(fd)
        advise = getattr(os, "posix_fadvise", None)  # not on macOS or Windows
        if drop_cached and advise is not None:
            with contextlib.suppress(OSError):  # advice only (a FUSE mount may not take it)
                advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return found
    finally:
        os.close(fd)


def _unlink_if_same(path: str, created: os.stat_result) -> None:
    """Remove ``path`` if it still is the file we created (not one a contender put there since)."""
    with contextlib.suppress(OSError):
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (created.st_dev, created.st_ino):
            os.unlink(path)


# ---------------------------------------------------------------------- never outside the run


def open_inside(root: str, path: str, flags: int = os.O_RDONLY) -> int:
    """A file descriptor of ``path``, opened without following a link anywhere below ``root``.

    LinkInRunError at a symbolic link (the file itself or a folder on the way).
    """
    parent, name = _parent_fd(root, path, make=False)
    try:
        return _open_at(parent, name, flags | _NOFOLLOW, path)
    finally:
        os.close(parent)


def read_inside(root: str, path: str) -> bytes:
    """The bytes of ``path``, read without following a link below ``root``."""
    with os.fdopen(open_inside(root, path), "rb") as f:
        return f.read()


def is_plain_file(root: str, path: str) -> bool:
    """True for a regular file reached without links below ``root`` and with no other name."""
    try:
        fd = open_inside(root, path, os.O_RDONLY | _NONBLOCK)
    except OSError:
        return False
    try:
        found = os.fstat(fd)
    finally:
        os.close(fd)
    return stat.S_ISREG(found.st_mode) and found.st_nlink == 1


def link_below(root: str, path: str) -> bool:
    """True when ``path`` or a folder between ``root`` and it is a symbolic link."""
    if path.rstrip("/") == root.rstrip("/"):
        return False
    current = root
    for part in _parts(root, path):
        current = os.path.join(current, part)
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return True
        except (FileNotFoundError, NotADirectoryError):
            return False
    return False


def make_parents_inside(root: str, path: str) -> None:
    """Create the folders between ``root`` and ``path``; LinkInRunError if one of them is a link."""
    os.close(_parent_fd(root, path, make=True)[0])


def clear_for_write(root: str, path: str) -> None:
    """Make ``path``'s folders and remove what is at ``path``: the next write creates a new file.

    Writing through a link would change a file outside the run, and rewriting a file in place
    would change the other names of a hard link (a ``cp -al`` backup of the run).
    """
    parent, name = _parent_fd(root, path, make=True)
    try:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def empty_inside(root: str, path: str) -> None:
    """Empty ``path`` before it is deleted (Google Drive's trash keeps deleted files and counts
    them against the quota), but only a regular file with no other name: truncating a hard
    link would empty the other names too, a ``cp -al`` backup of the run among them. A link is
    left as it is; LinkInRunError when a folder on the way is one.
    """
    parent, name = _parent_fd(root, path, make=False)
    try:
        _truncate_own(parent, name)
    finally:
        os.close(parent)


def check_inside(root: str, path: str) -> None:
    """LinkInRunError when a folder between ``root`` and ``path`` is a link (FileNotFoundError if gone)."""
    os.close(_parent_fd(root, path, make=False)[0])


def remove_inside(root: str, path: str, *, truncate: bool) -> None:
    """Delete ``path`` (a link: the link alone); gone already is fine.

    ``truncate`` first empties it (Google Drive's trash keeps deleted files and counts them
    against the quota), but only a regular file with no other name: truncating a hard link
    would empty the other names too, a ``cp -al`` backup of the run among them.
    """
    try:
        parent, name = _parent_fd(root, path, make=False)
    except FileNotFoundError:
        return
    try:
        if truncate:
            _truncate_own(parent, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def remove_folder_inside(root: str, path: str) -> None:
    """Remove the folder ``path`` and what is left in it; a link there is unlinked, never followed."""
    try:
        parent, name = _parent_fd(root, path, make=False)
    except FileNotFoundError:
        return
    try:
        found = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(path, ignore_errors=True)  # unlinks the links it meets, never follows them
        else:
            os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        pass
    finally:
        os.close(parent)


def _truncate_own(parent: int, name: str) -> None:
    try:
        fd = os.open(name, os.O_WRONLY | _NOFOLLOW | _NONBLOCK, dir_fd=parent)
    except OSError:  # a link (ELOOP), a FIFO without a reader, a folder: nothing of ours to empty
        return
    try:
        found = os.fstat(fd)
        if stat.S_ISREG(found.st_mode) and found.st_nlink == 1:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _parts(root: str, path: str) -> list[str]:
    root = root.rstrip("/") or "/"
    prefix = root if root.endswith("/") else root + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not under {root}")
    parts = [p for p in path[len(prefix):].split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise LinkInRunError(f"{path}: not a file inside the run folder {root}")
    return parts


def _parent_fd(root: str, path: str, *, make: bool) -> tuple[int, str]:
    """An open descriptor of ``path``'s folder, reached below ``root`` without links, and its name."""
    *folders, name = _parts(root, path)
    if make:
        os.makedirs(root, exist_ok=True)  # a new run folder
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)  # the root may be a link: the user's choice
    try:
        for part in folders:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            child = _open_at(fd, part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, path)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _open_at(parent: int, name: str, flags: int, path: str) -> int:
    try:
        return os.open(name, flags, 0o666, dir_fd=parent)
    except OSError as e:
        # O_NOFOLLOW answers ELOOP at a link; with O_DIRECTORY, a link to a folder answers ENOTDIR
        if e.errno == errno.ELOOP or e.errno == errno.ENOTDIR and _is_link(parent, name):
            raise LinkInRunError(f"{path}: {LINK_PROBLEM}") from None
        raise


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False
