"""The TensorFlow internals resumable reads from a ``tf.data`` pipeline, reached from here only.

TensorFlow exports no API to look inside a dataset: which transformations it is built from,
with which seeds. resumable reads them to say, before a resumed run trains, why a pipeline
cannot give the order an unbroken run had (a shuffle without a seed, a random layer inside
``map``). Everything here is probed: where this TensorFlow lacks an attribute, `stages`
returns None and the caller says that it could not look, rather than guessing.

Imports TensorFlow lazily: only a ``tf.data.Dataset``, which the user built, leads here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("resumable")

# Op types of shuffles whose seeds are the 3rd and 4th inputs (after the input dataset and buffer size).
_SHUFFLE_OPS = ("ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                "ShuffleAndRepeatDatasetV2")
# Stateful random ops: seeded by their `seed` and `seed2` attributes (0 and 0: from the OS).
_RANDOM_OPS = ("RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
               "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
               "RandomPoisson", "RandomPoissonV2", "RandomCrop", "SampleDistortedBoundingBox",
               "SampleDistortedBoundingBoxV2", "RandomDataset", "RandomDatasetV2")
# Ops that change a variable: state a function carries from one element to the next.
_STATEFUL_VARIABLE_OPS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                          "RngReadAndSkip", "RngSkip", "StatefulUniform", "StatefulUniformInt",
                          "StatefulUniformFullInt", "StatefulStandardNormal", "StatefulStandardNormalV2",
                          "StatefulTruncatedNormal", "StatefulRandomBinomial")


@dataclass(frozen=True)
class Stage:
    """One transformation of a pipeline, as far as a replay cares."""

    kind: str  # the Python class, e.g. "_ShuffleDataset"
    seeds: tuple[int, int] | None = None  # a shuffle's or Dataset.random's seeds
    reshuffles: bool = False  # a shuffle with reshuffle_each_iteration (or Dataset.random rerandomizing)
    memory_cache: bool = False  # .cache() without a file name
    nondeterministic: bool = False  # map(..., deterministic=False)
    below: tuple[int, ...] = ()  # indexes (in the list `stages` returns) of the stages it reads


@dataclass(frozen=True)
class FunctionOp:
    """An op inside a function of the pipeline (``map``, ``interleave``, ``flat_map``, ``filter``)."""

    type: str
    seeds: tuple[int, int] | None  # a shuffle's or random op's seeds, when constant


def stages(dataset: Any) -> list[Stage] | None:
    """The dataset and every dataset it reads, each once, first the dataset itself; None when this
    TensorFlow does not tell (``DatasetV2._inputs``)."""
    found: list[Stage] = []
    index: dict[int, int] = {}
    order: list[Any] = []
    try:
        pending = [dataset]
        while pending:
            ds = pending.pop()
            if id(ds) in index:
                continue
            index[id(ds)] = len(order)
            order.append(ds)
            pending.extend(reversed(list(ds._inputs())))
        for ds in order:
            found.append(_stage(ds, tuple(index[id(i)] for i in ds._inputs())))
    except Exception as e:  # noqa: BLE001 - a TensorFlow without these: the caller says it cannot look
        logger.debug("resumable: cannot read the tf.data pipeline: %s", e)
        return None
    return found


def function_ops(dataset: Any) -> list[FunctionOp] | None:
    """The ops of every function of every stage, nested functions included (a dataset built
    inside ``interleave``); None when this TensorFlow does not tell (``DatasetV2._functions``)."""
    ops: list[FunctionOp] = []
    try:
        for ds in _datasets(dataset):
            for wrapper in ds._functions():
                graph_def = wrapper.function.graph.as_graph_def()
                ops.extend(_graph_ops(graph_def.node, graph_def_names=True))
                for function in graph_def.library.function:
                    ops.extend(_graph_ops(function.node_def, graph_def_names=False))
    except Exception as e:  # noqa: BLE001 - as in `stages`
        logger.debug("resumable: cannot read the tf.data pipeline's functions: %s", e)
        return None
    return ops


def _datasets(dataset: Any) -> Iterator[Any]:
    seen: set[int] = set()
    pending = [dataset]
    while pending:
        ds = pending.pop()
        if id(ds) not in seen:
            seen.add(id(ds))
            yield ds
            pending.extend(ds._inputs())


def _stage(ds: Any, below: tuple[int, ...]) -> Stage:
    kind = type(ds).__name__
    seeds = None
    reshuffles = False
    if "Shuffle" in kind and hasattr(ds, "_seed"):
        seeds = (_integer(ds._seed), _integer(ds._seed2))
        reshuffles = bool(getattr(ds, "_reshuffle_each_iteration", True))
    elif kind == "_RandomDataset":
        seeds = (_integer(ds._seed), _integer(ds._seed2))
        reshuffles = bool(getattr(ds, "_rerandomize", False))
    memory_cache = "Cache" in kind and hasattr(ds, "_filename") and _text(ds._filename) == ""
    return Stage(kind=kind, seeds=seeds, reshuffles=reshuffles, memory_cache=memory_cache,
                 nondeterministic=getattr(ds, "_deterministic", None) == "false", below=below)


def _integer(value: Any) -> int:
    return 0 if value is None else int(value.numpy() if hasattr(value, "numpy") else value)


def _text(value: Any) -> str:
    raw = value.numpy() if hasattr(value, "numpy") else value
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _graph_ops(nodes: Any, graph_def_names: bool) -> list[FunctionOp]:
    """Ops of one graph or function body, with the seeds of shuffles and random ops resolved."""
    import tensorflow as tf

    by_name = {node.name: node for node in nodes}

    def constant(name: str) -> int | None:
        # "Const" in a graph; "Const:output:0" in a function body
        node = by_name.get(name.lstrip("^").split(":")[0])
        if node is None or node.op != "Const":
            return None
        try:
            return int(tf.make_ndarray(node.attr["value"].tensor))
        except (TypeError, ValueError):
            return None

    ops = []
    for node in nodes:
        seeds = None
        if node.op in _SHUFFLE_OPS and len(node.input) >= 4:
            first, second = constant(node.input[2]), constant(node.input[3])
            seeds = None if first is None or second is None else (first, second)
        elif node.op in _RANDOM_OPS and "seed" in node.attr:
            seeds = (int(node.attr["seed"].i), int(node.attr["seed2"].i))
        ops.append(FunctionOp(type=node.op, seeds=seeds))
    return ops


def is_shuffle(op: FunctionOp) -> bool:
    return op.type in _SHUFFLE_OPS


def is_random(op: FunctionOp) -> bool:
    return op.type in _RANDOM_OPS


def changes_a_variable(op: FunctionOp) -> bool:
    return op.type in _STATEFUL_VARIABLE_OPS


__all__ = ["FunctionOp", "Stage", "changes_a_variable", "function_ops", "is_random", "is_shuffle", "stages"]
