"""A Drive-like run folder whose runtime dies: files written since the last flush may be lost.

Google Drive's FUSE mount uploads files in the background; when a Colab runtime dies, any of
the files changed since the last flush can end up in any state: uploaded whole, never
uploaded (the old file, or none), cut short, or empty; and in any order, so a manifest can
land while the files it lists do not. A deletion may not have reached Drive either.

The model works on snapshots of a real run folder, taken after each commit: a death during
commit k, with the last flush after commit j < k, gives every file that differs between
snapshots j and k one of those fates at random. The result is written out as a run folder
for the real code to resume from.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

Tree = dict[str, bytes]  # relative path -> content

MANIFEST = "manifest.json"


def snapshot(root: Path) -> Tree:
    """Every file under ``root`` with its content."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def die(flushed: Tree, written: Tree, rng: random.Random) -> tuple[Tree, dict[str, str]]:
    """The folder after a death: ``flushed`` survives, each change towards ``written`` may not.

    Returns the tree and each changed file's fate (for the failure message of a test).
    """
    tree = dict(flushed)
    fates = {}
    for rel in sorted(set(flushed) | set(written)):
        old, new = flushed.get(rel), written.get(rel)
        if old == new:
            continue
        if new is None:  # deleted since the flush
            fate = rng.choice(["deleted", "delete lost"])
        else:
            # Mostly uploaded, as on a live mount; else a commit's files would never all survive.
            fate = rng.choices(["uploaded", "lost", "cut short", "empty"], weights=[7, 1, 1, 1])[0]
        fates[rel] = fate
        if fate == "deleted" or fate == "lost" and old is None:
            tree.pop(rel, None)
        elif fate == "uploaded":
            assert new is not None
            tree[rel] = new
        elif fate == "cut short":
            assert new is not None
            tree[rel] = new[: rng.randrange(len(new))] if new else b""
        elif fate == "empty":
            tree[rel] = b""
        # "lost" of a changed file and "delete lost": the old content stays
    return tree, fates


def write_tree(root: Path, tree: Tree, died_ago: float = 600.0) -> None:
    """Write ``tree`` under ``root``, its files last modified ``died_ago`` seconds ago (the death)."""
    when = time.time() - died_ago
    for rel, data in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (when, when))


def files_of(tree: Tree, name: str) -> Tree:
    """The files of checkpoint folder ``name`` in ``tree``, by path inside it."""
    return {rel.split("/", 1)[1]: data for rel, data in tree.items() if rel.startswith(f"{name}/")}


def intact(tree: Tree, committed: dict[str, Tree]) -> list[str]:
    """Checkpoints whose manifest and every file survived exactly as committed, oldest first."""
    names = [
        name for name, files in committed.items()
        if all(tree.get(f"{name}/{rel}") == data for rel, data in files.items())
    ]
    return sorted(names, key=lambda name: json.loads(committed[name][MANIFEST])["epoch"])
