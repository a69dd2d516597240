"""The names of the folders directly under a GCS path, without gcsfs' per-entry records.

`resumable list` needs only the names of a run's checkpoint folders. gcsfs' ``ls`` turns each
into a dict, sorts them and caches them, work this listing has no use for: it keeps the
prefixes of one delimiter listing as they come (see `gcsfs_compat.folder_prefixes`). The
tests run it against the installed gcsfs and fake-gcs-server.
"""

from __future__ import annotations

from typing import Any

from resumable.core.naming import is_plain_name
from resumable.storage import gcsfs_compat


async def folder_names(fs: Any, path: str) -> list[str]:
    """Names of the folders directly under ``path`` (``bucket/key``), in the listing's order.

    Raises what gcsfs raises for the request (FileNotFoundError for a missing bucket, ...).
    """
    _, key = gcsfs_compat.split_path(fs, path)
    start = len(key.rstrip("/")) + 1 if key else 0
    prefixes = await gcsfs_compat.folder_prefixes(fs, path)
    return [name for name in (prefix[start:].rstrip("/") for prefix in prefixes) if is_plain_name(name)]
