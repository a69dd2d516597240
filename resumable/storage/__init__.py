"""Storage: one run folder on any fsspec file system, and the commit protocol.

Reading, listing, transfers, the run index, the writer lease's primitives and the commit
protocol (`resumable.storage.run_storage`). Imports no Keras.
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
