"""tests/jobs/train_job.py's deterministic training job, on Keras' JAX backend.

    python tests/jobs/jax_job.py RUN_URL --epochs 6 --out final.npz
    python tests/jobs/jax_job.py RUN_URL --distribution arg --host-devices 2
    python tests/jobs/jax_job.py RUN_URL --processes 2 --process-id 1 --coordinator 127.0.0.1:PORT

Always runs with KERAS_BACKEND=jax (set here, before Keras is imported) and never imports
TensorFlow itself: seeding avoids ``keras.utils.set_random_seed``, which imports TensorFlow
whenever it is installed. Prints, one per line, flushed:

    READY initial_epoch=<n> step=<n>     after resume(), before training
    RESUMED <name> batch=<n>             after READY, when resume() found a checkpoint
    LAYOUT devices=<n>                   devices the first weight is laid out over, after resume()
    LOG resumable: saving <name>         a save starts (from the "resumable" logger)
    LOG resumable: saved <name>          a save is committed
    DONE epochs=<n>                      training finished
    TENSORFLOW imported=<True|False>     last: whether anything imported TensorFlow

With ``--processes N`` the job is process ``--process-id`` of a JAX program of N processes
(``jax.distributed.initialize`` with a coordinator on 127.0.0.1, CPU collectives); the model
is trained with ``keras.distribution.DataParallel`` over every process's devices, and each
process feeds its own slice of every global batch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

# Shared with the TensorFlow job; its module level imports neither TensorFlow nor Keras.
from train_job import FEATURES, data, save_weights, sleep_callback

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

BATCH = 32  # global batch size, whatever the number of processes


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="write the final weights here (.npz)")
    parser.add_argument("--restored-out", help="write the weights right after resume() here (.npz)")
    parser.add_argument("--shuffle", action="store_true", help="let model.fit shuffle the batches")
    parser.add_argument("--weights-only", action="store_true")
    parser.add_argument("--save-freq", default="epoch", help="CheckpointCallback(save_freq=...)")
    parser.add_argument("--dropout", action="store_true", help="add a Dropout layer (its RNG must continue)")
    parser.add_argument("--batch-sleep", type=float, default=0.0, help="sleep this long after each batch")
    parser.add_argument("--host-devices", type=int, default=1, help="XLA CPU devices of this process")
    parser.add_argument("--distribution", choices=["none", "arg", "global"], default="none",
                        help="DataParallel over all devices: passed to resume(), or set globally")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--coordinator", help="host:port of the jax.distributed coordinator")
    return parser.parse_args(argv)


def seed_everything(seed: int) -> None:
    """What keras.utils.set_random_seed does on JAX, without its TensorFlow import."""
    import random

    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(seed)
    np.random.seed(seed)


def build_model(seed: int, dropout: bool) -> Any:
    import keras

    seed_everything(seed)
    layers: list[Any] = [keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(0.2))
    layers += [keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.host_devices > 1:  # before JAX creates its CPU backend
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.host_devices}"
        )
    import jax

    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes,
                                   process_id=args.process_id, initialization_timeout=120)
    import keras

    import resumable

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    log = logging.getLogger("resumable")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    distribution = None
    if args.distribution != "none" or args.processes > 1:
        # Each process feeds its own slice of every batch (Keras shards only tf.data itself).
        distribution = keras.distribution.DataParallel(devices=jax.devices(),
                                                       auto_shard_dataset=args.processes == 1)
        if args.distribution == "global":
            keras.distribution.set_distribution(distribution)
    run = resumable.resume(
        args.url, build_model=lambda: build_model(args.seed, args.dropout),
        distribution=distribution if args.distribution != "global" else None,
        monitor="val_loss", keep_last=2, keep_best=1, save_weights_only=args.weights_only,
        save_freq=args.save_freq if args.save_freq == "epoch" else int(args.save_freq),
    )
    if args.restored_out:
        save_weights(run.model, args.restored_out)
    print(f"READY initial_epoch={run.initial_epoch} step={run.checkpoint.step if run.checkpoint else 0}",
          flush=True)
    if run.checkpoint is not None:
        print(f"RESUMED {run.checkpoint.name} batch={run.callback.resume_batch}", flush=True)
    print(f"LAYOUT devices={len(run.model.weights[0].value.sharding.device_set)}", flush=True)
    x, y, x_val, y_val = data(args.seed)
    seed_everything(args.seed + 1)  # anything random during fit draws from here
    if args.processes > 1:
        x, y = x[args.process_id::args.processes], y[args.process_id::args.processes]
    callbacks = [sleep_callback(args.batch_sleep)] if args.batch_sleep else []
    run.fit(x, y, epochs=args.epochs, batch_size=BATCH // args.processes, shuffle=args.shuffle,
            validation_data=(x_val, y_val), verbose=0, callbacks=callbacks)
    if args.out:
        save_weights(run.model, args.out)
    print(f"DONE epochs={run.initial_epoch}", flush=True)
    print(f"TENSORFLOW imported={'tensorflow' in sys.modules}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
