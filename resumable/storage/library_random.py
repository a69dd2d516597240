"""The storage libraries' random draws, kept off Python's global ``random``.

``keras.utils.set_random_seed`` seeds the global ``random``, and Keras' TensorFlow backend draws
unseeded initializers' seeds from it: one retried request (a 429) drawing its jitter there
between the seed and ``build_model()`` would give a seeded run other initial weights. resumable
draws its own jitter from a generator of its own (`retry`); the libraries under gcsfs draw from
the module-level ``random`` they imported, so `isolate` gives each of those modules a private
generator in its place (its ``random`` attribute: only where it is the global module).

Checked against (module: what it draws): gcsfs 2025.3.0 and 2026.10.1 (``gcsfs.retry``: retry
jitter; ``gcsfs.core._rm_files`` imports ``random`` inside the function and cannot be reached,
resumable deletes one file at a time), google-api-core 2.25.1, 2.30.3 and 2.44.0
(``retry.retry_base``: retry jitter), google-auth 2.38.0, 2.49.0 and 2.63.0
(``_exponential_backoff``), google-cloud-storage 2.19.0 (none: google-resumable-media's), 3.13.1
and 3.17.1 (``_media._upload``: multipart boundaries), google-resumable-media 2.7.2, 2.10.1 and
2.11.0 (``_helpers``: jitter; ``_upload``: boundaries), urllib3 2.5.0 and 2.8.0 (``util.retry``:
jitter), aiohttp 3.12.15, 3.14.3 and 3.14.5 (``connector``: the order waiting requests are
served in).
"""

from __future__ import annotations

import functools
import importlib
import random
from typing import Any

# Where the storage stack draws from the global `random` (see above); missing ones are skipped.
LIBRARY_MODULES = (
    "gcsfs.retry",
    "google.api_core.retry.retry_base",
    "google.api_core.retry",  # older google-api-core releases kept retry in one module (not checked)
    "google.auth._exponential_backoff",
    "google.cloud.storage._media._upload",
    "google.resumable_media._helpers",
    "google.resumable_media._upload",
    "urllib3.util.retry",
    "aiohttp.connector",
)


class PrivateRandom(random.Random):
    """A generator of its own standing in for the ``random`` module: its draws (``random()``,
    ``uniform``, ``randint``, ``shuffle``...) are its own; any other name (``SystemRandom``...)
    is the module's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(random, name)


@functools.cache
def isolate() -> None:
    """Give each of `LIBRARY_MODULES` that is installed a private generator for the global
    ``random``. Once a process; imports those modules (only called for gs:// folders)."""
    for name in LIBRARY_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed, or another release's layout
            continue
        if getattr(module, "random", None) is random:
            module.random = PrivateRandom()  # type: ignore[attr-defined]
