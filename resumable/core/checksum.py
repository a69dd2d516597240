"""CRC32C checksums, the one GCS keeps for every object, so listings can be checked for free."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path

import google_crc32c

CHUNK_SIZE = 4 * 1024 * 1024


def crc32c_of_file(path: str | Path) -> str:
    """Return the CRC32C of a local file as 8 lowercase hex digits, reading it in chunks."""
    with open(path, "rb") as f:
        return crc32c_of_chunks(iter(lambda: f.read(CHUNK_SIZE), b""))


def crc32c_of_chunks(chunks: Iterable[bytes]) -> str:
    checksum = google_crc32c.Checksum()
    for chunk in chunks:
        checksum.update(chunk)
    return checksum.digest().hex()


class RunningCrc32c:
    """A CRC32C fed a chunk at a time, for bytes checksummed while they stream elsewhere."""

    def __init__(self) -> None:
        self._checksum = google_crc32c.Checksum()

    def update(self, chunk: bytes) -> None:
        self._checksum.update(chunk)

    def hex(self) -> str:
        return self._checksum.digest().hex()


def crc32c_of_bytes(data: bytes) -> str:
    return crc32c_of_chunks([data])


def crc32c_from_gcs(value: str) -> str:
    """Convert GCS' base64 big-endian form (``"bIkWNQ=="``) to our hex form."""
    return base64.b64decode(value).hex()
