"""Is Google Drive mounted? A run folder under ``/content/drive/`` must be on the Drive mount.

In Colab, ``/content/drive`` is where ``drive.mount('/content/drive')`` mounts Google Drive.
After a disconnect the new VM has no mount until that cell runs again; a run folder under
``/content/drive/MyDrive/...`` is then an ordinary folder on the VM's own disk: no checkpoint
would be found, a new run would start there, and it would vanish with the VM. So a local run
folder under `DRIVE_ROOT` is refused with one line (`DriveNotMountedError`) unless a mount
point covers it.

The mount points are read from `MOUNTINFO` (``/proc/self/mountinfo``); where that file cannot
be read (not Linux), ``os.path.ismount`` answers for `DRIVE_ROOT`. Both are arguments (and
`MOUNTINFO` is read at each call), so a test fakes what the check reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from resumable.core.errors import DriveNotMountedError

DRIVE_ROOT = "/content/drive"
MOUNTINFO = "/proc/self/mountinfo"

_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


def mount_points(mountinfo: str | None = None) -> set[str] | None:
    """Every mount point listed in ``mountinfo`` (default `MOUNTINFO`), or None when it cannot be read."""
    try:
        with open(mountinfo or MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    points = set()
    for line in lines:
        fields = line.split()
        if len(fields) > 4:  # id, parent, major:minor, root, mount point, ...
            points.add(_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def under_drive(path: str, drive_root: str = DRIVE_ROOT) -> bool:
    """Whether the local ``path`` lies under ``drive_root`` (``/content/drive/...``)."""
    full = os.path.abspath(path)
    return full == drive_root or full.startswith(drive_root + "/")


def drive_mounted(path: str, *, drive_root: str = DRIVE_ROOT, mountinfo: str | None = None,
                  ismount: Callable[[str], bool] | None = None) -> bool:
    """Whether a mount point at or under ``drive_root`` holds ``path``."""
    full = os.path.abspath(path)
    points = mount_points(mountinfo)
    if points is None:
        return (ismount or os.path.ismount)(drive_root)
    return any(under_drive(point, drive_root) and (full == point or full.startswith(point + "/"))
               for point in points)


def check_drive_mounted(url: str, path: str, *, drive_root: str = DRIVE_ROOT, mountinfo: str | None = None,
                        ismount: Callable[[str], bool] | None = None) -> None:
    """Raise DriveNotMountedError when the local ``path`` (of run folder ``url``) is under
    ``drive_root`` but Google Drive is not mounted there."""
    if under_drive(path, drive_root) and not drive_mounted(path, drive_root=drive_root, mountinfo=mountinfo,
                                                           ismount=ismount):
        raise DriveNotMountedError(
            f"{url}: Google Drive is not mounted at {drive_root}; run `from google.colab import drive; "
            f"drive.mount('{drive_root}')` first (without it this folder would be on this VM's own disk, "
            "and a new run started there would vanish with the VM)"
        )


__all__ = ["DRIVE_ROOT", "MOUNTINFO", "check_drive_mounted", "drive_mounted", "mount_points", "under_drive"]
