"""The commit protocol: how a checkpoint folder becomes committed, and how it is deleted.

Layout of a run folder (local, a Google Drive mount, ``gs://bucket/prefix`` or ``memory://``)::

    <run>/ckpt-000003/model.keras
    <run>/ckpt-000003/state.json
    <run>/ckpt-000003/manifest.json     <- written last: its presence commits the checkpoint
    <run>/index.json                    <- what `list` shows of each manifest: a two-request `list`

Nothing is renamed and nothing is rewritten in place: GCS has no atomic rename and renames on
Drive's FUSE mount are unreliable. A folder without a manifest is an interrupted commit
("partial"); a manifest that disagrees with the files it lists makes it "corrupt". Neither
is ever used as the latest checkpoint.

Commit, in order:

1. Clear leftovers: a folder of the same name without a good manifest is an interrupted
   commit (or a corrupt one) and is deleted; a good manifest, or one of a newer format, means
   the checkpoint is committed already (CheckpointExistsError: never overwritten).
2. Put each file in the folder, with its size and CRC32C computed from the bytes as they are
   written, never by reading them back. In a local run (Drive's mount included) the files
   are written straight into the checkpoint's folder (`begin_in_place`, then the writer's
   `WrittenFiles`: exclusive creates, never through a link), then each is fsynced and its size
   on disk checked (`commit_in_place`). A kill in the middle leaves a folder without a
   manifest: partial, never used, cleared by the next commit of that name (step 1). To
   ``gs://`` (and any other store) the files are written once into a local staging folder,
   then uploaded, streamed and checksummed as they are sent, and the stored copy's size (and
   CRC32C on GCS) checked before going on (`commit`, `transfers`; big shards several at a time).
   An upload whose reply was lost is settled by asking the bucket what it holds (`landed`):
   the object sent is kept, anything else uploaded again.
3. Check the writer still holds the run (`fence`: a fresh read of the lease, so a writer
   taken over while it uploaded commits nothing). Write the manifest create-only (GCS'
   ``ifGenerationMatch=0``, an exclusive create locally, fsynced with its folder entry),
   then read it back: a write cut short without an error must not report a commit.
4. Update the run index (`index_upkeep`). The checkpoint is committed already: a failure
   here only warns.

A checkpoint written by the processes of a multi-host job takes these steps apart
(`prepare`, `upload`, `finish`): process 0 clears the folder (1), every process uploads its
own files (2), and once all have reported their sizes and CRC32Cs, process 0 writes the one
manifest listing them all (3, 4); see `resumable.manager.job_commit`.

Delete, in order, each step after the same `fence` check: the index first (a failure stops
the delete: the index never outlives a manifest), then the manifest (a half-done delete reads
as partial), then the other files, one `fence` check before each. Pruning many
(`delete_listed`): the index loses them all in one write first, then each folder as above,
its files as the caller's listing found them. A writer that gave its lease back (`Lease.release`)
is fenced off too, until it takes the lease again.

Locally (Drive's mount included), two more rules. Durable: a manifest whose fsync (or its
folder's) failed is removed and written again on the retry, never trusted, and removed when
the retries run out: after a failed fsync the bytes may never reach the disk, and Drive
reports a failed upload that way. Never outside the run folder (`local_files`): a symbolic
link below it is reported (the checkpoint is corrupt), never read, written or emptied
through; deleting one removes the link alone; a file with another name (a hard link, a
``cp -al`` backup of the run) is unlinked, never emptied by ``truncate_before_delete``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from resumable.core.display import human_size
from resumable.core.errors import (
    CheckpointExistsError,
    CorruptCheckpointError,
    NoSpaceError,
    ResumableError,
    StorageError,
    UnsupportedFormatError,
)
from resumable.core.manifest import MANIFEST_LIMIT, MANIFEST_NAME, FileEntry, Manifest, now_iso
from resumable.core.naming import check_name
from resumable.storage.errors import free_space
from resumable.storage.folder import RunFolder
from resumable.storage.index_upkeep import IndexUpkeep
from resumable.storage.listing import Listing
from resumable.storage.local_files import (
    LINK_PROBLEM,
    LinkInRunError,
    check_inside,
    empty_inside,
    fsync,
    make_parents_inside,
    remove_folder_inside,
    remove_inside,
    sync_inside,
)
from resumable.storage.records import (
    CheckpointInfo,
    ListedFile,
    checked_info,
    committed_info,
    manifest_readable,
)
from resumable.storage.transfers import Transfers

logger = logging.getLogger("resumable")


class Committer:
    """Commits and deletes checkpoint folders in one run folder (see the module docstring)."""

    def __init__(self, folder: RunFolder, listing: Listing, index: IndexUpkeep, transfers: Transfers) -> None:
        self._folder = folder
        self._listing = listing
        self._index = index
        self._transfers = transfers
        # Called right before a manifest is written and before each delete: the writer's fresh
        # check that the run is still its own (`Lease.fence`). None: no writer lease to check.
        self.fence: Callable[[], None] | None = None

    def commit(self, local_dir: str | Path, name: str, manifest: Manifest, *, progress: bool,
               between_chunks: Callable[[], None] | None) -> CheckpointInfo:
        """Copy the files under ``local_dir`` into folder ``name``, then write the manifest."""
        files = self._files_of(local_dir, name)
        self.prepare(name)
        with self._no_space_said(name, files):
            entries = self._transfers.upload_all(files, name, progress=progress,
                                                 between_chunks=between_chunks or _go_on)
            return self.finish(name, replace(manifest, files=entries))

    # A checkpoint written by several processes (manager/job_commit.py) takes the three steps
    # of `commit` apart: process 0 prepares the folder, every process uploads its own files,
    # then process 0 writes the one manifest listing all of them.

    def prepare(self, name: str) -> None:
        """Step 1: clear an interrupted or corrupt commit of ``name``; CheckpointExistsError if committed."""
        check_name(name)
        self._clear_leftovers(name)

    def upload(self, local_dir: str | Path, name: str, *, progress: bool,
               between_chunks: Callable[[], None] | None) -> dict[str, FileEntry]:
        """Step 2: the files under ``local_dir`` into folder ``name``; each one's size and CRC32C.

        ``local_dir`` may hold no file: a process of a multi-host job may hold no part to write.
        """
        files = self._files_of(local_dir, name, empty=True)
        with self._no_space_said(name, files):
            return self._transfers.upload_all(files, name, progress=progress,
                                              between_chunks=between_chunks or _go_on)

    def finish(self, name: str, manifest: Manifest) -> CheckpointInfo:
        """Step 3: after the fence, the manifest (listing the files uploaded) written last; the index."""
        check_name(name)
        manifest = replace(manifest, created=now_iso())
        self._check_fence()
        self._write_manifest(name, manifest.to_json())
        self._index.update(add={name: manifest})
        return committed_info(name, self._folder.url_of(name), manifest)

    @contextlib.contextmanager
    def _no_space_said(self, name: str, files: dict[str, Path]) -> Iterator[None]:
        """A full run folder said in one line: how much the checkpoint needs, what to do."""
        try:
            yield
        except NoSpaceError as e:
            folder = self._folder
            needed = human_size(sum(path.stat().st_size for path in files.values()))
            raise NoSpaceError(
                f"{folder.url_of(name)}: no space left to commit this checkpoint ({needed} needed"
                f"{free_space(folder.root) if folder.is_local else ''}); older checkpoints are kept: "
                "free space (empty Drive's trash), lower keep_last, or choose another folder"
            ) from e

    def _files_of(self, local_dir: str | Path, name: str, *, empty: bool = False) -> dict[str, Path]:
        """The files under ``local_dir`` by path relative to it (never a manifest); ResumableError if
        there are none, unless ``empty``."""
        folder = self._folder
        check_name(name)
        source = Path(local_dir)
        if not source.is_dir():
            raise ResumableError(f"{source}: no such folder to commit as {folder.url_of(name)}")
        files = {
            p.relative_to(source).as_posix(): p
            for p in sorted(source.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME
        }
        if not files and not empty:
            raise ResumableError(f"{source}: no files to commit as {folder.url_of(name)}")
        return files

    def begin_in_place(self, name: str) -> str:
        """Step 1 of a commit whose files are written where they stay (a local run): leftovers
        cleared, the checkpoint's folder made; its path, to write the files into."""
        folder = self._folder
        check_name(name)
        if not folder.is_local:
            raise ValueError(f"{folder.url_of(name)}: files are written in place only in a local run folder")
        self.prepare(name)
        path = folder.path(name)
        with folder.errors(folder.url_of(name)):
            folder.call(functools.partial(make_parents_inside, folder.root, folder.path(name, MANIFEST_NAME)),
                        f"make {name}")
        return path

    def commit_in_place(self, name: str, manifest: Manifest, written: dict[str, FileEntry]) -> CheckpointInfo:
        """Steps 2 to 4 for files written in place (after `begin_in_place`), ``written`` giving each
        one's size and CRC32C as computed while it was written: each file is synced to disk and
        its size checked, then the manifest is written."""
        folder = self._folder
        check_name(name)
        if not written:
            raise ResumableError(f"{folder.url_of(name)}: no files to commit")

        def durable() -> None:
            folders = set()
            for rel, entry in written.items():
                path = folder.path(name, rel)
                # on disk before the manifest that vouches for it; its pages then left to the kernel
                found = sync_inside(folder.root, path, drop_cached=True)
                if not stat.S_ISREG(found.st_mode) or found.st_size != entry.size:
                    raise OSError(errno.EIO, f"{rel}: {found.st_size} bytes on disk, {entry.size} written")
                folders.add(os.path.dirname(path))
            for parent in sorted(folders):
                fsync(parent)  # their entries: the files survive a crash as the manifest does

        with folder.errors(folder.url_of(name)):
            folder.call(durable, f"sync {name}")
        return self.finish(name, replace(manifest, files=dict(written)))

    def delete(self, name: str) -> None:
        """Delete a checkpoint folder: the index entry, the manifest, then the other files."""
        folder = self._folder
        check_name(name)
        self._check_fence()
        files = folder.listing(folder.path(name)).get(name, {})
        if MANIFEST_NAME in files:
            self._index.update(remove={name})  # before the manifest goes: the index never outlives it
        self._delete_files(name, files)

    def delete_index(self) -> None:
        """Delete the run index, after the fence (every checkpoint deleted: nothing to index)."""
        self._check_fence()
        self._index.delete()

    def delete_listed(self, listed: dict[str, dict[str, ListedFile]]) -> Iterator[str]:
        """Delete the checkpoint folders of a listing ({name: files}), yielding each name once gone.

        As `delete`, but the run index is rewritten once for all of them, first, and each
        folder's files are taken from ``listed`` (one listing of the run, not one per folder):
        pruning a long run costs each file's delete and a lease check before each. A folder
        listed as empty is listed afresh. Stopped midway, the index may miss the folders left
        (never name a deleted one): the next commit mends it.
        """
        for name in listed:
            check_name(name)
        self._check_fence()
        self._index.update(remove=set(listed))
        finished = False
        try:
            for name, files in listed.items():  # each delete is fenced (`_delete_files`)
                if not files:
                    files = self._folder.listing(self._folder.path(name)).get(name, {})
                self._delete_files(name, files)
                yield name
            finished = True
        finally:
            if not finished:
                self._index.may_miss()

    def _delete_files(self, name: str, files: dict[str, ListedFile]) -> None:
        """Folder ``name``'s files, the manifest first; one already gone is fine."""
        folder = self._folder
        for rel in sorted(files, key=lambda rel: rel != MANIFEST_NAME):  # the manifest first
            path = folder.path(name, rel)
            self._check_fence()  # each delete: a takeover between two files stops the rest
            with folder.errors(folder.url_of(name, rel)):
                if folder.is_local:
                    # Never through a link, never emptying a file that has another name (a `cp -al`
                    # backup of the run): see local_files. A link itself is unlinked, its target kept.
                    try:
                        check = empty_inside if folder.truncate_before_delete else check_inside
                        folder.call(functools.partial(check, folder.root, path), f"delete {rel}")
                    except LinkInRunError:
                        continue  # a folder on the way became a link: removed with the folder below
                elif folder.truncate_before_delete:
                    # Drive's trash keeps deleted files and counts them against the quota.
                    folder.call(functools.partial(folder.fs.pipe_file, path, b""), f"truncate {rel}")
                # Gone is what a delete wants: gone since the listing, or deleted by an earlier
                # try of this very delete whose reply was lost (gcsfs' retry, or ours, meets 404)
                with contextlib.suppress(FileNotFoundError):
                    folder.call(functools.partial(folder.fs.rm_file, path), f"delete {rel}")
        if folder.is_local:
            self._check_fence()
            with folder.errors(folder.url_of(name)):  # what is left; a link there is unlinked, not followed
                folder.call(functools.partial(remove_folder_inside, folder.root, folder.path(name)),
                            f"delete {name}")

    def _check_fence(self) -> None:
        if self.fence is not None:
            self.fence()

    def _clear_leftovers(self, name: str) -> None:
        """Remove an interrupted or corrupt commit of ``name``; refuse to touch a committed one."""
        folder = self._folder
        if folder.has_link(folder.path(name)):
            logger.warning("resumable: removing %s: %s", folder.url_of(name), LINK_PROBLEM)
            self.delete(name)  # the link alone: files are never written through it
            return
        files = folder.listing(folder.path(name)).get(name)
        if not files:
            # Listings can lag behind writes (Drive seen from another VM): a manifest that reads
            # back is committed, even when no listing shows it yet. Never write over its files.
            manifest_path = folder.path(name, MANIFEST_NAME)

            def manifest_found() -> bool:
                try:
                    folder.fs.info(manifest_path)
                except FileNotFoundError:  # the usual answer, at every save: no error to translate
                    return False
                return True

            try:
                with folder.errors(folder.url_of(name, MANIFEST_NAME)):
                    if not folder.call(manifest_found, "stat manifest"):
                        return
            except FileNotFoundError:  # a 404 that is no FileNotFoundError, translated
                return
            raise CheckpointExistsError(
                f"{folder.url_of(name)} is already committed (by another process, not listed yet) and "
                "resumable never overwrites a checkpoint; continue the run with resumable.resume() or "
                "write to a new folder"
            )
        if MANIFEST_NAME in files:
            # An oversized manifest is corrupt from its listed size alone: never read whole.
            readable = manifest_readable(files)
            blob = folder.read(folder.path(name, MANIFEST_NAME), MANIFEST_LIMIT) if readable else None
            info = checked_info(name, folder.url_of(name), files, blob)
            if info.ok or _newer_format(blob):
                raise CheckpointExistsError(
                    f"{info.url} is already committed and resumable never overwrites a checkpoint; "
                    "continue the run with resumable.resume() or write to a new folder"
                )
            logger.warning("resumable: replacing corrupt checkpoint %s (%s)", info.url, info.problem)
        else:
            logger.info("resumable: removing leftovers of an interrupted save in %s", folder.url_of(name))
        self.delete(name)

    def _write_manifest(self, name: str, data: bytes) -> None:
        """Write the manifest create-only, then read it back (step 3 of the module docstring)."""
        folder = self._folder
        path = folder.path(name, MANIFEST_NAME)
        url = folder.url_of(name, MANIFEST_NAME)

        created = written = False  # by a try of ours (locally): its file is ours to remove

        def write() -> None:
            nonlocal created, written
            if not folder.is_local:
                folder.fs.pipe_file(path, data, mode="create")
                return
            make_parents_inside(folder.root, path)
            if created:
                # An earlier try created it, then failed (a mount's EIO on fsync): after a failed
                # fsync its bytes may never reach the disk, and a second fsync may report success
                # all the same. Written again from scratch, never trusted.
                remove_inside(folder.root, path, truncate=False)
                created = written = False
            with folder.fs.open(path, "xb") as f:  # exclusive create, as GCS' ifGenerationMatch=0
                created = True
                f.write(data)
            written = True
            fsync(path)
            fsync(os.path.dirname(path))  # the folder entry, so the manifest survives a crash

        try:
            with folder.errors(url):
                folder.call(write, "write manifest")
        except FileExistsError as e:
            # A retry after a transient error (a GCS 503) whose first try did land finds our
            # own manifest: that is success, not a second writer. (Locally ours is rewritten.)
            if folder.read(path) == data:
                return
            raise CheckpointExistsError(
                f"{url} appeared while committing: another process is writing this run folder"
            ) from e
        except (OSError, KeyboardInterrupt):
            if written:  # whole but not known durable (an outage past the retries): it must not
                with contextlib.suppress(OSError):  # read as committed; a torn one reads as corrupt
                    remove_inside(folder.root, path, truncate=False)
            raise
        # A damaged manifest makes the folder corrupt (never used); the next save replaces it.
        stored = folder.read(path)
        if stored != data:
            found = f"{len(stored)} of {len(data)} bytes" if isinstance(stored, bytes) else str(stored)
            raise StorageError(f"{url}: the manifest did not land intact ({found}); not committed, "
                               "the next save tries again")


def _newer_format(blob: bytes | Exception | None) -> bool:
    """True for a manifest this version cannot read because a newer one wrote it."""
    if not isinstance(blob, bytes):
        return False
    try:
        Manifest.from_json(blob, "")
    except UnsupportedFormatError:
        return True
    except CorruptCheckpointError:
        return False
    return False


def _go_on() -> None:
    """The default ``between_chunks``: no pause."""
