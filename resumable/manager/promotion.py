"""Promotion (#55): a checkpoint of the local tier, newer than the durable tier's newest, uploaded
as the durable tier's next checkpoint instead of being serialized again.

A run resumed from its local tier (a crashed kernel) has its newest state on the VM's disk only;
until the durable tier's next save, a lost VM would lose it. At the start of the next fit, the
writer lease held, the local checkpoint's files (checked when it was resumed from) are linked
into a staging folder (copied where a link cannot be made) and committed to the durable run
folder like any staged checkpoint, in the background: each file streamed and checksummed, the
stored copy checked, the manifest written last. The sizes and CRC32Cs uploaded must equal those
the local manifest lists, or the promoted checkpoint is deleted and the upload fails as a
damaged one would.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from resumable.core.errors import CorruptCheckpointError
from resumable.core.manifest import Manifest
from resumable.manager.commits import Staged
from resumable.manager.run_writer import RunWriter
from resumable.storage import CheckpointInfo

logger = logging.getLogger("resumable")


def promote(writer: RunWriter, source: Path, info: CheckpointInfo) -> None:
    """Queue the upload of local checkpoint ``info`` (its files in ``source``) to ``writer``'s run
    folder under the same name (committed in the background, as a save's upload is)."""
    local = info.manifest
    if local is None:
        return
    staging = writer.stage(info.name)
    for rel in local.files:
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / rel, target)  # the local tier keeps its own copy: nothing rewrites either
        except OSError:
            shutil.copyfile(source / rel, target)

    def commit_checked(staged: Path, name: str, manifest: Manifest) -> CheckpointInfo:
        committed = writer.commit_staged(staged, name, manifest)
        uploaded = committed.manifest.files if committed.manifest is not None else {}
        if dict(uploaded) != dict(local.files):
            writer.storage.delete(name)
            raise CorruptCheckpointError(
                f"{committed.url}: the files uploaded from the local tier differ from its manifest; "
                "deleted, the next save replaces it")
        return committed

    logger.info("resumable: promoting %s from the local tier to %s", info.name, writer.storage.url)
    queue = writer.uploader.commit_later if writer.options.async_upload else writer.uploader.commit_now
    queue(staging, info.name, local, commit=Staged(commit_checked))


__all__ = ["promote"]
