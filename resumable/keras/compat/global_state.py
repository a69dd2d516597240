"""Keras' process-wide state: whether it believes TensorFlow is importable, and its global seed
generator (which unseeded ``keras.random`` ops draw from).

Reaches ``keras.src.utils.module_utils.tensorflow._available``,
``keras.src.backend.common.global_state.get_global_attribute`` and
``keras.src.random.seed_generator.global_seed_generator`` (with ``GLOBAL_SEED_GENERATOR``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, NamedTuple

import keras

from resumable.keras.compat.messages import logger, unsupported


@functools.cache
def _lazy_tensorflow() -> Any:
    """``keras.src.utils.module_utils.tensorflow`` if it keeps its availability in ``_available``."""
    try:
        from keras.src.utils import module_utils

        lazy = module_utils.tensorflow
        # vars(), not hasattr: a LazyModule forwards unknown attributes to TensorFlow, importing it.
        if "_available" in vars(lazy):
            return lazy
    except Exception:  # noqa: BLE001 - any change in Keras means: not probed, Keras as is
        pass
    logger.debug("%s", unsupported("keras.src.utils.module_utils.tensorflow._available"))
    return None


@contextlib.contextmanager
def tensorflow_unavailable() -> Iterator[None]:
    """Inside, Keras' serializer believes TensorFlow is not installed (it would import it to ask).

    Uses ``keras.src.utils.module_utils.tensorflow._available``, the cached answer of Keras'
    lazy TensorFlow module, set to False and restored after. Without it this does nothing:
    Keras imports TensorFlow as it always does, which is slower but correct.
    """
    lazy = _lazy_tensorflow()
    if lazy is None:
        yield
        return
    saved = lazy._available
    lazy._available = False
    try:
        yield
    finally:
        lazy._available = saved


class _SeedGeneratorAPI(NamedTuple):
    get_global_attribute: Any
    global_seed_generator: Any
    key: str


@functools.cache
def _seed_generator_api() -> _SeedGeneratorAPI | None:
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator

        return _SeedGeneratorAPI(global_state.get_global_attribute, seed_generator.global_seed_generator,
                                 getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator"))
    except Exception:  # noqa: BLE001 - moved or renamed in this Keras version
        logger.warning("%s; unseeded keras.random ops will not continue the same after a resume",
                       unsupported("the global SeedGenerator (keras.src.backend.common.global_state)"))
        return None


def global_seed_generator(create: bool = False) -> keras.random.SeedGenerator | None:
    """Keras' global SeedGenerator, which unseeded ``keras.random`` ops draw from; None if none yet.

    Uses ``keras.src.backend.common.global_state.get_global_attribute`` and
    ``keras.src.random.seed_generator.global_seed_generator`` (the latter with ``create``, to
    have one to restore a state into). Without them, or when Keras refuses (inside a JAX
    trace), returns None: its state is then neither saved nor restored.
    """
    api = _seed_generator_api()
    if api is None:
        return None
    try:
        generator: keras.random.SeedGenerator | None = api.get_global_attribute(api.key)
        if generator is None and create:
            generator = api.global_seed_generator()
    except Exception:  # noqa: BLE001 - same answer as a Keras without it
        return None
    return generator
