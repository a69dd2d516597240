"""What a listing says of each checkpoint folder, and the check of its files against its manifest."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from resumable.core.display import human_size, printable
from resumable.core.errors import CorruptCheckpointError
from resumable.core.manifest import MANIFEST_LIMIT, MANIFEST_NAME, UNUSABLE, FileEntry, Manifest
from resumable.storage.local_files import LINK_PROBLEM
from resumable.storage.run_index import IndexRow


class Status(str, Enum):
    """Whether a checkpoint can be restored."""

    OK = "ok"
    PARTIAL = "partial"  # no manifest: a commit that never finished
    CORRUPT = "corrupt"  # a manifest that is unreadable or disagrees with the files

    def __str__(self) -> str:
        return self.value


class ListedFile(NamedTuple):  # a tuple: `list` makes one per file of every checkpoint
    """A file as a listing shows it."""

    size: int
    crc32c: str | None  # only where the listing carries it (GCS)
    modified: datetime | None
    link: bool = False  # a symbolic link (local listings): never read, so never part of a good checkpoint


@dataclass(frozen=True, init=False)
class CheckpointInfo:
    """One checkpoint folder as found in the run folder.

    An info the run index vouches for (`indexed_info`: ``index_row`` given, ``checked=False``)
    answers `epoch`, `step`, `metrics`, `size` and `created_iso` from its `IndexRow`, and builds
    ``manifest`` and ``listed`` from it when first read (`__getattr__`): `resumable list` shows
    thousands of them and needs neither. Hence the hand-written ``__init__``; the dataclass
    still compares, prints and copies (`dataclasses.replace`) it as an info built with those
    values, and a copy keeps no row.
    """

    name: str
    url: str
    status: Status
    manifest: Manifest | None
    problem: str
    listed: dict[str, ListedFile] = field(repr=False)
    # False when the status and ``listed`` come from the run index, not from a listing of the folder
    checked: bool
    if TYPE_CHECKING:  # set by __init__, not fields
        size: int  # bytes stored in the folder (as the run index records them when not ``checked``)
        _index_row: IndexRow | None
    _index_row = None  # the run index row an indexed info answers from

    def __init__(self, name: str, url: str, status: Status, manifest: Manifest | None = None,
                 problem: str = "", listed: dict[str, ListedFile] | None = None, checked: bool = True,
                 index_row: IndexRow | None = None) -> None:
        _set(self, "name", name)
        _set(self, "url", url)
        _set(self, "status", status)
        _set(self, "problem", problem)
        _set(self, "checked", checked)
        if index_row is None:
            listed = {} if listed is None else listed
            _set(self, "manifest", manifest)
            _set(self, "listed", listed)
            _set(self, "size", sum(f.size for f in listed.values()))
        else:  # `__getattr__` builds ``manifest`` and ``listed`` from the row when first read
            _set(self, "_index_row", index_row)
            _set(self, "size", index_row.size)

    def __getattr__(self, name: str) -> Any:
        """Only reached for ``manifest`` or ``listed`` of an indexed info not read yet."""
        row = self._index_row
        if row is None or name not in ("manifest", "listed"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = row.manifest() if name == "manifest" else _recorded_files(row)
        _set(self, name, value)
        return value

    @property
    def ok(self) -> bool:
        return self.status is _OK

    # Listings read these for every checkpoint: an indexed info answers from its row, without
    # building its manifest.

    @property
    def epoch(self) -> int | None:
        row = self._index_row
        if row is not None:
            return row.epoch
        return self.manifest.epoch if self.manifest else None

    @property
    def step(self) -> int | None:
        row = self._index_row
        if row is not None:
            return row.step
        return self.manifest.step if self.manifest else None

    @property
    def batch(self) -> int | None:
        """Batches into the next epoch: > 0 for a mid-epoch save, 0 at an epoch's end (for retention)."""
        row = self._index_row
        if row is not None:
            return row.batch
        return self.manifest.batch if self.manifest else None

    @property
    def metrics(self) -> dict[str, float]:
        """The manifest's metrics (not a copy)."""
        row = self._index_row
        if row is not None:
            return row.metrics
        return self.manifest.metrics if self.manifest else {}

    @property
    def created(self) -> datetime | None:
        recorded = self.manifest.created_at if self.manifest else None
        if recorded:
            return recorded
        times = [f.modified for f in self.listed.values() if f.modified]
        return max(times) if times else None

    @property
    def created_iso(self) -> str | None:
        """`created` as text: the manifest's ISO 8601 string as recorded (UTC), when it has one."""
        row = self._index_row
        if row is not None and row.created:
            return row.created
        if self.manifest and self.manifest.created:
            return self.manifest.created
        moment = self.created
        return moment.isoformat() if moment else None


_set = object.__setattr__  # how a frozen dataclass sets its own fields
_OK = Status.OK  # `ok` is read for every checkpoint, and looking a member up on its Enum class is slow


def checked_info(name: str, url: str, listed: dict[str, ListedFile], blob: bytes | Exception | None
                 ) -> CheckpointInfo:
    """A folder's status from its listed files and its manifest's bytes (None: no manifest).

    Problems are `printable`: they quote names from the run folder, and end up on terminals.
    """
    stored = listed.get(MANIFEST_NAME)
    if stored is not None and stored.size > MANIFEST_LIMIT:  # never read (`manifest_readable`)
        problem = (f"manifest is {human_size(stored.size)}, larger than any real one "
                   f"(at most {human_size(MANIFEST_LIMIT)}); {UNUSABLE}")
        return CheckpointInfo(name, url, Status.CORRUPT, None, problem, listed)
    if blob is None or isinstance(blob, FileNotFoundError):
        return CheckpointInfo(name, url, Status.PARTIAL, None, "no manifest (an interrupted save)", listed)
    if isinstance(blob, Exception):
        return CheckpointInfo(name, url, Status.CORRUPT, None, printable(f"manifest unreadable: {blob}"),
                              listed)
    try:
        manifest = Manifest.from_json(blob, "")
    except CorruptCheckpointError as e:  # "": the message without a place, which the info names
        return CheckpointInfo(name, url, Status.CORRUPT, None, printable(str(e).removeprefix(": ")), listed)
    problems = []
    for rel, entry in manifest.files.items():
        found = listed.get(rel)
        if found is None:
            problems.append(f"{rel} missing")
        elif found.link:
            problems.append(f"{rel} is {LINK_PROBLEM}")
        elif found.size != entry.size:
            problems.append(f"{rel} has {found.size} bytes, manifest says {entry.size}")
        elif found.crc32c is not None and found.crc32c != entry.crc32c:
            problems.append(f"{rel} crc32c {found.crc32c}, manifest says {entry.crc32c}")
    if not problems:  # the usual case: nothing to make printable
        return CheckpointInfo(name, url, Status.OK, manifest, "", listed)
    return CheckpointInfo(name, url, Status.CORRUPT, manifest, printable("; ".join(problems)), listed)


def manifest_readable(files: dict[str, ListedFile]) -> bool:
    """True when a folder's listing shows a manifest small enough to read (see `checked_info`)."""
    found = files.get(MANIFEST_NAME)
    return found is not None and found.size <= MANIFEST_LIMIT


def indexed_info(name: str, url: str, row: IndexRow) -> CheckpointInfo:
    """A good checkpoint as the run index vouches for it, without looking at its folder."""
    return CheckpointInfo(name, url, _OK, None, "", None, False, row)


def _recorded_files(row: IndexRow) -> dict[str, ListedFile]:
    """The files of an indexed checkpoint as the index records them, its manifest included."""
    listed = {rel: ListedFile(size, crc32c, None) for rel, (size, crc32c) in row.files.items()}
    listed[MANIFEST_NAME] = ListedFile(row.manifest_size, None, None)
    return listed


def committed_info(name: str, url: str, manifest: Manifest) -> CheckpointInfo:
    """The checkpoint a commit just wrote, its files as sent."""
    listed = {rel: ListedFile(entry.size, entry.crc32c, None) for rel, entry in manifest.files.items()}
    return CheckpointInfo(name, url, Status.OK, manifest, listed=listed)


def mismatch(expected: FileEntry, actual: FileEntry) -> str:
    """How a stored file differs from its manifest entry, in a few words."""
    if expected.size != actual.size:
        return f"size {actual.size} bytes, manifest says {expected.size}"
    return f"crc32c {actual.crc32c}, manifest says {expected.crc32c}"
