"""A folder of single model files and their checksum records: what `resumable.ModelCheckpoint`
and `resumable.save_model` write (``best.keras`` beside ``.best.keras.resumable.json``).

`list_model_files` makes one listing of the folder and reads every record at once; each file
gets a status from its record and the listing (the listed size, and on GCS the CRC32C, against
the record), as `resumable list` judges a run's checkpoints. `ModelFile.verify` re-reads the
file. The temporary copies a writer makes beside a file (``.<name>.<pid>.partial``, and
``.<record>.<pid>.tmp``) are never files of the folder: a killed writer's are named in
`FileFolder.leftovers` and removed by the next save of that name.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resumable.core.display import printable
from resumable.core.errors import CorruptCheckpointError
from resumable.core.naming import is_plain_name
from resumable.storage.folder import RunFolder, listed_file
from resumable.storage.records import ListedFile
from resumable.storage.single_file import (
    RECORD_LIMIT,
    RECORD_SUFFIX,
    FileRecord,
    FileTarget,
    leftover_owner,
    record_name,
)

MODEL_FILE_SUFFIXES = (".keras", ".h5", ".hdf5")  # ``.weights.h5`` ends in ``.h5``

OK, CORRUPT, UNRECORDED = "ok", "corrupt", "unrecorded"


@dataclass(frozen=True)
class ModelFile:
    """One model file of the folder: its listing, its record, and whether they agree."""

    name: str
    url: str
    status: str  # OK, CORRUPT (the file disagrees with its record, or is missing), UNRECORDED
    problem: str
    listed: ListedFile | None  # None: the record names a file that is not there
    record: FileRecord | None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def details(self) -> dict[str, Any]:
        return self.record.details if self.record is not None else {}

    @property
    def epoch(self) -> int | None:
        return _int(self.details.get("epoch"))

    @property
    def batch(self) -> int:
        """The batch of the epoch the file was saved at; 0 at an epoch's end (for ranking)."""
        return _int(self.details.get("batch")) or 0

    @property
    def step(self) -> int | None:
        return _int(self.details.get("step"))

    @property
    def metrics(self) -> dict[str, float]:
        metrics = self.details.get("metrics")
        if not isinstance(metrics, dict):
            return {}
        return {k: float(v) for k, v in metrics.items()
                if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)}

    @property
    def size(self) -> int:
        if self.listed is not None:
            return self.listed.size
        return self.record.size if self.record is not None else 0

    @property
    def saved(self) -> datetime.datetime | None:
        """When it was saved: the record says, else the listing's modification time."""
        text = self.details.get("saved_at")
        if isinstance(text, str):
            try:
                when = datetime.datetime.fromisoformat(text)
            except ValueError:
                when = None
            if when is not None and when.tzinfo is not None:
                return when
        return self.listed.modified if self.listed is not None else None

    @property
    def created_iso(self) -> str | None:
        when = self.saved
        return when.astimezone(datetime.timezone.utc).isoformat(timespec="seconds") if when else None

    def order(self) -> tuple[float, int, int, int, str]:
        """Oldest first: by save time, then optimizer step, epoch, batch, name."""
        when = self.saved
        return (when.timestamp() if when else 0.0, self.step if self.step is not None else -1,
                self.epoch if self.epoch is not None else -1, self.batch, self.name)

    def verify(self) -> list[str]:
        """Re-read the stored file and compare it with its record: the problems found (none: it matches)."""
        if self.record is None:
            return []
        try:
            FileTarget(self.url, storage_options=dict(self.storage_options or {})).verify()
        except CorruptCheckpointError as e:
            return [printable(str(e))]
        return []


@dataclass(frozen=True)
class FileFolder:
    """The model files of one folder, oldest first, and the leftovers of interrupted writes."""

    url: str
    files: list[ModelFile]
    leftovers: list[str]  # temporary copies of killed writers (names)
    folders: list[str] = field(default_factory=list)  # the folders beside them (names): Orbax's steps


def list_model_files(url: str, *, storage_options: dict[str, Any] | None = None) -> FileFolder:
    """The model files of the folder ``url`` and their records: one listing, the records read at once."""
    folder = RunFolder(url, storage_options=storage_options)
    with folder.errors(folder.url):
        if folder.is_gcs:
            folder.fs.invalidate_cache(folder.root)  # another process may have written since
        try:
            entries = folder.call(lambda: folder.fs.ls(folder.root, detail=True), "list")
        except FileNotFoundError:
            entries = []
    listed: dict[str, ListedFile] = {}
    folders: list[str] = []
    for entry in entries:
        if entry.get("type") == "directory":
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            folders.extend([name] if is_plain_name(name) and not entry.get("islink") else [])
            continue
        name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        listed[name] = listed_file(entry)
    found = _classify(folder, listed, storage_options)
    return FileFolder(found.url, found.files, found.leftovers, folders)


def holds_model_files(folder: FileFolder) -> bool:
    return bool(folder.files or folder.leftovers)


def _classify(folder: RunFolder, listed: dict[str, ListedFile],
              storage_options: dict[str, Any] | None) -> FileFolder:
    records: dict[str, str] = {}  # file name -> record name
    leftovers: list[str] = []
    models: set[str] = set()
    for name in listed:
        if leftover_owner(name) is not None:
            leftovers.append(name)
        elif name.startswith(".") and name.endswith(RECORD_SUFFIX):
            records[name[1: -len(RECORD_SUFFIX)]] = name
        elif not name.startswith(".") and name.endswith(MODEL_FILE_SUFFIXES):
            models.add(name)
    readable = [n for n in records.values() if listed[n].size <= RECORD_LIMIT and not listed[n].link]
    data = folder.read_many([folder.path(n) for n in readable]) if readable else {}
    files = []
    for name in sorted(models | set(records)):
        url = folder.url_of(name)
        file = listed.get(name)
        record_file = records.get(name)
        if record_file is None and file is not None and file.link:
            files.append(ModelFile(name, url, CORRUPT, "the file is a symbolic link: never read through",
                                   file, None, storage_options))
            continue
        if record_file is None:
            files.append(ModelFile(name, url, UNRECORDED, "no checksum record (written by Keras, or its "
                                   "writer was killed before the record)", file, None, storage_options))
            continue
        record, problem = _record(folder, record_file, listed[record_file], data, url)
        if file is not None and file.link:
            record, problem = None, "the file is a symbolic link: never read through"
        elif record is not None:
            problem = _disagreement(record, file)
        status = OK if not problem else CORRUPT
        files.append(ModelFile(name, url, status, problem, file, record, storage_options))
    files.sort(key=ModelFile.order)
    return FileFolder(folder.url, files, sorted(leftovers))


def _record(folder: RunFolder, record_file: str, listed: ListedFile, data: dict[str, bytes | Exception],
            url: str) -> tuple[FileRecord | None, str]:
    if listed.link:
        return None, f"its record {record_file} is a link"
    if listed.size > RECORD_LIMIT:
        return None, f"its record {record_file} is {listed.size} bytes, over {RECORD_LIMIT}"
    value = data.get(folder.strip(folder.path(record_file)))
    if not isinstance(value, bytes):
        return None, f"its record {record_file} could not be read ({printable(str(value))})"
    try:
        return FileRecord.from_json(value, url), ""
    except CorruptCheckpointError as e:
        return None, printable(str(e))


def _disagreement(record: FileRecord, file: ListedFile | None) -> str:
    """What the listing shows that the record does not vouch for; empty when they agree."""
    if file is None:
        return f"missing; its record {record_name(record.name)} says {record.size} bytes"
    entries = [record] if record.previous is None else [record, record.previous]
    for entry in entries:
        if file.size == entry.size and (file.crc32c is None or file.crc32c == entry.crc32c):
            return ""
    if all(file.size != entry.size for entry in entries):
        return f"{file.size} bytes, its record says {record.size}"
    return f"CRC32C {file.crc32c}, its record says {record.crc32c}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = ["CORRUPT", "MODEL_FILE_SUFFIXES", "OK", "UNRECORDED", "FileFolder", "ModelFile",
           "holds_model_files", "list_model_files"]
