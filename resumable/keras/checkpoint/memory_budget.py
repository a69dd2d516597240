"""How much host memory a save may hold beyond what training holds (#54): the ``snapshot_memory``
argument, and the memory left to the process when a save starts.

A save within its budget is copied to host memory and written in the background, as always; one
over it is written while training waits, one variable at a time (`snapshot.take`), so that a VM
with little memory to spare never kills training at a save where Keras' own ``save_weights``
fits. ``"auto"`` (the default) allows `AUTO_FRACTION` of the memory left when the save starts:
the memory cgroup's limit less its usage where the process runs in one (a container, a Colab
runtime), never more than the system's ``MemAvailable``. Where neither can be read (not Linux),
"auto" sets no budget: every save is copied, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
AUTO_FRACTION = 0.5  # of the memory left: the rest stays for training's own growth and the page cache
_NO_LIMIT = 2**60  # cgroup v1 says "no limit" with a number near 2**63


@dataclass(frozen=True)
class SnapshotMemory:
    """The ``snapshot_memory`` argument: bytes a save may copy to host memory, or ``"auto"``.

    Args:
        setting: An int >= 0 (0: every save is written while training waits, one variable at a
            time), or ``"auto"``: half the memory left to the process when the save starts.
            Defaults to "auto".
    """

    setting: int | str = AUTO

    def __post_init__(self) -> None:
        value = self.setting
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return
        raise ValueError(
            f"Invalid value for argument `snapshot_memory`. Received: snapshot_memory={value!r}. "
            "Expected 'auto' or a number of bytes >= 0 (0 writes every save while training waits)."
        )

    def budget(self, root: Path = Path("/")) -> int | None:
        """The bytes this save may hold now; None: no limit known (every save is copied)."""
        if isinstance(self.setting, int):
            return self.setting
        left = memory_left(root)
        return None if left is None else int(left * AUTO_FRACTION)


def memory_left(root: Path = Path("/")) -> int | None:
    """Bytes this process may still take: the least of its memory cgroups' room (each limit less
    its usage, the kernel's reclaimable file pages not counted as used) and ``MemAvailable``;
    None where neither can be read. ``root``: where ``/proc`` and ``/sys`` are (tests)."""
    rooms = [room for room in (_system_available(root), *_cgroup_rooms(root)) if room is not None]
    return max(0, min(rooms)) if rooms else None


def _system_available(root: Path) -> int | None:
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_rooms(root: Path) -> list[int | None]:
    """The room left in each memory cgroup this process is in, and in each of their parents (a
    parent's limit binds its children too)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    rooms: list[int | None] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and parts[0] == "0":  # v2: one unified hierarchy
            rooms += _rooms_along(root / "sys/fs/cgroup", path, "memory.max", "memory.current",
                                  "inactive_file")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            rooms += _rooms_along(root / "sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
                                  "memory.usage_in_bytes", "total_inactive_file")
    return rooms


def _rooms_along(mount: Path, path: str, limit_file: str, usage_file: str,
                 inactive_key: str) -> list[int | None]:
    rooms: list[int | None] = []
    folder = mount / path.strip("/")
    while True:
        rooms.append(_room(folder, limit_file, usage_file, inactive_key))
        if folder == mount or mount not in folder.parents:
            return rooms
        folder = folder.parent


def _room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """The cgroup's limit less its usage; None without a limit or files to read."""
    try:
        limit_text = (folder / limit_file).read_text().strip()
        if limit_text == "max" or int(limit_text) >= _NO_LIMIT:
            return None
        usage = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    return int(limit_text) - max(0, usage - _stat(folder, inactive_key))


def _stat(folder: Path, key: str) -> int:
    """One counter of the cgroup's memory.stat; 0 if absent."""
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


__all__ = ["AUTO", "AUTO_FRACTION", "SnapshotMemory", "memory_left"]
