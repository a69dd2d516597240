"""What saving costs a multi-host job whose model is split across processes, against OrbaxCheckpoint.

Each configuration runs as one JAX program of ``--processes`` processes on 127.0.0.1 (each with
``--devices`` XLA CPU devices, ``jax.distributed`` and collectives over gloo), training the same
MLP under ``keras.distribution.ModelParallel``: a mesh of every process's devices whose
``LayoutMap`` splits the big kernel (``--hidden`` x ``--width``) and its neighbours across
processes, so that no process holds a whole one and each must write its own part:

- ``none``:      no checkpoints
- ``orbax``:     ``keras.callbacks.OrbaxCheckpoint`` to a local folder (background saves, Orbax's
                 own multi-host coordination; ``max_to_keep=2``)
- ``resumable``: ``resumable.CheckpointCallback`` to a local run folder (``keep_last=2``): each
                 process writes its part with TensorStore, process 0 commits the manifest

Every checkpointing configuration saves at every epoch end. Per process: the time training is
blocked per save (inside the checkpoint callback's hooks, median over saves 2 to N), the wait at
the end of training (the last background save), the peak RSS above the baseline from the start
of one save to the start of the next (its background write included; the largest over saves 2
to N: the first loads code), measured as benchmarks/bench_save.py does, with a fixed
``MALLOC_MMAP_THRESHOLD_`` so that freed arrays leave the resident set at once. A job is as
slow as its slowest process, so each metric is the largest over the processes. The
configurations run in rounds, in an order rotated each round; ratios are taken within a round
and reported as median [min-max] over rounds.

Usage::

    python benchmarks/bench_multihost.py --write-docs   # 2 processes x 2 devices; into docs/benchmarks.md
    python benchmarks/bench_multihost.py --tiny         # a small model, one round: what the tests run
    python benchmarks/bench_multihost.py --processes 4 --devices 1 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

DOCS = Path(__file__).parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench_multihost: begin -->", "<!-- bench_multihost: end -->"
CONFIGS = {
    "none": "no checkpoints",
    "orbax": "OrbaxCheckpoint, local",
    "resumable": "resumable, local",
}
KEEP = 2
METRICS = {"blocked_s": "blocked per save (s)", "wait_s": "wait at end (s)", "peak_rss_mb": "peak RSS (MB)",
           "epoch_s": "epoch (s)"}


# ----------------------------------------------------------------------------- the driver


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker is not None:
        return worker(args)
    configs = [c for c in args.configs.split(",") if c]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
        for number in range(args.rounds):
            order = configs[number % len(configs):] + configs[:number % len(configs)]
            results = {}
            for config in order:
                results[config] = run_job(args, config, Path(tmp) / f"round{number}" / config)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in results[config].items() if v is not None)
                print(f"round {number + 1}/{args.rounds}, {CONFIGS[config]}: {shown}", flush=True)
            rounds.append(results)
            shutil.rmtree(Path(tmp) / f"round{number}", ignore_errors=True)
    text = report(args, configs, rounds)
    print(text)
    if args.write_docs:
        write_docs(text)
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2, help="XLA CPU devices per process")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--width", type=int, default=8192, help="the split kernel is hidden x width")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="batches per epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--tiny", action="store_true", help="a small model, one round, three epochs")
    parser.add_argument("--write-docs", action="store_true", help=f"replace the section of {DOCS.name}")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # this process's index in a job
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.hidden, args.width, args.epochs, args.rounds = 64, 512, 3, 1
    return args


def run_job(args: argparse.Namespace, config: str, folder: Path) -> dict[str, float | None]:
    """One configuration as a job of ``--processes`` processes; each metric the largest over them."""
    folder.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "KERAS_BACKEND": "jax",
           "TF_CPP_MIN_LOG_LEVEL": "3", "MALLOC_MMAP_THRESHOLD_": "65536",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}"}
    common = [sys.executable, __file__, "--config", config, "--coordinator", coordinator, "--folder",
              str(folder), "--processes", str(args.processes), "--devices", str(args.devices), "--hidden",
              str(args.hidden), "--width", str(args.width), "--epochs", str(args.epochs), "--steps",
              str(args.steps)]
    workers = [subprocess.Popen([*common, "--worker", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env) for i in range(args.processes)]
    results = []
    for i, process in enumerate(workers):
        out, err = process.communicate(timeout=1800)
        if process.returncode != 0:
            raise RuntimeError(f"{config}, process {i} failed ({process.returncode}):\n{out}\n{err[-3000:]}")
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("{"))))
    merged: dict[str, float | None] = {}
    for key in results[0]:
        values = [r[key] for r in results if r[key] is not None]
        merged[key] = max(values) if values else None
    return merged


# ----------------------------------------------------------------------------- one process of a job


def worker(args: argparse.Namespace) -> int:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes,
                               process_id=args.worker, initialization_timeout=300)
    import logging
    import warnings

    import keras
    import numpy as np
    from bench_save import RSS, Meter

    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax logs a line per save
    warnings.filterwarnings("ignore")
    devices = jax.devices()
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "model"), devices=devices)
    layouts = keras.distribution.LayoutMap(mesh)
    layouts[".*wide/kernel"] = (None, "model")
    layouts[".*wide/bias"] = ("model",)
    layouts[".*out/kernel"] = ("model", None)
    distribution = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch",
                                                    auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    _seed()
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(args.hidden, activation="relu", name="hidden")(inputs)
    wide = keras.layers.Dense(args.width, activation="relu", name="wide")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10, name="out")(wide))  # functional: Orbax restores it
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    batch = 32
    x = rng.normal(size=(batch * args.steps, 64)).astype("float32")
    y = rng.normal(size=(batch * args.steps, 10)).astype("float32")

    checkpoint: Any = None
    if args.config == "orbax":
        checkpoint = keras.callbacks.OrbaxCheckpoint(str(Path(args.folder) / "orbax"), save_freq="epoch",
                                                     max_to_keep=KEEP)
    elif args.config == "resumable":
        import resumable

        checkpoint = resumable.CheckpointCallback(
            str(Path(args.folder) / "run"), keep_last=KEEP, keep_best=0,
            staging_dir=str(Path(args.folder) / f"staging{args.worker}"))
    import orbax.checkpoint  # noqa: F401 - loaded before training by both: not inside a measured save
    import tensorstore  # noqa: F401

    rss = RSS()
    meter = Meter(rss, None)
    callbacks = [meter.callback()]
    if checkpoint is not None:
        callbacks.append(meter.timed(checkpoint))
    model.fit(x, y, batch_size=batch, epochs=args.epochs, shuffle=False, verbose=0, callbacks=callbacks)
    meter.close_window()
    result = meter.result(saved=checkpoint is not None)
    result.pop("cpu_emulator_s", None)
    result["peak_rss_mb"] = max(meter.peaks[1:]) / 2**20  # saves 2 to N, as the blocked time
    print(json.dumps(result), flush=True)
    return 0


def _seed() -> None:
    """What keras.utils.set_random_seed does on JAX, without its TensorFlow import."""
    import random

    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, 1)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(1)
    np.random.seed(1)


# ----------------------------------------------------------------------------- the report


def cell(values: list[float | None], digits: int = 3) -> str:
    found = [v for v in values if v is not None]
    if not found:
        return "-"
    middle = statistics.median(found)
    return f"{middle:.{digits}f} [{min(found):.{digits}f}-{max(found):.{digits}f}]"


def report(args: argparse.Namespace, configs: list[str], rounds: list[dict[str, dict[str, Any]]]) -> str:
    split_mb = args.hidden * args.width * 4 / 2**20
    lines = [
        f"{args.processes} processes x {args.devices} CPU devices, one mesh of "
        f"{args.processes * args.devices}; the split kernel {args.hidden} x {args.width} "
        f"({split_mb:.0f} MB, with Adam's two slots {3 * split_mb:.0f} MB, each process holding "
        f"1/{args.processes}); {args.epochs} epochs of {args.steps} batches, a save at every epoch end; "
        f"{args.rounds} rounds; median [min-max] over rounds, each the largest over the processes. "
        f"{_versions()}.",
        "",
        "| configuration | " + " | ".join(METRICS.values()) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for config in configs:
        lines.append(f"| {CONFIGS[config]} | " + " | ".join(
            cell([r[config].get(key) for r in rounds], 1 if key == "peak_rss_mb" else 3) for key in METRICS)
                     + " |")
    if "orbax" in configs and "resumable" in configs:
        lines += ["", "| resumable / OrbaxCheckpoint | " + " | ".join(METRICS.values()) + " |",
                  "|---|" + "---|" * len(METRICS)]
        ratios = []
        for key in METRICS:
            values = [r["resumable"][key] / r["orbax"][key] for r in rounds
                      if r["resumable"].get(key) is not None and r["orbax"].get(key)]
            ratios.append(cell(values, 2))
        lines.append("| ratio | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def _versions() -> str:
    found = []
    for package in ("keras", "jax", "orbax-checkpoint", "tensorstore"):
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{package} {version(package)}")
    machine = platform.processor() or platform.machine()
    return f"{', '.join(found)}; {machine}, {os.cpu_count()} cores, {date.today()}"


def write_docs(text: str) -> None:
    doc = DOCS.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOCS.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    print(f"wrote {DOCS}")


if __name__ == "__main__":
    sys.exit(main())
