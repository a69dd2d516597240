"""Where training runs: its processes and devices, which one is the chief, the scope of a
``tf.distribute`` strategy or a ``keras.distribution`` variables are created under, and the
versions of the software it runs on (for the manifest)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np


def process_index() -> int:
    """This process's index among the processes of a multi-process JAX program; 0 otherwise.

    Never initializes JAX's backends (``jax.distributed.initialize`` must come first).
    """
    jax = _distributed_jax()
    return int(jax.process_index()) if jax is not None else 0


def process_count() -> int:
    """Processes of the JAX program (``jax.distributed``); 1 otherwise."""
    jax = _distributed_jax()
    return int(jax.process_count()) if jax is not None else 1


def _distributed_jax() -> Any:
    if keras.backend.backend() != "jax" or "jax" not in sys.modules:
        return None
    jax = sys.modules["jax"]
    try:
        return jax if jax.distributed.is_initialized() else None
    except AttributeError:  # a jax without is_initialized: ask the backend, which is up by now
        return jax


def broadcast_from_chief(values: Sequence[int]) -> list[int]:
    """Process 0's ``values`` on every process; a collective: every process must call it."""
    if process_count() == 1:
        return [int(v) for v in values]
    from jax.experimental import multihost_utils

    received = multihost_utils.broadcast_one_to_all(np.asarray(values, dtype=np.int32))
    return [int(v) for v in np.asarray(received)]


def topology(model: keras.Model | None, strategy: Any = None) -> tuple[int, int]:
    """``(processes, devices)`` training runs on, for the manifest.

    Devices are those the variables are laid out over: the ``keras.distribution`` mesh or the
    strategy's replicas; 1 for a model on one device.
    """
    if keras.backend.backend() == "jax":
        distribution = keras.distribution.distribution()
        mesh = getattr(distribution, "device_mesh", None)
        devices = int(np.size(mesh.devices)) if mesh is not None else 1
        return process_count(), devices
    strategy = strategy or getattr(model, "distribute_strategy", None)
    devices = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    processes = 1
    with contextlib.suppress(Exception):  # only multi-worker strategies have a cluster
        spec = strategy.cluster_resolver.cluster_spec()
        processes = max(1, sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs))
    return processes, devices


@dataclass(frozen=True)
class Placement:
    """Where a fit runs, for its saves: nothing of it changes while the fit runs, so it is
    asked once per fit (`placement`), not at every save."""

    chief: bool  # this process writes the run folder (`is_chief`)
    processes: int
    devices: int
    versions: dict[str, str]  # the software, for the manifest (`versions`)


def placement(model: keras.Model | None, strategy: Any = None) -> Placement:
    """Where the fit of ``model`` (under ``strategy``, if any) runs."""
    processes, devices = topology(model, strategy)
    return Placement(is_chief(model, strategy), processes, devices, versions())


def is_chief(model: keras.Model | None, strategy: Any = None) -> bool:
    """False on the workers of a multi-worker run, which must not write to the run folder."""
    strategy = strategy or getattr(model, "distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    if extended is not None and hasattr(extended, "should_checkpoint"):
        return bool(extended.should_checkpoint)
    return process_index() == 0


@contextlib.contextmanager
def scope(strategy: Any, distribution: Any = None) -> Iterator[None]:
    """``strategy.scope()`` (``tf.distribute``) and ``distribution.scope()`` (``keras.distribution``).

    Variables created inside get the layout of the strategy or distribution; values loaded
    into them are whole arrays, laid out (replicated or sharded) as the variable says.
    """
    with contextlib.ExitStack() as stack:
        if distribution is not None:
            stack.enter_context(distribution.scope())
        if strategy is not None:
            stack.enter_context(strategy.scope())
        yield


def check_distribution(strategy: Any, distribution: Any) -> None:
    """One way to distribute: a ``tf.distribute`` strategy or a ``keras.distribution``."""
    # Duck-typed: Keras does not export its Distribution base class.
    if distribution is not None and not (hasattr(distribution, "get_variable_layout")
                                         and hasattr(distribution, "scope")):
        raise ValueError(
            f"Invalid value for argument `distribution`. Received: distribution={distribution!r}. "
            "Expected a keras.distribution.Distribution (DataParallel, ModelParallel) or None; "
            "a tf.distribute strategy goes to `strategy`."
        )
    if strategy is not None and distribution is not None:
        raise ValueError(
            f"Invalid value for argument `strategy`. Received: strategy={strategy!r} together with "
            f"distribution={distribution!r}. Expected one of them: `strategy` for tf.distribute on "
            "TensorFlow, `distribution` for keras.distribution on JAX."
        )
    if strategy is not None and keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"Invalid value for argument `strategy`. Received: strategy={strategy!r} on the "
            f"{keras.backend.backend()} backend. Expected None: tf.distribute strategies need "
            "KERAS_BACKEND=tensorflow; on JAX pass distribution=keras.distribution.DataParallel(...)."
        )


def versions() -> dict[str, str]:
    from resumable._version import __version__

    backend = keras.backend.backend()
    found = {"resumable": __version__, "keras": keras.__version__}
    module = sys.modules.get(backend)
    if module is not None:
        found[backend] = str(getattr(module, "__version__", "?"))
    return found
