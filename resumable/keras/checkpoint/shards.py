"""Keras' sharded weights merged into the one ``.weights.h5`` file Keras' ``load_weights`` reads.

Keras 3.11+ writes weights over ``max_shard_size`` as a map (``model.weights.json``) and shards
(``model_00000.weights.h5``, ...), each shard an HDF5 file with the groups of a single
``.weights.h5`` (``<path>/vars/<index>``), a group's values possibly spread over several shards.
Where Keras cannot read them itself (3.8 and 3.9 have no sharded store; 3.10's misreads a group
spread over shards), the shards are merged, group by group, into one file: what the same model
saved unsharded would hold. Only datasets and groups are copied, never a link to elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py

from resumable.core import safe_json


def shard_names(weights_map: Path, limit: int) -> list[str]:
    """The shard files ``weights_map`` names, in order, each once (the map is checked by the caller)."""
    shards = safe_json.loads(weights_map.read_bytes(), limit)
    names: set[str] = set()
    for value in shards["weight_map"].values():
        names.update(value if isinstance(value, list) else [value])
    return sorted(names)


def merge(weights_map: Path, into: Path, landed: Callable[[str], object], limit: int) -> None:
    """Write the weights of ``weights_map``'s shards into the single ``.weights.h5`` file ``into``,
    each shard opened once ``landed(its name)`` returns. FileNotFoundError for a missing shard,
    OSError for one that is not HDF5 or holds anything but groups and datasets."""
    with h5py.File(into, "w") as target:
        for name in shard_names(weights_map, limit):
            landed(name)
            path = weights_map.with_name(name)
            if not path.is_file():
                raise FileNotFoundError(2, "no such shard", str(path))
            with h5py.File(path, "r") as shard:
                _copy_group(shard, target, name)


def _copy_group(source: Any, target: Any, shard: str) -> None:
    for key, value in source.attrs.items():
        target.attrs[key] = value
    for key in source:
        link = source.get(key, getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise OSError(f"{shard}: {source.name}/{key} is a {type(link).__name__}, not data")
        item = source[key]
        if isinstance(item, h5py.Group):
            _copy_group(item, target.require_group(key), shard)
        elif isinstance(item, h5py.Dataset) and not item.external and not item.is_virtual:
            if key in target:
                raise OSError(f"{shard}: {item.name} is in two shards")
            source.copy(item, target, name=key)
        else:
            raise OSError(f"{shard}: {source.name}/{key} is neither a group nor data")
