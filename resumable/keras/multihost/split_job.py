"""Multi-host jobs whose variables no process holds whole: each process saves and restores its part.

Under ``keras.distribution.ModelParallel`` over the devices of several processes (a TPU pod
slice, several GPU hosts), a variable's shards live on different hosts and process 0 cannot
read the whole of it. Then every process writes what its devices hold (`multihost_parts`, `shard_io`, with
TensorStore) and uploads it, and process 0 commits the one manifest once all have
(`resumable.manager.job_commit`); on resume every process fetches, checks and reads only the
parts its devices need under the current layout, whatever the mesh or the number of
processes. A job whose variables every process holds whole (``DataParallel``) keeps the
single writer and Keras' own files.

A checkpoint of such a job (its manifest's ``payload`` is ``variables.json``)::

    variables.json          process 0: every variable's path, shape and dtype, in order
    variables/<i>/.zarray   process 0: variable i's zarr metadata (a chunk is one device's shard)
    variables/<i>/<chunk>   the process whose device holds replica 0 of that shard
    state.json, arrays.npz  process 0, as in every checkpoint (epoch, RNG, callbacks, metrics)

The variables are the model's weights, then its optimizer's variables, in Keras' order.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from resumable.core import safe_json
from resumable.core.display import printable
from resumable.core.errors import CheckpointMismatchError, CorruptCheckpointError, ResumableError
from resumable.keras import topology
from resumable.keras.checkpoint import files_to_model
from resumable.keras.checkpoint.snapshot import ARRAYS_FILE, STATE_FILE
from resumable.keras.compat import jax_store
from resumable.keras.multihost import shard_io
from resumable.keras.multihost.parts import (
    FORMAT,
    VARIABLES_FILE,
    VARIABLES_FOLDER,
    model_variables,
)
from resumable.manager import CheckpointInfo
from resumable.manager.job_commit import all_gather, gather
from resumable.manager.run_manager import RunManager

logger = logging.getLogger("resumable")

ZARRAY = ".zarray"


def split_across_processes(model: keras.Model | None) -> bool:
    """Whether some variable of ``model`` is split over the devices of several processes: then
    no process can save the model alone, and every process writes its part."""
    if model is None or topology.process_count() == 1:
        return False
    for variable in model.variables:
        value = getattr(variable, "value", None)
        if not (getattr(value, "is_fully_addressable", True) or getattr(value, "is_fully_replicated", True)):
            return True
    return False


check_installed = shard_io.check_installed


def holds(info: CheckpointInfo | None) -> bool:
    """Whether checkpoint ``info`` was written by the processes of such a job, each its part."""
    return info is not None and info.manifest is not None and info.manifest.payload == VARIABLES_FILE


def chief_decides(flag: bool) -> bool:
    """Process 0's ``flag`` on every process (a collective: every process calls it at the same step)."""
    return topology.broadcast_from_chief([int(flag)])[0] == 1


# ----------------------------------------------------------------------------- the job's messages


class JaxChannel:
    """`JobChannel` over the key-value store of ``jax.distributed`` (`jax_compat`), keys under ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self._client = jax_store.distributed_client()
        self._prefix = prefix

    def __repr__(self) -> str:
        return f"JaxChannel({self._prefix!r})"

    @property
    def process_index(self) -> int:
        return topology.process_index()

    @property
    def process_count(self) -> int:
        return topology.process_count()

    def put(self, key: str, value: str) -> None:
        jax_store.put(self._client, self._prefix + key, value)

    def get(self, key: str, timeout: float) -> str | None:
        return jax_store.get(self._client, self._prefix + key, timeout)

    def delete(self, key: str) -> None:
        jax_store.delete(self._client, self._prefix + key)


_opened: collections.Counter[str] = collections.Counter()


def channel(url: str) -> JaxChannel:
    """A new channel for run folder ``url``. Every process opens its channels in the same order
    (the same code runs everywhere), so the n-th of one process talks to the n-th of the others."""
    _opened[url] += 1
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return JaxChannel(f"resumable/{digest}/{_opened[url]}/")


# ----------------------------------------------------------------------------- loading


def load_model(folder: Path, build_model: Callable[[], keras.Model] | None, *, strategy: Any = None,
               distribution: Any = None, where: str, landed: Any = None,
               reads: files_to_model.ReadOnce | None = None) -> keras.Model:
    """`files_to_model.load_model` of a checkpoint whose every file is in ``folder`` (one process resumes
    a checkpoint a multi-host job wrote: it holds every part)."""
    check_installed()
    return files_to_model.load_model(folder, build_model, strategy=strategy, distribution=distribution,
                                     where=where, landed=landed, reads=reads,
                                     weights=lambda model: read_variables(model, folder, where))


def load_into(model: keras.Model, folder: Path, where: str,
              reads: files_to_model.ReadOnce | None = None) -> None:
    """`files_to_model.load_into` of such a checkpoint: its variables and seed generators' states."""
    check_installed()
    files_to_model.load_into(model, folder, where, weights=lambda model: read_variables(model, folder, where),
                             reads=reads)


def read_variables(model: keras.Model, folder: Path, where: str) -> None:
    """Each variable (weights, then the optimizer's) receives its saved values, read from
    ``folder`` for this process's devices only, laid out as the variable is now."""
    _build_optimizer(model)
    variables = model_variables(model)
    check_listing(variables, read_listing(folder, where), where)
    import jax
    import jax.numpy as jnp

    for i, variable in enumerate(variables):
        try:
            value = shard_io.read(folder / VARIABLES_FOLDER / str(i), variable.value.sharding,
                                  tuple(variable.shape), jnp.dtype(variable.dtype))
        except ValueError as e:  # TensorStore: a missing or unreadable chunk, a wrong shape
            raise CorruptCheckpointError(
                f"{where}: {VARIABLES_FOLDER}/{i} ({printable(variables[i].path)}): "
                f"{printable(str(e).splitlines()[0])}; the checkpoint is damaged, an older one will be used"
            ) from None
        variable.assign(value)
        del value
        # one variable's read alive at a time, however far JAX's asynchronous dispatch runs
        # behind on a busy machine: its host buffers go before the next variable is read
        jax.block_until_ready(variable.value)


def check_listing(variables: list[Any], saved: list[dict[str, Any]], where: str) -> None:
    """CheckpointMismatchError naming the first variable whose shape differs from the one saved."""
    for i, (variable, entry) in enumerate(zip(variables, saved, strict=False)):
        if list(variable.shape) != entry["shape"]:
            raise CheckpointMismatchError(
                f"{where} does not fit the model from build_model(): variable {i} {variable.path!r} has "
                f"shape {tuple(variable.shape)} in the model but {tuple(entry['shape'])} in the checkpoint "
                f"(saved as {entry['path']!r})")
    if len(variables) != len(saved):
        raise CheckpointMismatchError(
            f"{where} does not fit the model from build_model(): the model and its optimizer have "
            f"{len(variables)} variables, the checkpoint {len(saved)}; build and compile the model as the "
            "run did")


def read_listing(folder: Path, where: str) -> list[dict[str, Any]]:
    """The variables ``variables.json`` lists; CorruptCheckpointError when it is not resumable's."""
    try:
        raw = safe_json.loads((folder / VARIABLES_FILE).read_bytes(), safe_json.STATE_LIMIT)
        if type(raw) is not dict or raw.get("format") != FORMAT or type(raw.get("variables")) is not list:
            raise ValueError("is not resumable's list of variables")
        for entry in raw["variables"]:
            if not (type(entry) is dict and type(entry.get("path")) is str and type(entry.get("dtype")) is str
                    and type(entry.get("shape")) is list
                    and all(type(d) is int and d >= 0 for d in entry["shape"])):
                raise ValueError("has an entry that is not a variable's path, shape and dtype")
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(
            f"{where}: {VARIABLES_FILE} {printable(str(e))}; this checkpoint cannot be restored (resume() "
            "falls back to the one before it)") from None
    variables: list[dict[str, Any]] = raw["variables"]
    return variables


def needed_files(model: keras.Model, folder: Path, info: CheckpointInfo) -> set[str]:
    """The chunk files this process's devices need of each variable, under its current layout."""
    variables = model_variables(model)
    check_listing(variables, read_listing(folder, info.url), info.url)
    listed = len(info.manifest.files) if info.manifest is not None else 0
    needed: set[str] = set()
    for i, variable in enumerate(variables):
        prefix = f"{VARIABLES_FOLDER}/{i}"
        metadata = _zarray(folder / prefix / ZARRAY, info.url)
        try:
            if metadata["shape"] != list(variable.shape):
                raise ValueError(f"shape {tuple(metadata['shape'])}, not the listed {tuple(variable.shape)}")
            indices = variable.value.sharding.addressable_devices_indices_map(tuple(variable.shape)).values()
            needed.update(f"{prefix}/{name}" for name in shard_io.chunk_files(metadata, indices, listed))
        except ValueError as e:
            raise CorruptCheckpointError(f"{info.url}: {prefix}/{ZARRAY}: {printable(str(e))}; the "
                                         "checkpoint is damaged, an older one will be used") from None
    return needed


def _zarray(path: Path, where: str) -> dict[str, Any]:
    try:
        raw = safe_json.loads(path.read_bytes(), safe_json.STATE_LIMIT)
        if not (type(raw) is dict and type(raw.get("shape")) is list and type(raw.get("chunks")) is list
                and len(raw["shape"]) == len(raw["chunks"])
                and all(type(d) is int and d >= 0 for d in raw["shape"] + raw["chunks"])
                and raw.get("dimension_separator", ".") in (".", "/", None)):
            raise ValueError("is not zarr metadata")
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{where}: {path.parent.name}/{ZARRAY} {printable(str(e))}; the "
                                     "checkpoint is damaged, an older one will be used") from None
    metadata: dict[str, Any] = raw
    return metadata


def _build_optimizer(model: keras.Model) -> None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)


def small_files(info: CheckpointInfo) -> set[str]:
    """What every process reads first: the listing, state, arrays and each variable's metadata."""
    files = info.manifest.files if info.manifest is not None else {}
    return {rel for rel in files
            if rel in (VARIABLES_FILE, STATE_FILE, ARRAYS_FILE) or rel.endswith(f"/{ZARRAY}")}


def only(info: CheckpointInfo, names: set[str]) -> CheckpointInfo:
    """``info`` as if its manifest listed only ``names``: what `RunManager.fetch` then fetches and checks.

    A name the manifest does not list is a damaged checkpoint (a chunk that should be there).
    """
    assert info.manifest is not None
    files = info.manifest.files
    missing = sorted(names - set(files))
    if missing:
        raise CorruptCheckpointError(f"{info.url}/{missing[0]} is not in its manifest; the checkpoint is "
                                     "damaged, an older one will be used")
    subset = {rel: files[rel] for rel in sorted(names)}
    return dataclasses.replace(info, manifest=dataclasses.replace(info.manifest, files=subset))


class JobResume:
    """Every process of a multi-host job resumes from the checkpoint process 0 chose, each
    fetching, checking and reading only its part; a checkpoint damaged for any process is
    passed over by all of them. Each step ends with an exchange over the job's channel,
    bounded by ``timeout``."""

    def __init__(self, manager: RunManager, *, timeout: float) -> None:
        self.manager = manager
        self.timeout = timeout
        self.channel = channel(manager.storage.url)
        self._step = 0

    def newest_is_split(self) -> bool:
        """Whether the newest good checkpoint (process 0's view) was written by such a job."""
        newest = self.manager.newest_good() if self.channel.process_index == 0 else None
        split = self._from_chief("split", "1" if holds(newest) else "0") == "1"
        if split:
            check_installed()
        return split

    def load_newest(self, build_model: Callable[[], keras.Model] | None, *, distribution: Any,
                    warn: Callable[[str], None], reads: files_to_model.ReadOnce
                    ) -> tuple[CheckpointInfo, Path, keras.Model] | None:
        """The newest checkpoint every process could read, with its folder and the model; None if none.
        ``reads``: its state.json and arrays.npz, read once (`files_to_model.ReadOnce`)."""
        return self._newest_loaded(
            lambda info, folder: self._load(info, folder, build_model, distribution, reads), warn)

    def restore_into(self, model: keras.Model, *, warn: Callable[[str], None], reads: files_to_model.ReadOnce
                     ) -> tuple[CheckpointInfo, Path] | None:
        """`load_newest` for the model ``fit`` was called on (BackupAndRestore): the newest
        checkpoint every process could read, loaded into ``model`` in place; None if none."""
        found = self._newest_loaded(lambda info, folder: self._load_into(model, info, folder, reads), warn)
        return None if found is None else (found[0], found[1])

    def _newest_loaded(self, load: Callable[[CheckpointInfo, Path], Any], warn: Callable[[str], None]
                       ) -> tuple[CheckpointInfo, Path, Any] | None:
        """The newest checkpoint every process could fetch and ``load(info, folder)``, its folder and
        what ``load`` returned (never None); None if none."""
        self.warn = warn
        while (info := self._chosen()) is not None:
            # The small files first, then each process its own chunks (_read_part); an older
            # checkpoint of whole arrays: every process reads all of it.
            first = only(info, small_files(info)) if holds(info) else info
            folder = self._agree("fetch", info, functools.partial(self.manager.fetch, first))
            if folder is None:
                continue
            loaded = self._agree("load", info, functools.partial(load, info, folder))
            if loaded is not None:
                return info, folder, loaded
        return None

    def _load(self, info: CheckpointInfo, folder: Path, build_model: Callable[[], keras.Model] | None,
              distribution: Any, reads: files_to_model.ReadOnce) -> keras.Model:
        return files_to_model.load_model(folder, build_model, distribution=distribution, where=info.url,
                                         weights=self._weights(info, folder), reads=reads)

    def _load_into(self, model: keras.Model, info: CheckpointInfo, folder: Path,
                   reads: files_to_model.ReadOnce) -> bool:
        files_to_model.load_into(model, folder, info.url, weights=self._weights(info, folder), reads=reads)
        return True

    def _weights(self, info: CheckpointInfo, folder: Path) -> Callable[[keras.Model], None] | None:
        """How a checkpoint's weights are read: this process's part of a split one; Keras' files else."""
        return functools.partial(self._read_part, info=info, folder=folder) if holds(info) else None

    def _read_part(self, model: keras.Model, info: CheckpointInfo, folder: Path) -> None:
        """This process's chunks of every variable, fetched and checked, then read."""
        _build_optimizer(model)
        chunks = self.manager.fetch(only(info, needed_files(model, folder, info) | small_files(info)))
        read_variables(model, chunks, info.url)

    def _chosen(self) -> CheckpointInfo | None:
        """Process 0's next candidate (newest good, not found damaged), on every process."""
        if self.channel.process_index == 0:
            info = self.manager.newest_good()
            self._from_chief("choice", info.name if info is not None else "")
            return info
        name = self._from_chief("choice", "")
        if not name:
            return None
        try:
            return self.manager.storage.get(name)
        except ResumableError as e:
            url = self.manager.storage.url
            raise ResumableError(f"process {self.channel.process_index}: {url}/{name}, which "
                                 f"process 0 resumes from, cannot be read here ({e}); every process must "
                                 "see the same run folder") from e

    def _agree(self, step: str, info: CheckpointInfo, work: Callable[[], Any]) -> Any:
        """``work()`` on every process, then what each met: a checkpoint damaged for one is damaged
        for all (None: try the next older one); any other error stops every process."""
        try:
            result, said = work(), ""
        except CorruptCheckpointError as e:
            result, said = None, "damaged:" + printable(str(e))
        except Exception as e:
            self._gather(step, info, "error:" + printable(str(e).splitlines()[0] if str(e) else repr(e)))
            raise
        answers = self._gather(step, info, said)
        for index, answer in enumerate(answers):
            kind, _, text = answer.partition(":")
            if kind == "error":
                raise ResumableError(f"process {index} could not {step} {info.url}: {text}")
        damaged = [(index, answer.partition(":")[2]) for index, answer in enumerate(answers) if answer]
        if damaged:
            index, text = damaged[0]
            mine = index == self.channel.process_index
            self.warn(text if mine else f"{text} (found by process {index})")
            self.manager.mark_damaged(info.name)
            return None
        return result

    def _gather(self, step: str, info: CheckpointInfo, said: str) -> list[str]:
        self._step += 1
        return all_gather(self.channel, f"resume/{self._step}", said, self.timeout,
                          what=f"every process to {step} {info.name}")

    def _from_chief(self, key: str, value: str) -> str:
        self._step += 1
        key = f"resume/{self._step}/{key}"
        if self.channel.process_index == 0:
            self.channel.put(key, value)
            return value
        return gather(self.channel, [key], self.timeout, what="process 0's choice of checkpoint",
                      processes=[0])[0]


__all__ = ["JaxChannel", "JobResume", "channel", "holds", "load_model",
           "split_across_processes"]
