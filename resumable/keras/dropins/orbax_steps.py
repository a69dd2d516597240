"""The steps ``keras.callbacks.OrbaxCheckpoint`` wrote in its folder, for `resume()` to adopt.

Its layout (Keras 3.15 over orbax-checkpoint 0.12, any backend): a folder per saved step, named
by the step's number, holding ``_CHECKPOINT_METADATA`` (JSON naming the step's parts),
``pytree`` (the model's state tree: trainable, non-trainable, optimizer and metrics variables,
keyed by variable path) and ``model_config`` (the model's config; absent with
``save_weights_only=True``). A step being written locally is ``<step>.orbax-checkpoint-tmp...``,
never a plain number; on a bucket it is written in place and ``commit_success.txt`` comes last.

With ``save_freq="epoch"`` (the default) the step is the epoch's index: ``step + 1`` epochs are
done. With ``save_freq=<int>`` it is the batches trained (the optimizer's iterations), and no
epoch is recorded: such a step is refused with one line, its epoch never guessed.

orbax-checkpoint is imported only to read a step; its files are only read (a bucket's are
downloaded first), never changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras

from resumable.core.display import first_line
from resumable.manager import RunFolder

KIND = "a keras.callbacks.OrbaxCheckpoint step"
INSTALL = "pip install orbax-checkpoint"
_METADATA = "_CHECKPOINT_METADATA"
_COMMITTED = "commit_success.txt"


class OrbaxMissing(Exception):
    """orbax-checkpoint is not installed: the steps cannot be read."""


class BatchStep(Exception):
    """The step counts batches (``save_freq=<int>``): no epoch to continue at."""


@dataclass(frozen=True)
class Step:
    """One step folder and what its metadata says."""

    number: int
    url: str
    problem: str  # why it cannot be adopted (unfinished, unreadable); empty when it may be
    weights_only: bool  # saved without model_config or optimizer state (save_weights_only=True)


def steps(url: str, folders: list[str], storage_options: dict[str, Any] | None) -> list[Step]:
    """The step folders among ``folders`` (names in ``url``), their metadata read at once; none read
    when no folder's name is a number."""
    numbers = sorted(int(name) for name in folders if name.isdigit())
    if not numbers:
        return []
    folder = RunFolder(url, storage_options=storage_options)
    paths = [folder.path(str(n), part) for n in numbers for part in (_METADATA, _COMMITTED)]
    read = folder.read_many(paths)
    found = []
    for n in numbers:
        metadata = read.get(folder.strip(folder.path(str(n), _METADATA)))
        committed = read.get(folder.strip(folder.path(str(n), _COMMITTED)))
        problem, parts = "", {}
        if not isinstance(metadata, bytes):
            why = first_line(metadata) if isinstance(metadata, Exception) else "not read"
            problem = f"its {_METADATA} cannot be read ({why}): not a finished step"
        elif not folder.is_local and not isinstance(committed, bytes):
            problem = f"it has no {_COMMITTED}: Orbax did not finish writing it"
        else:
            try:
                parts = dict(json.loads(metadata).get("item_handlers") or {})
            except (ValueError, TypeError, AttributeError) as e:
                problem = f"its {_METADATA} cannot be read ({first_line(e)})"
        if not problem and "pytree" not in parts:
            problem = "it holds no model state (no pytree): not a step keras.callbacks.OrbaxCheckpoint wrote"
        found.append(Step(n, folder.url_of(str(n)), problem, not problem and "model_config" not in parts))
    return found


def available() -> bool:
    try:
        _orbax()
    except OrbaxMissing:
        return False
    return True


def load(url: str, number: int, built: keras.Model | None,
         storage_options: dict[str, Any] | None) -> keras.Model:
    """The step's model with its weights and optimizer state: ``built`` (build_model's) when given,
    else the model of its config. Raises `OrbaxMissing`, `BatchStep`, or ValueError when the step
    does not fit the model."""
    v1 = _orbax()
    with _local_step(url, storage_options) as path, v1.Context():
        saved = v1.load_checkpointables(str(path), {"pytree": None, "model_config": None})
    tree = saved["pytree"]
    if built is not None and _fits(built, tree):
        model = built  # build_model's variables carry the step's names: read by name
    else:
        model = keras.saving.deserialize_keras_object(json.loads(saved["model_config"]["config"]))
    _assign(model, tree)
    if built is not None and model is not built:
        _copy_in_order(model, built)  # names differ (a second model in one session): same order
        model = built
    if int(model.optimizer.iterations) == number:
        raise BatchStep(f"step {number} counts batches (OrbaxCheckpoint(save_freq=<int>)), and "
                        "records no epoch")
    return model


def _orbax() -> Any:
    try:
        import orbax.checkpoint as ocp  # noqa: PLC0415 - heavy (imports JAX): only for an Orbax folder
    except ImportError as e:
        raise OrbaxMissing(str(e)) from None
    return ocp.v1


@contextlib.contextmanager
def _local_step(url: str, storage_options: dict[str, Any] | None) -> Iterator[Path]:
    """The step folder ``url`` on this machine: itself when local (Orbax wants an absolute path),
    else a copy."""
    base, _, name = url.rstrip("/").rpartition("/")
    folder = RunFolder(base, storage_options=storage_options)
    if folder.is_local:
        yield Path(os.path.abspath(folder.path(name)))
        return
    staged = Path(tempfile.mkdtemp(prefix="resumable-orbax-"))
    try:
        with folder.errors(url):
            folder.call(lambda: folder.fs.get(folder.path(name) + "/", f"{staged / name}/", recursive=True),
                        f"download step {name}")
        yield staged / name
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("/"): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flat(value, f"{prefix}{key}/"))
    return flat


def _fits(model: keras.Model, tree: dict[str, Any]) -> bool:
    try:
        _matched(model.trainable_variables, _flat(tree.get("trainable_variables") or {}), "")
    except ValueError:
        return False
    return True


def _assign(model: keras.Model, tree: dict[str, Any]) -> None:
    """Every variable of the model from the tree, all or nothing (Keras' ``set_state_tree`` passes
    over a path it does not find). Metrics are not read: fit resets them at each epoch."""
    optimizer = model.optimizer
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    pairs = []
    for group, variables in (("trainable_variables", model.trainable_variables),
                             ("non_trainable_variables", model.non_trainable_variables),
                             ("optimizer_variables", optimizer.variables)):
        pairs.extend(_matched(variables, _flat(tree.get(group) or {}), group))
    _assign_pairs(pairs)


def _matched(variables: list[Any], saved: dict[str, Any], group: str) -> list[tuple[Any, Any]]:
    """Each variable with its saved value: the saved path ending in the variable's path, word for
    word (a Sequential rebuilt from its config drops the model's name from its variables' paths:
    ``dense/kernel`` for the saved ``sequential/dense/kernel``; an optimizer's variables are named
    after them, under the optimizer's own name, which is left out). One saved value each, or
    ValueError naming a variable."""
    optimizer = group == "optimizer_variables"
    keys = {path: _words(path, optimizer) for path in saved}
    pairs, used = [], set()
    for variable in variables:
        mine = _words(variable.path, optimizer)
        found = [p for p, words in keys.items() if words[max(len(words) - len(mine), 0):] == mine]
        if len(found) != 1:
            raise ValueError(f"the step holds {'no' if not found else 'several'} {group.replace('_', ' ')} "
                             f"for {variable.path}")
        used.add(found[0])
        pairs.append((variable, saved[found[0]]))
    if len(used) != len(saved):
        extra = sorted(set(saved) - used)[:3]
        raise ValueError(f"the step holds {group.replace('_', ' ')} the model lacks ({', '.join(extra)})")
    return pairs


def _words(path: str, optimizer: bool) -> list[str]:
    if optimizer:
        path = path.split("/", 1)[-1]
    return [w for w in re.split(r"[/_]", path) if w]


def _copy_in_order(source: keras.Model, target: keras.Model) -> None:
    optimizer = target.optimizer
    if not optimizer.built:
        optimizer.build(target.trainable_variables)
    pairs: list[tuple[Any, Any]] = []
    for mine, theirs in ((target.weights, source.weights),
                         (optimizer.variables, source.optimizer.variables)):
        if len(mine) != len(theirs):
            raise ValueError(f"it holds {len(theirs)} variables where build_model's model has {len(mine)}")
        pairs.extend((m, t.value) for m, t in zip(mine, theirs, strict=True))
    _assign_pairs(pairs)


def _assign_pairs(pairs: list[tuple[Any, Any]]) -> None:
    for variable, value in pairs:  # every shape checked before any assign: a mismatch changes nothing
        shape = tuple(getattr(value, "shape", ()))
        if shape != tuple(variable.shape):
            raise ValueError(f"{variable.path} has shape {shape} in the step, {tuple(variable.shape)} in the "
                             "model")
    for variable, value in pairs:
        variable.assign(value)


__all__ = ["INSTALL", "KIND", "BatchStep", "OrbaxMissing", "Step", "available", "load", "steps"]
