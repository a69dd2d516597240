"""Durable writes on local disks and mounts (Google Drive's included): fsync, and whole-file creates."""

from __future__ import annotations

import errno
import os
import threading


def create_whole(path: str, data: bytes) -> None:
    """Create ``path`` holding ``data``; FileExistsError if it exists. Never seen half-written."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(temporary, "wb") as f:
        f.write(data)
    fsync(temporary)
    try:
        os.link(temporary, path)  # exclusive, and the content is complete before the name appears
    except FileExistsError:
        raise
    except OSError:  # no hard links (some FUSE mounts): exclusive create, then write
        with open(path, "xb") as f:
            f.write(data)
        fsync(path)
    finally:
        os.unlink(temporary)
    fsync(folder)


def fsync(path: str) -> None:
    """Flush a file or a folder entry to disk; mounts that cannot fsync are let be."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # some mounts cannot fsync
            raise
    finally:
        os.close(fd)
