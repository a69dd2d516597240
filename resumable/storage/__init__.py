"""Storage: one run folder on any fsspec file system, and the commit protocol.

`RunStorage` (`run_storage`) is the facade; the commit protocol is described in
`resumable.storage.commit`. Imports no Keras, and nothing of resumable beyond `resumable.core`.
"""

from resumable.storage.run_storage import (
    PROGRESS_MIN_BYTES,
    STREAM_MIN_BYTES,
    CheckpointInfo,
    ListedFile,
    RunStorage,
    Status,
)

__all__ = ["PROGRESS_MIN_BYTES", "STREAM_MIN_BYTES", "CheckpointInfo", "ListedFile", "RunStorage", "Status"]
