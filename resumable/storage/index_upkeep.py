"""Keeping the run index (``index.json``, see `run_index`) in step with the checkpoints.

The index is rewritten after each commit and before each delete (see `commit`). A commit
that cannot update it is still committed (listing then reads its manifest), so that failure
is a warning. A delete that cannot update it does not delete: the index would vouch for a
folder whose manifest is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable

from resumable.core.errors import ResumableError
from resumable.core.manifest import MANIFEST_NAME, Manifest
from resumable.storage import run_index, this_machine
from resumable.storage.folder import RunFolder
from resumable.storage.records import CheckpointInfo, indexed_info
from resumable.storage.run_index import INDEX_NAME, IndexRow

logger = logging.getLogger("resumable")


# The temporary copy `RunFolder.replace_file` writes the index through on a local folder: a writer
# killed between its write and its rename leaves it behind.
_STRAY_COPY = re.compile(re.escape(INDEX_NAME) + r"\.(\d+)\.tmp")


def remove_stray_copies(folder: RunFolder) -> list[str]:
    """Delete the ``index.json.<pid>.tmp`` files that writers gone from this machine left directly
    in a local run folder (that name only; links are never followed nor removed); the names
    deleted. For the writer that has just taken the lease: no other writer runs then."""
    if not folder.is_local:
        return []
    removed = []
    try:
        with os.scandir(folder.root) as entries:
            for entry in entries:
                match = _STRAY_COPY.fullmatch(entry.name)
                if match is None or not entry.is_file(follow_symlinks=False):
                    continue
                pid = int(match.group(1))
                if pid == os.getpid() or this_machine.process_start(pid) != -1:
                    continue  # ours, or a process that still runs here (or one this machine cannot tell)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                removed.append(entry.name)
    except OSError as e:  # a leftover is harmless: never fail a fit's start for it
        logger.info("resumable: could not remove stray index copies in %s: %s", folder.url, e)
    return removed


def read_index(folder: RunFolder) -> dict[str, IndexRow]:
    """The run index's good rows by checkpoint name; {} when it is missing, unusable or too large."""
    blob = folder.read(folder.path(INDEX_NAME), limit=run_index.INDEX_LIMIT)
    return {} if isinstance(blob, Exception) else run_index.decode(blob)


def indexed_infos(folder: RunFolder, rows: dict[str, IndexRow]) -> dict[str, CheckpointInfo]:
    """The checkpoints the index vouches for, by name (``checked=False``)."""
    prefix = folder.url_of("")
    return {name: indexed_info(name, prefix + name, row) for name, row in rows.items()}


class IndexUpkeep:
    """Updates the run index after commits and before deletes, and mends it when it may miss some.

    ``check_folders`` checks folders from their own files and manifests (`Listing.check_folders`).
    """

    def __init__(self, folder: RunFolder, check_folders: Callable[[list[str]], list[CheckpointInfo]]) -> None:
        self._folder = folder
        self._check_folders = check_folders
        # True once this process wrote a whole index: later commits keep it whole themselves
        self._mended = False

    def update(self, add: dict[str, Manifest] | None = None, remove: set[str] | None = None) -> None:
        """Rewrite the index with the committed ``add`` (name: manifest), or without the names ``remove``.

        A commit also mends the index (`mend`) when it may miss checkpoints: at this process'
        first commit (a crash of another process, a run from before the index), when the index
        read is empty or of another version, and after a failed update.
        """
        folder = self._folder
        try:
            with folder.errors(folder.url_of(INDEX_NAME)):
                rows = read_index(folder)
                if remove is not None:
                    if rows.keys().isdisjoint(remove):
                        return
                    for name in remove & rows.keys():
                        del rows[name]
                added = add or {}
                for name, manifest in added.items():
                    rows[name] = run_index.entry(manifest, len(manifest.to_json()))
                mend = bool(added) and (not self._mended or len(rows) <= len(added))
                if mend:
                    self.mend(rows, keep=set(added))
                data = run_index.encode(rows)
                folder.call(lambda: folder.replace_file(folder.path(INDEX_NAME), data), "write index")
                self._mended = self._mended or mend
        except ResumableError as e:
            self._mended = False  # it may now miss a checkpoint: the next commit mends it
            if remove is not None:
                raise
            logger.warning("resumable: could not update the run index (listing reads the manifests): %s", e)

    def delete(self) -> None:
        """Delete the index (every checkpoint deleted: nothing to index); one already gone is fine."""
        folder = self._folder
        with folder.errors(folder.url_of(INDEX_NAME)), contextlib.suppress(FileNotFoundError):
            folder.call(lambda: folder.fs.rm_file(folder.path(INDEX_NAME)), "delete index")
        self._mended = False  # a later commit writes it whole again

    def may_miss(self) -> None:
        """The index may miss a checkpoint now (deletes stopped after its write): the next commit mends it."""
        self._mended = False

    def mend(self, rows: dict[str, IndexRow], keep: set[str]) -> None:
        """Add committed folders the index misses, drop rows whose folder is gone.

        An index misses folders after a crash between a manifest and the index, in a run
        written before the index existed or by another version: without this, every later
        `list` would read those manifests. Costs one listing of the folder names; a run to
        catch up reads the missing manifests once. Rows in ``keep`` (the commit's own) stay
        even if a slow listing does not show their folder yet.
        """
        names = self._folder.folder_names()
        present = set(names) | keep
        for name in [n for n in rows if n not in present]:
            del rows[name]
        for info in self._check_folders([n for n in names if n not in rows]):
            if info.ok and info.manifest is not None:
                rows[info.name] = run_index.entry(info.manifest, info.listed[MANIFEST_NAME].size)
