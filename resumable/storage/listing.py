"""Which checkpoints a run folder holds and in what state: listed, newest first, or one by name."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

from resumable.core.display import printable
from resumable.core.manifest import MANIFEST_LIMIT, MANIFEST_NAME
from resumable.core.naming import NameTemplate, check_name
from resumable.storage import gcs_listing, gcsfs_compat, run_index
from resumable.storage.folder import RunFolder
from resumable.storage.index_upkeep import indexed_infos, read_index
from resumable.storage.local_files import LINK_PROBLEM
from resumable.storage.records import CheckpointInfo, ListedFile, Status, checked_info, manifest_readable
from resumable.storage.retry import deadline_in

logger = logging.getLogger("resumable")

QUICK_FALLBACK_FOLDERS = 8  # more folders missing from the run index: one recursive listing instead


class Listing:
    """The checkpoints of one run folder, ordered by the manifests' (epoch, step), then by name.

    ``template`` orders folders without a readable manifest (partial ones) by their names.
    """

    def __init__(self, folder: RunFolder, template: NameTemplate) -> None:
        self._folder = folder
        self.template = template
        self._said: set[tuple[str, str]] = set()  # (name, problem) warned about: once per run folder object

    def full(self) -> list[CheckpointInfo]:
        """Every folder, its files checked against its manifest.

        One recursive listing, then every manifest read at once.
        """
        listing = self._folder.listing()
        infos = self._checked(listing, sorted(listing))
        return sorted(infos, key=self.order)

    def quick(self) -> list[CheckpointInfo]:
        """Checkpoints from one listing of folder names plus the run index: two requests.

        Folders the index misses, or rows with a bad value, are checked from their own files.
        """
        names, indexed = self._names_and_index()
        infos = [indexed[name] for name in names if name in indexed]
        infos += self.check_folders([name for name in names if name not in indexed])
        return sorted(infos, key=self.order)

    def newest_first(self) -> Iterator[CheckpointInfo]:
        """Good checkpoints, newest first; a folder is listed and its manifest read only when reached.

        One listing of the folder names orders them (by the name template; folders named
        otherwise by their manifests, read first). Then each folder is checked in turn, newest
        first, so the newest good checkpoint costs two more requests however long the run: a
        resume stops there. After `QUICK_FALLBACK_FOLDERS` folders, one recursive listing
        serves the rest. Newer partial or corrupt checkpoints that are skipped are logged as
        warnings; partial folders older than the newest committed one (leftovers of
        interrupted saves) in one info line, once the walk went past them all.
        """
        names = self._folder.folder_names()
        keys: dict[str, tuple[int, int]] = {}
        unparsed = []
        for name in names:
            key = self.template.parse(name)
            if key is None:
                unparsed.append(name)
            else:
                keys[name] = key
        infos = {info.name: info for info in self.check_folders(unparsed)}
        for name in unparsed:  # folders written with another template: ordered by their manifests
            manifest = infos[name].manifest if name in infos else None
            keys[name] = (manifest.epoch, manifest.step) if manifest else (-1, -1)
        files_of = _FolderFiles(self._folder)
        committed_seen = False  # a folder with a manifest was passed: partial ones after it are older
        older = []
        for name in sorted(names, key=lambda n: (keys[n], n), reverse=True):
            info = infos.get(name)
            if info is None:
                files = files_of(name)
                if not files:
                    continue  # an empty folder is no checkpoint, as in the full listing
                info = self._check(name, files) if MANIFEST_NAME in files else None
            if info is None or info.status is Status.PARTIAL:
                if committed_seen or name in unparsed:
                    older.append(name)
                else:
                    self._warn_once(name, "ignoring", "no manifest (an interrupted save)")
                continue
            committed_seen = True
            if info.ok:
                yield info
            else:
                self._warn_once(name, "skipping", info.problem)
        if older:  # leftovers, never restored: said once, at info level, as `prune` would delete them
            logger.info("resumable: %d older partial folder(s) in %s, never restored: %s; retention or "
                        "`resumable prune` deletes them", len(older), self._folder.url,
                        printable(", ".join(sorted(older)[:5])))

    def _warn_once(self, name: str, verb: str, problem: str) -> None:
        """A newer checkpoint passed over, said once: a resume and the fit after it list the run twice."""
        level = logging.DEBUG if (name, problem) in self._said else logging.WARNING
        self._said.add((name, problem))
        logger.log(level, "resumable: %s %s: %s", verb, printable(self._folder.url_of(name)),
                   printable(problem))

    def get(self, name: str) -> CheckpointInfo | None:
        """One checkpoint by folder name, with its status; None when the folder holds nothing."""
        check_name(name)
        files = self._folder.listing(self._folder.path(name)).get(name)
        if not files:
            self._folder.list_files()  # raises NotAFolderError if the run folder is a file
            if self._folder.has_link(self._folder.path(name)):
                return CheckpointInfo(name, self._folder.url_of(name), Status.CORRUPT, None,
                                      f"the folder is {LINK_PROBLEM}")
            return None
        return self._check(name, files)

    def check_folders(self, names: list[str]) -> list[CheckpointInfo]:
        """Checkpoint folders checked from their own files and manifests (empty folders left out)."""
        if len(names) > QUICK_FALLBACK_FOLDERS:  # an old run without an index: one recursive listing
            listing = self._folder.listing()
            return self._checked(listing, [name for name in names if name in listing])
        infos = []
        for name in names:
            files = self._folder.listing(self._folder.path(name)).get(name)
            if files:  # an empty folder is no checkpoint, as in the full listing
                infos.append(self._check(name, files))
        return infos

    def order(self, info: CheckpointInfo) -> tuple[Any, ...]:
        """The sort key: (epoch, step) from the manifest, else from the name, then the name."""
        epoch = info.epoch
        if epoch is not None:
            return (0, epoch, info.step, info.name)
        key = self.template.parse(info.name)
        return (0, key[0], key[1], info.name) if key else (1, 0, 0, info.name)

    # ----------------------------------------------------------------- helpers

    def _check(self, name: str, files: dict[str, ListedFile]) -> CheckpointInfo:
        """One folder checked: its manifest read alone."""
        folder = self._folder
        readable = manifest_readable(files)  # one too large is corrupt, unread
        blob = folder.read(folder.path(name, MANIFEST_NAME), MANIFEST_LIMIT) if readable else None
        return checked_info(name, folder.url_of(name), files, blob)

    def _checked(self, listing: dict[str, dict[str, ListedFile]], names: list[str]) -> list[CheckpointInfo]:
        """The folders ``names`` of ``listing`` checked, their manifests read at once."""
        folder = self._folder
        manifests = {name: folder.path(name, MANIFEST_NAME)  # one too large is corrupt, unread
                     for name in names if manifest_readable(listing[name])}
        blobs = folder.read_many(list(manifests.values()))
        return [checked_info(name, folder.url_of(name), listing[name],
                             blobs.get(manifests[name]) if name in manifests else None) for name in names]

    def _names_and_index(self) -> tuple[list[str], dict[str, CheckpointInfo]]:
        """The folder names (one delimiter listing) and the run index's checkpoints, read together."""
        folder = self._folder
        if not gcsfs_compat.awaits_listing_and_reads(folder.fs):
            names = folder.folder_names()
            return names, indexed_infos(folder, read_index(folder)) if names else {}
        fs = folder.fs
        with folder.errors(folder.url):
            folder.check_credentials()  # gcsfs alone would retry a failed refresh for a minute

        async def folder_names() -> list[str]:
            if folder.is_gcs:
                return await gcs_listing.folder_names(fs, folder.root)  # the names only: cheaper
            return folder.folder_names_in(await gcsfs_compat.ls(fs, folder.root))

        async def indexed() -> dict[str, CheckpointInfo]:
            # Built here, on the event loop, while the listing's answer is still on its way:
            # the server's time to list the folder then pays for most of this work.
            blob = await gcsfs_compat.cat_file(fs, folder.path(run_index.INDEX_NAME), run_index.INDEX_LIMIT)
            return indexed_infos(folder, run_index.decode(blob))

        async def both() -> tuple[list[str] | BaseException, dict[str, CheckpointInfo] | BaseException]:
            return await asyncio.gather(folder_names(), indexed(), return_exceptions=True)

        if folder.is_gcs:
            fs.invalidate_cache(folder.root)  # another process may have written since
        with deadline_in(folder.retry.budget):  # a command's budget bounds gcsfs' requests too
            found, infos = gcsfs_compat.run(fs, both)
        if isinstance(infos, FileNotFoundError):
            infos = {}  # no index (yet): every folder is checked from its own files
        if isinstance(found, BaseException) or not found or isinstance(infos, BaseException):
            # Again, one request at a time, with retries and errors that say what is wrong. An
            # empty listing too: a missing bucket, a file instead of a folder, or a new run.
            names = folder.folder_names()
            return names, indexed_infos(folder, read_index(folder)) if names else {}
        return found, infos


class _FolderFiles:
    """The files of one checkpoint folder at a time: its own listing for the first few asked,
    then one recursive listing of the run for all the rest (a walk past many damaged ones)."""

    def __init__(self, folder: RunFolder) -> None:
        self._folder = folder
        self._asked = 0
        self._everything: dict[str, dict[str, ListedFile]] | None = None

    def __call__(self, name: str) -> dict[str, ListedFile]:
        self._asked += 1
        if self._everything is None and self._asked > QUICK_FALLBACK_FOLDERS:
            self._everything = self._folder.listing()
        if self._everything is not None:
            return self._everything.get(name, {})
        return self._folder.listing(self._folder.path(name)).get(name, {})
