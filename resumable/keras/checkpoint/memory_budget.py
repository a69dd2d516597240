"""How much host memory a save may hold beyond what training holds (#54): the ``snapshot_memory``
argument, and the memory left to the process when a save starts.

A save within its budget is copied to host memory and written in the background, as always. Over
a budget of a number of bytes, the variables that fit are copied and the rest is written while
training waits, one variable (or slice) at a time (`snapshot.take`), so that a VM with little
memory to spare never kills training at a save where Keras' own ``save_weights`` fits.
``"auto"`` (the default) allows `AUTO_FRACTION` of the memory left when the save starts, all
or nothing: the memory cgroup's limit less its usage (and its peak usage) where the process runs
in one (a container, a Colab runtime; its clean inactive file pages counted as free), never
more than the system's ``MemAvailable``, less how far the process' resident set has been above
where it is now (training between two steps is below its own peak, and gets back there while a
copy is held). Where neither can be read (not Linux), "auto" sets no budget: every save is
copied, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
AUTO_FRACTION = 0.5  # of the memory left: the rest stays for training's own growth and the page cache
_NO_LIMIT = 2**60  # cgroup v1 says "no limit" with a number near 2**63
# a cgroup's limit, usage and peak usage; memory.stat's clean-or-not inactive file pages
_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes")
_V1_KEYS = ("total_inactive_file", "total_dirty", "total_writeback")
_V2_FILES = ("memory.max", "memory.current", "memory.peak")
_V2_KEYS = ("inactive_file", "file_dirty", "file_writeback")


@dataclass(frozen=True)
class SnapshotMemory:
    """The ``snapshot_memory`` argument: bytes a save may copy to host memory, or ``"auto"``.

    Args:
        setting: An int >= 0 (what fits is copied, the rest written while training waits, one
            variable at a time; 0: every save), or ``"auto"``: half the memory left to the
            process when the save starts, all or nothing. Defaults to "auto".
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

    @property
    def copies_part(self) -> bool:
        """Whether a save over the budget copies the part that fits: with a number of bytes the
        user chose; "auto" copies all or nothing, since no reading of the memory left between
        two steps knows how high training will go while the copy is held (`_room`)."""
        return isinstance(self.setting, int)

    def budget(self, root: Path = Path("/")) -> int | None:
        """The bytes this save may hold now; None: no limit known (every save is copied)."""
        if isinstance(self.setting, int):
            return self.setting
        left = memory_left(root)
        return None if left is None else int(left * AUTO_FRACTION)


def memory_left(root: Path = Path("/")) -> int | None:
    """Bytes this process may still take: the least of its memory cgroups' room (each limit less
    its usage, clean inactive file pages not counted as used) and ``MemAvailable``, less the
    process' peak resident set over its current one (`_regrowth`);
    None where neither can be read. ``root``: where ``/proc`` and ``/sys`` are (tests)."""
    rooms = [room for room in (_system_available(root), *_cgroup_rooms(root)) if room is not None]
    return max(0, min(rooms) - _regrowth(root)) if rooms else None


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
            rooms += _rooms_along(root / "sys/fs/cgroup", path, _V2_FILES, _V2_KEYS)
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            rooms += _rooms_along(root / "sys/fs/cgroup/memory", path, _V1_FILES, _V1_KEYS)
    return rooms


def _rooms_along(mount: Path, path: str, usage_files: tuple[str, str, str],
                 file_keys: tuple[str, str, str]) -> list[int | None]:
    rooms: list[int | None] = []
    folder = mount / path.strip("/")
    while True:
        rooms.append(_room(folder, usage_files, file_keys))
        if folder == mount or mount not in folder.parents:
            return rooms
        folder = folder.parent


def _room(folder: Path, usage_files: tuple[str, str, str], file_keys: tuple[str, str, str]) -> int | None:
    """The cgroup's limit less its usage, its clean inactive file pages not counted as used (the
    kernel drops those at once; dirty ones wait for the disk), and never more than its limit
    less its peak usage, where the kernel keeps one; None without a limit.

    A reading between two steps sees training below its own peak, and a copy held while
    training goes on must leave room for it to get back there: in tests/keras/test_memory_cgroup.py's
    cgroup (a quarter of the checkpoint to spare at plain training's peak) a save read 0.85x the
    checkpoint left, copied 0.42x, and the process was killed."""
    limit_file, usage_file, peak_file = usage_files
    try:
        limit_text = (folder / limit_file).read_text().strip()
        if limit_text == "max" or int(limit_text) >= _NO_LIMIT:
            return None
        usage = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        peak = int((folder / peak_file).read_text().strip())
    except (OSError, ValueError):
        peak = 0
    inactive, dirty, writeback = (_stat(folder, key) for key in file_keys)
    return int(limit_text) - max(usage - max(0, inactive - dirty - writeback), peak, 0)


def _regrowth(root: Path) -> int:
    """How far this process' resident set has been above where it is now (``VmHWM`` less
    ``VmRSS``): a save between two steps sees training below its own peak, and a copy held
    while training goes on must leave room for training to get back there."""
    try:
        fields = dict(line.split(":", 1) for line in (root / "proc/self/status").read_text().splitlines()
                      if ":" in line)
        return max(0, (int(fields["VmHWM"].split()[0]) - int(fields["VmRSS"].split()[0])) * 1024)
    except (OSError, ValueError, KeyError, IndexError):
        return 0


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
