"""One process of a multi-host JAX job whose model is split across processes (ModelParallel).

    python tests/jobs/model_parallel_job.py RUN_URL --processes 4 --process-id 0 \
        --coordinator 127.0.0.1:PORT --host-devices 2 --epochs 4 --out p0.npz

Every process starts with ``jax.distributed.initialize`` (a coordinator on 127.0.0.1, CPU
collectives over gloo), ``--host-devices`` XLA CPU devices of its own, and trains the same
MLP under ``keras.distribution.ModelParallel`` over a mesh of every process's devices
(``batch`` x ``model``, the batch axis of size 1: every process feeds the same batches; or
with ``--model-axis N`` ``model`` x ``batch``, N x the rest, the batch split over each process's
own devices, so again every process feeds the same global batches), whose
``LayoutMap`` splits the wide layer's kernel (``--hidden`` x ``--width``, the biggest variable)
and bias by columns and the output kernel by rows over the ``model`` axis: no process holds a
whole one of them. With ``--processes 1`` it runs
without ``jax.distributed`` (the mesh is this process's devices). Prints, flushed:

    READY initial_epoch=<n> step=<n>     after resume(), before training
    RESUMED <name> batch=<n>             when resume() found a checkpoint
    SPLIT variables=<n> largest=<bytes> held=<bytes>
                                         the split variables, the largest one's size, and what
                                         this process holds of it (addressable shards)
    MEMORY restore=<bytes>               peak memory growth while resume() read the variables
    MEMORY save=<bytes> snapshot=<bytes> with --measure, after training: peak memory growth
                                         while this process took and wrote its part of a
                                         checkpoint, and the bytes that part held
    LOG resumable: ...                   the "resumable" logger's lines
    DONE epochs=<n>
    TENSORFLOW imported=<True|False>

With ``--backup-and-restore`` it builds the model under the distribution and calls
``model.fit`` with ``resumable.BackupAndRestore(RUN_URL, delete_checkpoint=False)`` instead, and
prints ``EPOCH <n>`` at each epoch's start.

``--out`` and ``--restored-out`` write this process's shards (replica 0 of each, with their
index) of every weight and optimizer variable, for the test to put the arrays together.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from jax_job import seed_everything
from train_job import FEATURES, data, sleep_callback

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

BATCH = 32


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--coordinator", help="host:port of the jax.distributed coordinator")
    parser.add_argument("--host-devices", type=int, default=2, help="XLA CPU devices of this process")
    parser.add_argument("--model-axis", type=int,
                        help="a mesh of model x batch (N x the rest) instead of 1 x every device")
    parser.add_argument("--hidden", type=int, default=64, help="units of the layer before the split one")
    parser.add_argument("--width", type=int, default=256, help="units of the split layer")
    parser.add_argument("--out", help="write this process's shards of the final variables here (.npz)")
    parser.add_argument("--restored-out", help="the same, right after resume()")
    parser.add_argument("--save-freq", default="epoch", help="CheckpointCallback(save_freq=...)")
    parser.add_argument("--save-interval", type=float, help="CheckpointCallback(save_interval=...)")
    parser.add_argument("--batch-sleep", type=float, default=0.0, help="sleep this long after each batch")
    parser.add_argument("--heartbeat", type=int, default=10, help="jax.distributed heartbeat timeout, s")
    parser.add_argument("--barrier-timeout", type=float, default=60.0)
    parser.add_argument("--slow-first-part", type=float, default=0.0,
                        help="this process's first part upload waits this long first (a slow host)")
    parser.add_argument("--measure", action="store_true", help="print a MEMORY save= line at the end")
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--backup-and-restore", action="store_true",
                        help="a plain model.fit with resumable.BackupAndRestore(url) instead of resume()")
    return parser.parse_args(argv)


def peak_reset() -> int:
    """Reset this process's peak resident memory (Linux); the resident memory now, in bytes.

    Freed memory goes back to the system first (``malloc_trim``): memory freed but still held
    by the allocator would hide later allocations from the peak.
    """
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def peak() -> int:
    return _status("VmHWM")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def distribution(devices: list[Any], model_axis: int | None = None) -> Any:
    import keras

    if model_axis:  # model x batch: the model axis across processes, the batch axis within each
        mesh = keras.distribution.DeviceMesh((model_axis, len(devices) // model_axis), ("model", "batch"),
                                             devices=devices)
    else:
        mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "model"), devices=devices)
    layouts = keras.distribution.LayoutMap(mesh)
    layouts[".*wide/kernel"] = (None, "model")
    layouts[".*wide/bias"] = ("model",)
    layouts[".*out/kernel"] = ("model", None)
    # Every process feeds the same global batches (the batch axis has size 1).
    return keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch",
                                            auto_shard_dataset=False)


def build_model(seed: int, hidden: int, width: int) -> Any:
    import keras

    seed_everything(seed)
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(hidden, activation="relu", name="hidden"),
                              keras.layers.Dense(width, activation="relu", name="wide"),
                              keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def prime_tensorstore() -> None:
    """Load TensorStore's code (zarr on local files) once, so memory measured later is data only."""
    import tempfile

    import numpy as np
    import tensorstore as ts

    with tempfile.TemporaryDirectory() as folder:
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": folder}, "dtype": "float32",
                "metadata": {"shape": [4], "chunks": [2], "compressor": None}}
        store = ts.open(spec, create=True, open=True).result()
        store.write(np.zeros(4, "float32")).result()
        store.read().result()


def shards(model: Any) -> dict[str, Any]:
    """This process's shards (replica 0) of every weight and optimizer variable, keyed by
    ``<i>|<start>:<stop>,...``: the test puts whole arrays together from every process's."""
    import numpy as np

    found = {}
    for i, variable in enumerate(list(model.weights) + list(model.optimizer.variables)):
        value = variable.value
        for shard in value.addressable_shards:
            if shard.replica_id != 0 or (value.is_fully_addressable and shard.device.process_index != 0):
                continue
            where = ",".join(f"{s.indices(n)[0]}:{s.indices(n)[1]}"
                             for s, n in zip(shard.index, value.shape, strict=False))
            found[f"{i}|{where}|{'x'.join(map(str, value.shape))}"] = np.asarray(shard.data)
    return found


def split_report(model: Any) -> str:
    split = [v for v in model.weights if not v.value.is_fully_replicated]
    largest = max(split, key=lambda v: v.value.nbytes)
    held = sum(s.data.nbytes for s in largest.value.addressable_shards if s.replica_id == 0)
    return f"SPLIT variables={len(split)} largest={largest.value.nbytes} held={held}"


def measure_restore() -> dict[str, int]:
    """Measure the peak memory growth while resume() reads a split model's variables (into the dict)."""
    from resumable.keras.multihost import split_job

    measured: dict[str, int] = {}
    original = split_job.read_variables

    def read_variables(*args: Any, **kwargs: Any) -> None:
        prime_tensorstore()
        before = peak_reset()
        original(*args, **kwargs)
        measured["growth"] = peak() - before

    split_job.read_variables = read_variables  # type: ignore[assignment]
    return measured


def measure_save(model: Any) -> None:
    """What one save of this process's part costs in memory: taken, then written, as the callback does."""
    import tempfile

    from resumable.keras.multihost import parts

    with tempfile.TemporaryDirectory() as folder:
        before = peak_reset()
        part = parts.snapshot(model, state={}, arrays={})
        held = part.nbytes
        part.write(Path(folder) / "part")
        print(f"MEMORY save={peak() - before} snapshot={held}", flush=True)


def slow_first_upload(seconds: float) -> None:
    """Make this process's first part upload wait (a slow host), to run into the others' barrier."""
    from resumable.storage.commit import Committer

    original = Committer.upload
    calls = []

    def upload_part(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(seconds)
        return original(self, *args, **kwargs)

    Committer.upload = upload_part  # type: ignore[method-assign]


def backup_and_restore(args: argparse.Namespace, devices: list[Any]) -> int:
    """Keras' way: the model built under the distribution, then ``model.fit`` with
    resumable.BackupAndRestore (backups kept), which restores the newest backup, if any, first."""
    import keras
    import numpy as np

    import resumable

    class Epochs(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            print(f"EPOCH {epoch}", flush=True)

    keras.distribution.set_distribution(distribution(devices, args.model_axis))
    model = build_model(args.seed, args.hidden, args.width)
    print(split_report(model), flush=True)
    x, y, x_val, y_val = data(args.seed)
    seed_everything(args.seed + 1)
    backup = resumable.BackupAndRestore(args.url, delete_checkpoint=False,
                                        barrier_timeout=args.barrier_timeout)
    model.fit(x, y, epochs=args.epochs, callbacks=[backup, Epochs()], batch_size=BATCH, shuffle=args.shuffle,
              validation_data=(x_val, y_val), verbose=0)
    if args.out:
        np.savez(args.out, **shards(model))
    print(f"DONE epochs={args.epochs}", flush=True)
    print(f"TENSORFLOW imported={'tensorflow' in sys.modules}", flush=True)
    return 0


def fixed_mmap_threshold() -> None:
    """A fixed mmap threshold of 64 KiB (glibc's M_MMAP_THRESHOLD): freed arrays leave the
    resident memory at once, so the MEMORY lines measure live data. Set here, not through
    MALLOC_MMAP_THRESHOLD_, which glibc reads only when a fresh process starts: a job forked
    from the job server would not see it."""
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD


def main(argv: list[str]) -> int:
    args = parse(argv)
    fixed_mmap_threshold()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.host_devices}")
    import jax

    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes,
                                   process_id=args.process_id, initialization_timeout=120,
                                   heartbeat_timeout_seconds=args.heartbeat)
    import numpy as np

    import resumable

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    log = logging.getLogger("resumable")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    if args.slow_first_part:
        slow_first_upload(args.slow_first_part)

    if args.backup_and_restore:
        return backup_and_restore(args, jax.devices())
    measured = measure_restore()
    run = resumable.resume(
        args.url, build_model=lambda: build_model(args.seed, args.hidden, args.width),
        distribution=distribution(jax.devices(), args.model_axis), monitor="val_loss", keep_last=2,
        keep_best=1,
        save_freq=args.save_freq if args.save_freq == "epoch" else int(args.save_freq),
        save_interval=args.save_interval, barrier_timeout=args.barrier_timeout,
    )
    print(f"MEMORY restore={measured.get('growth', 0)}", flush=True)
    if args.restored_out:
        np.savez(args.restored_out, **shards(run.model))
    print(f"READY initial_epoch={run.initial_epoch} step={run.checkpoint.step if run.checkpoint else 0}",
          flush=True)
    if run.checkpoint is not None:
        print(f"RESUMED {run.checkpoint.name} batch={run.callback.resume_batch}", flush=True)
    print(split_report(run.model), flush=True)
    x, y, x_val, y_val = data(args.seed)
    seed_everything(args.seed + 1)
    callbacks = [sleep_callback(args.batch_sleep)] if args.batch_sleep else []
    fit = dict(batch_size=BATCH, shuffle=args.shuffle, validation_data=(x_val, y_val), verbose=0)
    run.fit(x, y, epochs=args.epochs, callbacks=callbacks, **fit)
    if args.out:
        np.savez(args.out, **shards(run.model))
    if args.measure:
        measure_save(run.model)
    print(f"DONE epochs={run.initial_epoch}", flush=True)
    print(f"TENSORFLOW imported={'tensorflow' in sys.modules}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
