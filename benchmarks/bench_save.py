"""What checkpoints cost training, against Keras' own savers, and how long a resume takes.

Six configurations train the same functional model (``keras.Input`` -> ``Dense`` -> ``Dense`` ->
``Dense(10)``, about ``--params`` parameters, Adam, synthetic data), each from the same initial
weights, on TensorFlow and on JAX (one process per backend):

- ``none``:          no checkpoints
- ``keras``:         ``keras.callbacks.ModelCheckpoint``, a ``.keras`` file in a local folder
- ``orbax``:         ``keras.callbacks.OrbaxCheckpoint`` to a local folder (background saves)
- ``orbax-gcs``:     the same to ``gs://`` on fake-gcs-server
- ``resumable``:     ``resumable.CheckpointCallback`` to a local folder
- ``resumable-gcs``: the same to ``gs://`` on fake-gcs-server
- ``resumable-budget-F``: ``resumable`` with ``snapshot_memory`` F x the checkpoint (its variables'
  bytes, + 1 MiB for the training state), F = 0, 0.25, 1 (#54): what a save over its memory
  budget costs: what fits copied, the rest written while training waits, one variable at a time
- ``resumable-tier``, ``resumable-gcs-tier``: ``resumable`` and ``resumable-gcs`` with a local tier
  (#55) in a local folder, saved every ``--steps // 2`` steps: one more save per epoch, mid-epoch
  (the epoch end is the durable tier's). A stress test: far above the default rate
- ``resumable-tier-timed``: ``resumable`` with a local tier saved on its own clock, every
  ``--tier-seconds`` of training (default 60, ``local_tier=True``'s): the rate a user gets when the
  epochs are long enough to hold a save (see docs/benchmarks.md for the run that measures it)

Every one saves at every epoch end and keeps the last two (ModelCheckpoint overwrites one file).
The model is functional because on a ``Sequential`` model Keras 3.15's Orbax load path silently
restores only the step counter. The Orbax configurations are skipped when ``orbax-checkpoint``
is not installed.

The configurations run in rounds (``--rounds``), in an order rotated each round so that a busy
moment of the machine hits all of them. Per round and configuration: the epoch time (median over
epochs 2 to N: the first traces the graph), the time training is blocked per save (inside the
checkpoint callback's epoch and batch hooks, median over saves 2 to N), the wait at the end of
training, the peak RSS above the baseline from the start of one save to the start of the next
(a background write included), the checkpoint's size, and the CPU seconds per epoch of this
process and of the emulator. Then, each in a rotated order: ``resume()`` with and without
``build_model`` from the local and the ``gs://`` run, against a bare ``keras.saving.load_model``
of the same local ``.keras`` file and a bare gcsfs ``get_file`` + ``load_model`` of the same
object, and ``keras.saving.load_model`` of the local Orbax folder (Keras 3.15 loads its newest
step). Loading an Orbax checkpoint back from the emulator needs TensorFlow's gfile: not timed.
Ratios are taken within a round and reported, like every metric, as median [min-max] over rounds.

Usage::

    python benchmarks/bench_save.py --write-docs      # both backends, 25M parameters; into docs/benchmarks.md
    python benchmarks/bench_save.py --tiny            # a small model, one round: what the tests run
    python benchmarks/bench_save.py --backend jax --configs keras,orbax,resumable --rounds 3
    python benchmarks/bench_save.py --emulator-cpu 1  # the emulator on CPU 1, training on the others

Uses the emulator at ``STORAGE_EMULATOR_HOST`` when set, else starts its own fake-gcs-server.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).parent))

from bench_list import emulator  # noqa: E402

from resumable.core.display import format_table  # noqa: E402

DOCS = Path(__file__).parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench_save: begin -->", "<!-- bench_save: end -->"
BACKENDS = ("tensorflow", "jax")
BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}

CONFIGS = {
    "none": "no checkpoints",
    "keras": "ModelCheckpoint .keras, local",
    "orbax": "OrbaxCheckpoint, local",
    "orbax-gcs": "OrbaxCheckpoint, gs://",
    "resumable": "resumable, local",
    "resumable-gcs": "resumable, gs://",
    "resumable-budget-0": "resumable, local, memory budget 0",
    "resumable-budget-0.25": "resumable, local, memory budget 0.25x",
    "resumable-budget-1": "resumable, local, memory budget 1x",
    "floor": "floor: the bytes written once, in a thread",
    "resumable-tier": "resumable, local, + local tier",
    "resumable-gcs-tier": "resumable, gs://, + local tier",
    "resumable-tier-timed": "resumable, local, + local tier on its clock",
}
TIER = "-tier"  # + a local tier (#55), saved mid-epoch
TIMED_TIER = "resumable-tier-timed"  # + a local tier every --tier-seconds of training (#55)
ORBAX = ("orbax", "orbax-gcs")
KEEP = 2  # checkpoints kept: Orbax's max_to_keep, resumable's keep_last
BUDGET = "resumable-budget-"  # + the budget, x the checkpoint's variables' bytes
STATE_ROOM = 2**20  # a budget's room for the training state beside the variables

# Resume measures: the first three load the `resumable` configuration's checkpoint, the next three
# `resumable-gcs`'s, the last `orbax`'s.
RESUMES = {
    "load_model": "keras.saving.load_model, local .keras",
    "resume+build": "resume(local, build_model)",
    "resume": "resume(local)",
    "gcsfs+load": "gcsfs get_file + load_model, gs://",
    "resume-gcs+build": "resume(gs://, build_model)",
    "resume-gcs": "resume(gs://)",
    "orbax-load": "keras.saving.load_model, Orbax folder",
}

# Issue #24's targets.
BLOCKED_TARGET = 0.1  # blocked per save, x ModelCheckpoint's local .keras save
RSS_TARGET, RSS_CONSTANT_MB = 1.2, 64  # peak RSS over baseline <= 1.2x the checkpoint + 64 MB
EPOCH_TARGET = 1.05  # epoch time saving every epoch to a local folder, x training without checkpoints
TIER_TARGET = 1.05  # #55: epoch time with the local tier on, x off
RESUME_LOCAL_TARGET = 1.1  # resume(), x a bare load_model of the same file
RESUME_GCS_TARGET = 1.0  # resume() from gs://, x a bare gcsfs get_file + load_model


class RSS:
    """Samples this process' resident set size every few milliseconds in a thread."""

    def __init__(self) -> None:
        self.peak = self.base = self.now()
        self._lock = threading.Lock()  # a window's reset must not be overwritten by an older peak
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            with self._lock:
                self.peak = max(self.peak, self.now())

    def window(self) -> int:
        """Start a window: the peak restarts from now; returns the baseline."""
        with self._lock:
            self.peak = self.base = self.now()
        return self.base

    def over(self) -> float:
        """MB the peak of the current window stands above its baseline."""
        return (self.peak - self.base) / 2**20

    def stop(self) -> None:
        self._stop.set()


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.backend == "both":
        results = [run_child(args, backend) for backend in BACKENDS]
    else:
        results = [measure(args)]
        if args.json:  # a child of --backend both: the parent reports
            Path(args.json).write_text(json.dumps(results[0]))
            return 0
    report = render(results, args)
    print()
    print(report)
    if args.write_docs:
        write_docs(report)
        print(f"\nwritten to {DOCS}")
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both",
                        help="Keras backend; both: one process each, one report (default both)")
    parser.add_argument("--params", type=float, default=25e6, help="model parameters (default 25e6)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per configuration and round (default 3)")
    parser.add_argument("--steps", type=int, default=8, help="batches per epoch (default 8)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--tier-seconds", type=float, default=60.0,
                        help=f"{TIMED_TIER}: its local tier's every_seconds (default 60, the default)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over every configuration (default 5)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"configurations to run (default all: {','.join(CONFIGS)})")
    parser.add_argument("--tiny", action="store_true", help="a small model, one round: proves it works")
    parser.add_argument("--emulator-nice", type=int, default=0, metavar="N",
                        help="run the emulator at nice N: on one machine, its CPU competes with training, "
                             "which a remote server's does not (default 0)")
    parser.add_argument("--emulator-cpu", type=int, default=None, metavar="N",
                        help="pin the emulator to CPU N and training to the others (default: not pinned)")
    parser.add_argument("--write-docs", action="store_true", help=f"put the report into {DOCS.name}")
    parser.add_argument("--json", help=argparse.SUPPRESS)  # where a child of --backend both puts its results
    args = parser.parse_args(argv)
    if args.tiny:
        args.params, args.epochs, args.steps, args.rounds = 2e5, 3, 4, 1
    if args.epochs < 3 or args.steps < 1 or args.rounds < 1:
        parser.error("--epochs must be >= 3 (the first is left out), --steps and --rounds >= 1")
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not set(args.configs) <= set(CONFIGS) or len(args.configs) != len(set(args.configs)):
        parser.error(f"--configs: some of {','.join(CONFIGS)}, each once")
    if args.emulator_cpu is not None:
        cpus = os.sched_getaffinity(0)
        if args.emulator_cpu not in cpus or len(cpus) < 2:
            parser.error(f"--emulator-cpu: CPU {args.emulator_cpu} is not one of this process' "
                         f"{sorted(cpus)}, or it is the only one")
    return args


def run_child(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """Measure one backend in a fresh process: KERAS_BACKEND counts only before Keras is imported."""
    with tempfile.TemporaryDirectory(prefix="bench-save-") as tmp:
        out = Path(tmp) / "results.json"
        command = [sys.executable, __file__, "--backend", backend, "--json", str(out),
                   "--params", str(args.params), "--epochs", str(args.epochs), "--steps", str(args.steps),
                   "--batch-size", str(args.batch_size), "--rounds", str(args.rounds),
                   "--tier-seconds", str(args.tier_seconds),
                   "--configs", ",".join(args.configs), "--emulator-nice", str(args.emulator_nice)]
        if args.emulator_cpu is not None:
            command += ["--emulator-cpu", str(args.emulator_cpu)]
        if subprocess.run(command).returncode != 0:
            raise SystemExit(f"bench_save: the {backend} run failed")
        return dict(json.loads(out.read_text()))


# ----------------------------------------------------------------------------- one backend


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every round of every configuration on ``args.backend``, in this process."""
    os.environ["KERAS_BACKEND"] = args.backend
    server_cpus = None
    if args.emulator_cpu is not None:
        server_cpus = {args.emulator_cpu}
        os.sched_setaffinity(0, os.sched_getaffinity(0) - server_cpus)  # before thread pools are sized
    configs = list(args.configs)
    skipped = None
    orbax = importlib.util.find_spec("orbax") is not None and importlib.util.find_spec("orbax.checkpoint")
    if not orbax and any(c in ORBAX for c in configs):
        skipped = "orbax-checkpoint is not installed: OrbaxCheckpoint configurations skipped"
        print(f"[{args.backend}] {skipped}", flush=True)
        configs = [c for c in configs if c not in ORBAX]
    rss = RSS()
    with emulator(args.emulator_nice, server_cpus) as endpoint, \
            tempfile.TemporaryDirectory(prefix="bench-save-") as tmp:
        # Orbax reaches gs:// through etils and tensorstore, not gcsfs: point them at the emulator too.
        os.environ.update(EPATH_USE_TF="false", TENSORSTORE_GCS_HTTP_URL=endpoint,
                          GOOGLE_AUTH_TOKEN_FOR_TESTING="anon")
        bench = Bench.start(args, tmp, rss, _emulator_process(endpoint))
        print(f"[{args.backend}] fake-gcs-server at {endpoint}; model: {bench.params / 1e6:.1f}M parameters, "
              f"Adam; {args.rounds} round(s) of {', '.join(configs)}", flush=True)
        rounds = [bench.round(number, rotated(configs, number)) for number in range(args.rounds)]
    rss.stop()
    return {"backend": args.backend, "versions": versions(args.backend, orbax=bool(orbax)),
            "params": bench.params, "configs": configs, "skipped": skipped, "rounds": rounds,
            "steps": args.steps, "tier_seconds": args.tier_seconds}


def rotated(items: list[str], number: int) -> list[str]:
    """Round ``number``'s order: each round starts one item later."""
    shift = number % len(items) if items else 0
    return items[shift:] + items[:shift]


def versions(backend: str, orbax: bool) -> dict[str, str]:
    """The installed versions of Keras, the backend and (when used) Orbax, by package name."""
    found = {}
    packages = [("keras", ["keras"]), (backend, [backend, f"{backend}-cpu"])]
    for name, distributions in packages + ([("orbax-checkpoint", ["orbax-checkpoint"])] if orbax else []):
        for distribution in distributions:  # TensorFlow's CPU build is tensorflow-cpu
            try:
                found[name] = version(distribution)
                break
            except PackageNotFoundError:
                continue
    return found


@dataclass
class Bench:
    """What every round shares: the model, the data, the folders and the meters."""

    args: argparse.Namespace
    tmp: str
    bucket: str
    fs: Any  # gcsfs.GCSFileSystem
    build: Callable[[], Any]
    x: Any
    y: Any
    params: int
    rss: RSS
    emulator_pid: int | None
    checkpoint_bytes: int = 0  # the model's and optimizer's variables: what a snapshot copies

    @classmethod
    def start(cls, args: argparse.Namespace, tmp: str, rss: RSS, emulator_pid: int | None) -> Bench:
        import gcsfs
        import keras
        import numpy as np

        logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax logs a warning per save
        warnings.filterwarnings("ignore", message="Sharding info not provided")  # Orbax on JAX, per load
        width = int(math.sqrt(args.params / 1.25))  # features = width / 4: params ~ 1.25 width^2
        features = max(width // 4, 8)

        def build() -> keras.Model:
            keras.utils.set_random_seed(1)  # the same initial weights for every configuration
            inputs = keras.Input((features,))
            hidden = keras.layers.Dense(width, activation="relu")(inputs)
            hidden = keras.layers.Dense(width, activation="relu")(hidden)
            model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
            model.compile(optimizer="adam",
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return model

        rng = np.random.default_rng(0)
        samples = args.steps * args.batch_size
        x = rng.normal(size=(samples, features)).astype("float32")
        y = rng.integers(0, 10, size=(samples,))
        fs = gcsfs.GCSFileSystem(token="anon")
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        fs.mkdir(bucket)
        model = build()
        model.optimizer.build(model.trainable_variables)
        held = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                   for v in model.weights + model.optimizer.variables)
        return cls(args, tmp, bucket, fs, build, x, y, model.count_params(), rss, emulator_pid, held)

    # -- folders and callbacks

    def folder(self, config: str, number: int) -> str:
        if config.endswith("-gcs") or config.endswith("-gcs" + TIER):
            return f"gs://{self.bucket}/round{number}/{config}"
        return f"{self.tmp}/round{number}/{config}"

    def checkpoint(self, config: str, number: int) -> Any:
        """A new callback for ``config`` (None: no checkpoints)."""
        import keras

        import resumable

        folder = self.folder(config, number)
        if config == "keras":
            return keras.callbacks.ModelCheckpoint(f"{folder}/last.keras", save_freq="epoch")
        if config in ORBAX:
            return keras.callbacks.OrbaxCheckpoint(folder, save_freq="epoch", max_to_keep=KEEP)
        if config.startswith("resumable"):
            budget = (int(float(config.removeprefix(BUDGET)) * self.checkpoint_bytes) + STATE_ROOM
                      if config.startswith(BUDGET) else "auto")
            local = f"{self.tmp}/round{number}/local-{config}"
            tier: Any = False
            if config.endswith(TIER):
                tier = resumable.LocalTier(folder=local, every_seconds=None,
                                           every_steps=max(1, self.args.steps // 2))
            elif config == TIMED_TIER:
                tier = resumable.LocalTier(folder=local, every_seconds=self.args.tier_seconds)
            return resumable.CheckpointCallback(folder, monitor="loss", keep_last=KEEP,
                                                staging_dir=f"{self.tmp}/round{number}/stage-{config}",
                                                snapshot_memory=budget, local_tier=tier)
        if config == "floor":
            return floor_writer(folder)
        return None

    def size_mb(self, config: str, number: int) -> float | None:
        """The newest checkpoint's bytes, in MB (None: no checkpoints)."""
        import resumable

        folder = self.folder(config, number)
        if config == "keras":
            return os.path.getsize(f"{folder}/last.keras") / 2**20
        if config.startswith("resumable"):
            latest = resumable.RunStorage(folder).latest()
            assert latest is not None, folder
            return latest.size / 2**20
        if config == "floor":
            return os.path.getsize(f"{folder}/values.bin") / 2**20
        if config == "orbax":
            step = max(p for p in Path(folder).iterdir() if p.name.isdigit())
            return sum(f.stat().st_size for f in step.rglob("*") if f.is_file()) / 2**20
        if config == "orbax-gcs":
            self.fs.invalidate_cache()  # Orbax wrote through a client of its own
            steps = [p for p in self.fs.ls(folder.removeprefix("gs://")) if p.rsplit("/", 1)[-1].isdigit()]
            return self.fs.du(max(steps, key=lambda p: int(p.rsplit("/", 1)[-1]))) / 2**20
        return None

    # -- one round

    def round(self, number: int, order: list[str]) -> dict[str, Any]:
        """Train every configuration of ``order``, time the resumes, free the round's checkpoints."""
        tag = f"[{self.args.backend}] round {number + 1}/{self.args.rounds}"
        train: dict[str, dict[str, float | None]] = {}
        for config in order:
            train[config] = self.train(config, number)
            print(f"{tag}, {CONFIGS[config]}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in train[config].items() if v is not None), flush=True)
        measures = self.resumes(number, set(order))
        resume = {}
        for what in rotated(list(measures), number):
            gc.collect()  # not inside the timing
            started = time.perf_counter()
            measures[what]()
            resume[what] = time.perf_counter() - started
        if resume:
            print(f"{tag}, resume: " + ", ".join(f"{k} {v:.2f} s" for k, v in resume.items()), flush=True)
        shutil.rmtree(f"{self.tmp}/round{number}", ignore_errors=True)
        if self.fs.exists(f"{self.bucket}/round{number}"):
            self.fs.rm(f"{self.bucket}/round{number}", recursive=True)  # the emulator keeps it in memory
        return {"order": order, "train": train, "resume": resume}

    def train(self, config: str, number: int) -> dict[str, float | None]:
        import keras

        keras.backend.clear_session()
        gc.collect()
        model = self.build()
        checkpoint = self.checkpoint(config, number)
        meter = Meter(self.rss, self.emulator_pid)
        callbacks = [meter.callback()]  # first: its epoch marks come before the checkpoint's hooks
        if checkpoint is not None:
            callbacks.append(meter.timed(checkpoint))
        local_saves = count_local_saves(checkpoint)
        model.fit(self.x, self.y, batch_size=self.args.batch_size, epochs=self.args.epochs, shuffle=False,
                  verbose=0, callbacks=callbacks)
        meter.close_window()  # after on_train_end: the last save's background write is in it
        result = meter.result(saved=checkpoint is not None)
        result["local_saves"] = float(len(local_saves)) if local_saves is not None else None
        result["size_mb"] = self.size_mb(config, number)
        return result

    def resumes(self, number: int, ran: set[str]) -> dict[str, Callable[[], None]]:
        """The resume measures whose checkpoints this round made, each a function of no arguments."""
        import keras

        import resumable

        epochs = self.args.epochs

        def resume(config: str, build: bool, key: str) -> Callable[[], None]:
            def call() -> None:  # a fresh staging folder: a cold cache
                run = resumable.resume(self.folder(config, number), build_model=self.build if build else None,
                                       monitor="loss", staging_dir=f"{self.tmp}/round{number}/cache-{key}")
                assert run.initial_epoch == epochs, run
            return call

        def newest_model_file(config: str) -> str:
            latest = resumable.RunStorage(self.folder(config, number)).latest()
            assert latest is not None
            return f"{self.folder(config, number)}/{latest.name}/model.keras"

        def gcsfs_get_and_load(remote: str) -> Callable[[], None]:
            def call() -> None:
                local = f"{self.tmp}/round{number}/bare.keras"
                self.fs.get_file(remote, local)
                keras.saving.load_model(local)
                os.unlink(local)
            return call

        measures: dict[str, Callable[[], None]] = {}
        if "resumable" in ran:
            local_file = newest_model_file("resumable")
            measures["load_model"] = lambda: keras.saving.load_model(local_file)
            measures["resume+build"] = resume("resumable", True, "local-build")
            measures["resume"] = resume("resumable", False, "local")
        if "resumable-gcs" in ran:
            measures["gcsfs+load"] = gcsfs_get_and_load(newest_model_file("resumable-gcs"))
            measures["resume-gcs+build"] = resume("resumable-gcs", True, "gcs-build")
            measures["resume-gcs"] = resume("resumable-gcs", False, "gcs")
        if "orbax" in ran:
            orbax_folder = self.folder("orbax", number)
            measures["orbax-load"] = lambda: keras.saving.load_model(orbax_folder)  # its newest step
        return measures


def count_local_saves(checkpoint: Any) -> list[int] | None:
    """The steps ``checkpoint``'s local tier saves at, filled in as they happen (None: no local tier)."""
    saver = getattr(checkpoint, "local_saves", None)
    if saver is None or saver.tier is None:
        return None
    steps: list[int] = []
    save = saver._save  # noqa: SLF001 - a benchmark counts what the library does not report

    def counted(callback: Any, siblings: Any, step: int, *args: Any) -> None:
        save(callback, siblings, step, *args)
        steps.append(step)

    saver._save = counted  # noqa: SLF001
    return steps


class Meter:
    """Epoch marks, time inside a checkpoint callback's hooks, and RSS windows of one fit."""

    def __init__(self, rss: RSS, emulator_pid: int | None) -> None:
        self.rss, self.emulator_pid = rss, emulator_pid
        self.begins: list[float] = []
        self.cpu_here: list[float] = []
        self.cpu_emulator: list[float] = []
        self.blocked: list[float] = []  # per epoch: seconds inside the checkpoint callback's hooks
        # per epoch: seconds from its begin hooks' end to its first batch: TensorFlow starting the
        # epoch's input iterator, which on this machine stalls ~5 s at random in plain model.fit too
        self.input_start: list[float] = []
        self._epoch_hooks_done = 0.0  # when the checkpoint's on_epoch_begin returned
        self.peaks: list[int] = []  # per save: peak RSS over the baseline, until the next save
        self.wait = 0.0  # on_train_end: the last background save
        self._base: int | None = None

    def mark(self) -> None:
        self.begins.append(time.perf_counter())
        self.cpu_here.append(_cpu_seconds(None))
        if self.emulator_pid is not None:  # not ours to see when STORAGE_EMULATOR_HOST was given
            self.cpu_emulator.append(_cpu_seconds(self.emulator_pid))

    def open_window(self) -> None:
        """At an epoch end, before any save: the previous save's window ends, this one's begins."""
        self.close_window()
        self._base = self.rss.window()

    def close_window(self) -> None:
        if self._base is not None:
            self.peaks.append(self.rss.peak - self._base)
            self._base = None

    def callback(self) -> Any:
        """The callback that marks epochs and opens RSS windows (no batch hook: Keras may then
        dispatch batches asynchronously, as it would for training without checkpoints)."""
        import keras

        meter = self

        class Marks(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                meter.mark()
                meter.blocked.append(0.0)
                meter._epoch_hooks_done = time.perf_counter()  # moved on by a timed on_epoch_begin
                self.first = True

            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                # a begin hook leaves Keras' asynchronous dispatch of batch ends as it is
                if self.first:
                    self.first = False
                    meter.input_start.append(time.perf_counter() - meter._epoch_hooks_done)

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                meter.open_window()

            def on_train_end(self, logs: Any = None) -> None:
                meter.mark()

        return Marks()

    def timed(self, checkpoint: Any) -> Any:
        """``checkpoint`` with the hooks its class defines timed (the hooks it leaves to Keras'
        no-op defaults stay untouched: wrapping a batch hook would change Keras' dispatch)."""
        import keras

        def add_to_epoch(hook: Callable[..., Any], name: str) -> Callable[..., Any]:
            def timed_hook(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return hook(*args, **kwargs)
                finally:
                    self.blocked[-1] += time.perf_counter() - started
                    if name == "on_epoch_begin":
                        self._epoch_hooks_done = time.perf_counter()
            return timed_hook

        for name in ("on_epoch_begin", "on_train_batch_begin", "on_train_batch_end", "on_epoch_end"):
            if getattr(type(checkpoint), name) is not getattr(keras.callbacks.Callback, name):
                setattr(checkpoint, name, add_to_epoch(getattr(checkpoint, name), name))
        train_end = checkpoint.on_train_end

        def timed_train_end(logs: Any = None) -> None:
            started = time.perf_counter()
            train_end(logs)
            self.wait = time.perf_counter() - started

        checkpoint.on_train_end = timed_train_end
        return checkpoint

    def result(self, saved: bool) -> dict[str, float | None]:
        def per_epoch(marks: list[float], less: list[float] | None = None) -> float | None:
            if not marks:  # the first epoch traces the graph: left out
                return None
            spans = [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]
            if less is not None:
                spans = [span - start for span, start in zip(spans, less, strict=True)]
            return statistics.median(spans[1:])

        return {
            # the epoch less its input's start: the same in every configuration, and on TensorFlow
            # here a random ~5 s stall that made one epoch in three of any configuration twice as long
            "epoch_s": per_epoch(self.begins, self.input_start),
            "input_start_s": statistics.median(self.input_start[1:]),
            "input_start_max_s": max(self.input_start[1:]),
            "blocked_s": statistics.median(self.blocked[1:]) if saved else None,
            "wait_s": self.wait if saved else None,
            # what fit waits for the last save in all: its epoch end's share, then on_train_end
            "last_save_s": self.blocked[-1] + self.wait if saved else None,
            "peak_rss_mb": max(self.peaks) / 2**20,
            "cpu_here_s": per_epoch(self.cpu_here),
            "cpu_emulator_s": per_epoch(self.cpu_emulator),
        }


def floor_writer(folder: str) -> Any:
    """What any checkpointer must do at least: at each epoch's end take the values to the host
    (a copy on TensorFlow, none on JAX's CPU) and write their bytes once to a local file, fsynced,
    in a thread. No format, no checksum, no second copy: the floor the other rows are held to."""
    import threading

    import keras
    import numpy as np

    class FloorWriter(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.thread: threading.Thread | None = None

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self.thread is not None:
                self.thread.join()
            values = [np.asarray(keras.ops.convert_to_numpy(v))
                      for v in self.model.weights + self.model.optimizer.variables]
            self.thread = threading.Thread(target=self.write, args=(values,))
            self.thread.start()

        def on_train_end(self, logs: Any = None) -> None:
            if self.thread is not None:
                self.thread.join()

        @staticmethod
        def write(values: list[Any]) -> None:
            os.makedirs(folder, exist_ok=True)
            with open(f"{folder}/values.bin", "wb") as f:
                for value in values:
                    f.write(memoryview(np.ascontiguousarray(value)).cast("B"))
                f.flush()
                os.fsync(f.fileno())

    return FloorWriter()


def _emulator_process(endpoint: str) -> int | None:
    """The pid of the fake-gcs-server child serving ``endpoint``, if this process started it."""
    port = endpoint.rsplit(":", 1)[-1]
    for child in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (child / "cmdline").read_bytes().split(b"\0")
            parent = int((child / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"fake-gcs-server" in cmdline[0] and port.encode() in cmdline:
            return int(child.name)
    return None


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of this process (pid None) or of process ``pid`` (0.0 if unknown)."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


# ----------------------------------------------------------------------------- report


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    """``median [min-max]`` of ``values`` (just the value when there is one; ``-`` for none)."""
    if not values:
        return "-"
    middle = fmt(statistics.median(values))
    return middle if len(values) == 1 else f"{middle} [{fmt(min(values))}-{fmt(max(values))}]"


def seconds(v: float) -> str:
    return f"{v:.3f}" if v < 0.1 else f"{v:.2f}"


def times(v: float) -> str:
    return f"{v:.3f}x" if v < 0.1 else f"{v:.2f}x"


def megabytes(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def values(result: dict[str, Any], config: str, metric: str) -> list[float]:
    """``metric`` of ``config`` in every round that has it."""
    found = [r["train"].get(config, {}).get(metric) for r in result["rounds"]]
    return [v for v in found if v is not None]


def ratios(result: dict[str, Any], config: str, metric: str, base: str, base_metric: str | None = None
           ) -> list[float]:
    """Per round, ``config``'s ``metric`` over ``base``'s (``base_metric``, by default the same)."""
    out = []
    for r in result["rounds"]:
        a = r["train"].get(config, {}).get(metric)
        b = r["train"].get(base, {}).get(base_metric or metric)
        if a is not None and b:
            out.append(a / b)
    return out


def resume_ratios(result: dict[str, Any], what: str, base: str) -> list[float]:
    return [r["resume"][what] / r["resume"][base] for r in result["rounds"]
            if what in r["resume"] and r["resume"].get(base)]


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    first = results[0]
    found = {k: val for result in results for k, val in result["versions"].items()}
    v = {k: found[k] for k in ("keras", *BACKENDS, "orbax-checkpoint") if k in found}
    emulator = "fake-gcs-server (memory backend) on loopback"
    if args.emulator_nice:
        emulator += f", at nice {args.emulator_nice}"
    if args.emulator_cpu is not None:
        emulator += f", pinned to CPU {args.emulator_cpu} (training on the others)"
    lines = [
        f"Run {date.today().isoformat()} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, " + ", ".join(f"{k} {val}" for k, val in v.items()) + f"; {emulator}. "
        f"Backends: {', '.join(BACKEND_NAMES[r['backend']] for r in results)}. A functional MLP of "
        f"{first['params'] / 1e6:.1f}M parameters with Adam; {args.epochs} epochs of {args.steps} batches "
        f"of {args.batch_size} per configuration and round; {args.rounds} round(s), configurations in a "
        f"rotated order. Cells: median [min-max] over rounds; ratios taken within each round. Epoch: "
        f"median over epochs 2 to {args.epochs}, each less its input's start (the gap between the epoch's "
        f"begin hooks and its first batch: Keras starting the input iterator, the same work in every "
        f"configuration; its longest per fit in 'input start, max'); blocked: median over saves 2 to "
        f"{args.epochs}.",
    ]
    for result in results:
        lines += ["", f"**{BACKEND_NAMES[result['backend']]}**", ""]
        if result["skipped"]:
            lines += [f"({result['skipped']}.)", ""]
        lines += ["```", *training_table(result), "", *ratio_table(result)]
        if any(r["resume"] for r in result["rounds"]):
            lines += ["", *resume_table(result)]
        lines += ["```", "", *target_lines(result)]
    return "\n".join(lines)


def training_table(result: dict[str, Any]) -> list[str]:
    rows = []
    for config in (c for c in CONFIGS if c in result["configs"]):
        def cell(metric: str, fmt: Callable[[float], str], config: str = config) -> str:
            return spread(values(result, config, metric), fmt)
        rows.append([CONFIGS[config], cell("epoch_s", seconds), cell("blocked_s", seconds),
                     cell("wait_s", seconds), cell("last_save_s", seconds),
                     cell("peak_rss_mb", megabytes), cell("size_mb", megabytes),
                     cell("cpu_here_s", seconds), cell("cpu_emulator_s", seconds),
                     cell("input_start_max_s", seconds)])
    return format_table(["configuration", "epoch (s)", "blocked per save (s)", "wait at end (s)",
                         "last save, all waited (s)", "peak RSS over baseline (MB)", "checkpoint (MB)",
                         "CPU/epoch here (s)", "CPU/epoch emulator (s)", "input start, max (s)"], rows,
                        right=set(range(1, 10)))


def ratio_table(result: dict[str, Any]) -> list[str]:
    rows = []
    for config in (c for c in CONFIGS if c in result["configs"]):
        def cell(metric: str, base: str, base_metric: str | None = None, config: str = config) -> str:
            return spread(ratios(result, config, metric, base, base_metric), times)
        rows.append([CONFIGS[config], cell("epoch_s", "none"), cell("epoch_s", "keras"),
                     cell("epoch_s", "orbax"), cell("blocked_s", "keras"), cell("blocked_s", "orbax"),
                     cell("peak_rss_mb", "keras"), cell("peak_rss_mb", "orbax"),
                     cell("peak_rss_mb", config, "size_mb")])
    return format_table(["ratios", "epoch / none", "epoch / MC", "epoch / Orbax", "blocked / MC",
                         "blocked / Orbax", "peak RSS / MC", "peak RSS / Orbax", "peak RSS / checkpoint"],
                        rows, right=set(range(1, 9)))


def resume_table(result: dict[str, Any]) -> list[str]:
    rows = []
    ran = {what for r in result["rounds"] for what in r["resume"]}
    for what in (w for w in RESUMES if w in ran):
        rows.append([RESUMES[what], spread([r["resume"][what] for r in result["rounds"]], seconds),
                     *(spread(resume_ratios(result, what, base), times)
                       for base in ("load_model", "gcsfs+load", "orbax-load"))])
    return format_table(["load", "time (s)", "/ load_model, local", "/ gcsfs get + load", "/ Orbax load"],
                        rows, right={1, 2, 3, 4})


def target_lines(result: dict[str, Any]) -> list[str]:
    """Issues #24's and #35's targets, each met or not by the median over rounds."""
    def verdict(found: list[float], target: float) -> str:
        return "met" if statistics.median(found) <= target else "not met"

    lines = []
    for config, where in (("resumable", "local folder"), ("resumable-gcs", "gs://")):
        found = ratios(result, config, "blocked_s", "keras")
        if found:
            lines.append(f"- blocked per save, resumable to a {where} / ModelCheckpoint: "
                         f"{spread(found, times)} (target <= {BLOCKED_TARGET}x: "
                         f"{verdict(found, BLOCKED_TARGET)})")
    alone = values(result, "none", "peak_rss_mb")
    for config in ("resumable", "resumable-gcs"):
        peak, size = values(result, config, "peak_rss_mb"), values(result, config, "size_mb")
        if peak and size:
            limit = RSS_TARGET * statistics.median(size) + RSS_CONSTANT_MB
            lines.append(f"- peak RSS over baseline, {CONFIGS[config]}: {spread(peak, megabytes)} MB for a "
                         f"{megabytes(statistics.median(size))} MB checkpoint (target <= {RSS_TARGET}x + "
                         f"{RSS_CONSTANT_MB} MB = {limit:.0f} MB: "
                         f"{'met' if statistics.median(peak) <= limit else 'not met'}"
                         + (f"; training alone: {spread(alone, megabytes)} MB" if alone else "") + ")")
    found = ratios(result, "resumable", "epoch_s", "none")
    floor = ratios(result, "floor", "epoch_s", "none")
    if found:
        lines.append(f"- epoch time, resumable to a local folder / no checkpoints: {spread(found, times)} "
                     f"(target <= {EPOCH_TARGET}x: {verdict(found, EPOCH_TARGET)}"
                     + (f"; the floor, the bytes written once in a thread: {spread(floor, times)}"
                        if floor else "") + ")")
    found = ratios(result, "resumable-gcs", "epoch_s", "none")
    if found:
        cpu = values(result, "resumable-gcs", "cpu_emulator_s")
        lines.append(f"- epoch time, resumable to gs:// / no checkpoints: {spread(found, times)} (no target: "
                     f"the emulator shares this machine; its own CPU "
                     f"{spread(cpu, seconds) + ' s' if cpu else 'not seen'} per epoch)")
    # #35: no slower than either peer (ModelCheckpoint saves synchronously: nothing waits at its end)
    for metric, name, peers in (("epoch_s", "epoch time", ("keras", "orbax")),
                                ("wait_s", "wait at the end of fit", ("orbax",)),
                                ("last_save_s", "last save, all fit waited for it", ("orbax",))):
        for peer in peers:
            found = ratios(result, "resumable", metric, peer)
            if found:
                lines.append(f"- {name}: resumable to a local folder / {CONFIGS[peer]}: "
                             f"{spread(found, times)} (target <= 1x: {verdict(found, 1.0)})")
    for metric, name in (("wait_s", "wait at the end of fit"),
                         ("last_save_s", "last save, all fit waited for it")):
        found = ratios(result, "resumable-gcs", metric, "orbax-gcs")
        if found:
            lines.append(f"- {name}: resumable to gs:// / {CONFIGS['orbax-gcs']}: {spread(found, times)} "
                         f"(target <= 1x: {verdict(found, 1.0)})")
    for config in ("resumable", "resumable-gcs"):  # #55: the local tier's cost
        found = ratios(result, config + TIER, "epoch_s", config)
        if found:
            lines.append(f"- epoch time, {CONFIGS[config]}: local tier on / off (stress: a local save every "
                         f"{max(1, result.get('steps', 2) // 2)} steps): {spread(found, times)} "
                         f"(target <= {TIER_TARGET}x: {verdict(found, TIER_TARGET)})")
    found = ratios(result, TIMED_TIER, "epoch_s", "resumable")
    if found:
        saves = values(result, TIMED_TIER, "local_saves")
        lines.append(f"- epoch time, {CONFIGS['resumable']}: local tier on / off (a local save every "
                     f"{result.get('tier_seconds', 60.0):g} s of training; {spread(saves, megabytes)} local "
                     f"saves per fit): {spread(found, times)} (target <= {TIER_TARGET}x: "
                     f"{verdict(found, TIER_TARGET)})")
    for what, base, target in (("resume+build", "load_model", RESUME_LOCAL_TARGET),
                               ("resume", "load_model", RESUME_LOCAL_TARGET),
                               ("resume-gcs+build", "gcsfs+load", RESUME_GCS_TARGET),
                               ("resume-gcs", "gcsfs+load", RESUME_GCS_TARGET)):
        found = resume_ratios(result, what, base)
        if found:
            lines.append(f"- {RESUMES[what]} / {RESUMES[base]}: {spread(found, times)} "
                         f"(target <= {target}x: {verdict(found, target)})")
    return lines


def write_docs(report: str) -> None:
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOCS}: markers {BEGIN} ... {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOCS.write_text(f"{head}{BEGIN}\n{report}\n{END}{tail}")


if __name__ == "__main__":
    sys.exit(main())
