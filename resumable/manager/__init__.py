"""The run manager: one writer's lease, staging, background uploads, commits, retention, fetching.

Imports no Keras: the Keras callback, `resume()` and the CLI all go through it. The Keras side
reaches storage only through the names below, the manager's public ones (tests/test_layers.py
holds it to that): besides the manager's own (`RunManager`, the listener interface it tells a
save's events through), the storage layer's records and helpers it hands on, the same objects
(a type checked or an exception caught through here is the storage layer's own):

- the checkpoint records (`CheckpointInfo`) and the run folder's type (`RunStorage`, `RunFolder`);
- the writer lease's timeout and its check (`DEFAULT_TIMEOUT`, `check_timeout`);
- the disk-full errnos and the free-space note of messages (`NO_SPACE_ERRNOS`, `free_space`);
- the checksumming writers a snapshot writes its files through in the uploader's thread
  (`WrittenFiles`, `ChecksummedFile`);
- single files with their records (`FileTarget`, `FileRecord`, `split_url`,
  `check_drive_mounted`: `resumable.ModelCheckpoint`, `save_model`, `load_model`) and folders of
  them (`list_model_files`, `ModelFile`, `CORRUPT`: files `resume()` adopts);
- giving the C heap's freed memory back while a checkpoint loads (`give_heap_back`);
- the mark of a save's private write folder in staging (`PRIVATE_WRITE`), which the next writer removes.
"""

from __future__ import annotations

from resumable.manager.listener import Files, SaveListener
from resumable.manager.run_writer import PRIVATE_WRITE
from resumable.storage import CheckpointInfo, RunStorage
from resumable.storage.errors import NO_SPACE_ERRNOS, free_space
from resumable.storage.file_folder import CORRUPT, ModelFile, list_model_files
from resumable.storage.folder import RunFolder
from resumable.storage.heap import give_back as give_heap_back
from resumable.storage.lease import DEFAULT_TIMEOUT, check_timeout
from resumable.storage.mounts import check_drive_mounted
from resumable.storage.single_file import FileRecord, FileTarget, split_url
from resumable.storage.written_files import ChecksummedFile, WrittenFiles

__all__ = ["CORRUPT", "DEFAULT_TIMEOUT", "NO_SPACE_ERRNOS", "PRIVATE_WRITE", "CheckpointInfo",
           "ChecksummedFile", "FileRecord",
           "FileTarget", "Files", "ModelFile", "RunFolder", "RunStorage", "SaveListener", "WrittenFiles",
           "check_drive_mounted", "check_timeout", "free_space", "give_heap_back", "list_model_files",
           "split_url"]
