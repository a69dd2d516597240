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


# CRC-32C's and zlib's CRC-32's reflected polynomials: `combine` joins the checksums of two
# pieces of a file written out of order into the checksum of both, without their bytes.
CRC32C_POLY = 0x82F63B78
CRC32_POLY = 0xEDB88320


def _times(a: int, b: int, poly: int) -> int:
    """``a * b`` modulo the polynomial (reflected bit order), as zlib's ``multmodp``."""
    product = 0
    bit = 1 << 31
    while True:
        if a & bit:
            product ^= b
            if not a & (bit - 1):
                return product
        bit >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1


def _powers(poly: int) -> list[int]:
    """x^(2^k) modulo the polynomial, k = 0..66: a shift by any length below 2^64 bytes.

    Not 32 entries used round and round, as zlib's ``crc32_combine`` does: that holds for
    CRC-32, whose polynomial is irreducible (x^(2^32) = x), but not for CRC-32C, where it made
    every piece of 512 MiB or more combine wrong.
    """
    table = [1 << 30]  # x^1
    for _ in range(66):
        table.append(_times(table[-1], table[-1], poly))
    return table


_POWERS = {CRC32C_POLY: _powers(CRC32C_POLY), CRC32_POLY: _powers(CRC32_POLY)}


def combine(first: int, second: int, second_length: int, poly: int = CRC32C_POLY) -> int:
    """The CRC of two pieces end to end, from each one's CRC and the second one's length.

    As zlib's ``crc32_combine``, for CRC-32C (the default) or zlib's CRC-32 (``CRC32_POLY``):
    a file whose pieces are written in any order is checksummed as its pieces are written.
    """
    powers = _POWERS[poly]
    shift = 1 << 31  # x^0
    k = 3  # x^(8n): one byte is 2^3 bits
    n = second_length
    while n:
        if n & 1:
            shift = _times(powers[k], shift, poly)
        n >>= 1
        k += 1
    return _times(shift, first, poly) ^ second
