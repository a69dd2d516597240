"""Committed local checkpoints rewritten as sharded ones, as Keras 3.11+ writes them (shared by tests).

On a Keras that writes no shards itself (3.8 to 3.10), the tests of sharded checkpoints still
need some: a newer Colab runtime may have written them to the same Drive folder. Each
checkpoint's ``model.keras`` (or ``model.weights.h5``) becomes an unzipped ``.keras`` with
``model.weights.json`` and ``model_00000.weights.h5``, ... of at most ``max_bytes`` of values
each, a group's values spread over shards where it does not fit (Keras' map then lists every
shard of the group), and its manifest lists the new files with their checksums.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import h5py

from resumable.core.checksum import crc32c_of_file
from resumable.core.manifest import FileEntry, Manifest

PAYLOADS = ("model.keras", "model.weights.h5")


def reshard(run: Path, max_bytes: int) -> int:
    """Rewrite every committed checkpoint of the local run folder ``run`` in shards; how many."""
    count = 0
    for manifest_file in sorted(run.glob("*/manifest.json")):
        manifest = Manifest.from_json(manifest_file.read_bytes(), str(manifest_file))
        if manifest.payload not in PAYLOADS and not any(p in manifest.files for p in PAYLOADS):
            continue
        folder = manifest_file.parent
        written = _reshard_folder(folder, max_bytes)
        files = {name: entry for name, entry in manifest.files.items() if name not in PAYLOADS}
        files.update({name: FileEntry((folder / name).stat().st_size, crc32c_of_file(folder / name))
                      for name in written})
        manifest = dataclasses.replace(manifest, files=files, payload="model.weights.json")
        manifest_file.write_bytes(manifest.to_json())
        count += 1
    (run / "index.json").unlink(missing_ok=True)  # a cache of the manifests: listing reads them again
    return count


def _reshard_folder(folder: Path, max_bytes: int) -> list[str]:
    """The checkpoint's weights in shards (and a .keras' other members beside them); the new files."""
    written: list[str] = []
    with tempfile.TemporaryDirectory() as temporary:
        weights = folder / "model.weights.h5"
        if (folder / "model.keras").is_file():
            weights = Path(temporary) / "model.weights.h5"
            with zipfile.ZipFile(folder / "model.keras") as archive:
                for name in (n for n in archive.namelist() if not n.endswith("/")):
                    target = weights if name == "model.weights.h5" else folder / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(name))
                    if name != "model.weights.h5":
                        written.append(name)
            (folder / "model.keras").unlink()
        written += _split(weights, folder, max_bytes)
        weights.unlink(missing_ok=True)
    return written


def _split(weights: Path, folder: Path, max_bytes: int) -> list[str]:
    datasets: list[Any] = []
    with h5py.File(weights, "r") as source:
        source.visititems(lambda _, item: datasets.append(item) if isinstance(item, h5py.Dataset) else None)
        shards: list[str] = []
        weight_map: dict[str, Any] = {}
        target: Any = None
        used = total = 0
        for dataset in datasets:
            if target is None or (used and used + dataset.nbytes > max_bytes):
                if target is not None:
                    target.close()
                shards.append(f"model_{len(shards):05}.weights.h5")
                target, used = h5py.File(folder / shards[-1], "w"), 0
            group = _require_groups(source, target, dataset.parent.name)
            source.copy(dataset, group, name=dataset.name.rsplit("/", 1)[1])
            used += dataset.nbytes
            total += dataset.nbytes
            listed = weight_map.setdefault(dataset.parent.name, [])
            if shards[-1] not in listed:
                listed.append(shards[-1])
        if target is not None:
            target.close()
    weight_map = {path: names[0] if len(names) == 1 else names for path, names in weight_map.items()}
    (folder / "model.weights.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=4))
    return ["model.weights.json", *shards]


def _require_groups(source: Any, target: Any, path: str) -> Any:
    """The group ``path`` in ``target``, created with its ancestors' attributes as in ``source``."""
    group = target
    walked = ""
    for part in path.strip("/").split("/"):
        walked += "/" + part
        group = group.require_group(part)
        for key, value in source[walked].attrs.items():
            group.attrs[key] = value
    return group
