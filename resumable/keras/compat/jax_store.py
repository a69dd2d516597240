"""JAX's private API that resumable leans on, in one place: the distributed key-value store.

A multi-host job's processes exchange small messages at each save (`manager/job_commit.py`)
through the key-value store of the coordination service that ``jax.distributed.initialize``
starts: RPCs with timeouts, safe from a background thread while training runs collectives (a
device barrier such as ``multihost_utils.sync_global_devices`` is not: it would interleave
with training's own collectives). JAX has no public API for it, so the client is reached here
only, and its absence is said in one line naming JAX's version.
"""

from __future__ import annotations

import sys
from typing import Any

from resumable.core.errors import ResumableError


def distributed_client() -> Any:
    """The ``jax.distributed`` client of this process; ResumableError when there is none."""
    jax = sys.modules.get("jax")
    try:
        from jax._src.distributed import global_state

        client = global_state.client
    except (ImportError, AttributeError):
        client = None
    if client is None or not all(hasattr(client, name) for name in _CALLS):
        version = getattr(jax, "__version__", "?")
        raise ResumableError(
            f"resumable: JAX {version} offers no distributed key-value store here, which a model split "
            "across processes needs to commit checkpoints; call jax.distributed.initialize() before Keras "
            "builds the model"
        )
    return client


_CALLS = ("key_value_set", "blocking_key_value_get", "key_value_delete")


def put(client: Any, key: str, value: str) -> None:
    """Set ``key``; a key written before (a round retried) is replaced."""
    try:
        client.key_value_set(key, value, allow_overwrite=True)
    except TypeError:  # a JAX without allow_overwrite
        client.key_value_set(key, value)


def get(client: Any, key: str, timeout: float) -> str | None:
    """The value of ``key``, waiting up to ``timeout`` seconds; None when it did not come."""
    try:
        return str(client.blocking_key_value_get(key, max(1, int(timeout * 1000))))
    except Exception as e:  # JaxRuntimeError: DEADLINE_EXCEEDED, or the service is gone
        if "DEADLINE_EXCEEDED" in str(e):
            return None
        raise ResumableError(
            f"resumable: the JAX coordination service stopped answering ({str(e).splitlines()[0][:160]}); "
            "process 0, which runs it, has probably stopped"
        ) from None


def delete(client: Any, key: str) -> None:
    client.key_value_delete(key)


__all__ = ["delete", "distributed_client", "get", "put"]
