"""The storage layer's names the Keras side uses, handed on by the manager.

The Keras side reaches storage only through the manager (tests/test_layers.py holds it to
that): the checkpoint records it reads (`CheckpointInfo`), the run folder's type (`RunStorage`),
the writer lease's timeout and its check, the disk-full errnos and the free-space note its
messages carry, the checksumming writers a snapshot writes its files through in the
uploader's thread (`WrittenFiles`, `ChecksummedFile`), and single files with their records
(`FileTarget`, `FileRecord`, `split_url`, `check_drive_mounted`: `resumable.ModelCheckpoint`,
`save_model`, `load_model`), the listing of a folder of such files and the folder itself
(`list_model_files`, `ModelFile`, `RunFolder`: files `resume()` adopts), and giving the C
heap's freed memory back while a checkpoint loads (`give_heap_back`). Every name is the storage
layer's own object, re-exported, never wrapped: a type checked or an exception caught through
here is the same.
"""

from __future__ import annotations

from resumable.storage import CheckpointInfo, RunStorage
from resumable.storage.errors import NO_SPACE_ERRNOS, free_space
from resumable.storage.file_folder import CORRUPT, ModelFile, list_model_files
from resumable.storage.folder import RunFolder
from resumable.storage.heap import give_back as give_heap_back
from resumable.storage.lease import DEFAULT_TIMEOUT, check_timeout
from resumable.storage.mounts import check_drive_mounted
from resumable.storage.single_file import FileRecord, FileTarget, split_url
from resumable.storage.written_files import ChecksummedFile, WrittenFiles

__all__ = ["CORRUPT", "DEFAULT_TIMEOUT", "NO_SPACE_ERRNOS", "CheckpointInfo", "ChecksummedFile", "FileRecord",
           "FileTarget", "ModelFile", "RunFolder", "RunStorage", "WrittenFiles", "check_drive_mounted",
           "check_timeout", "free_space", "give_heap_back", "list_model_files", "split_url"]
