"""A small deterministic training job that tests run in a subprocess, kill and restart.

    python tests/jobs/train_job.py RUN_URL --epochs 12 --out final.npz
    python tests/jobs/train_job.py --plain --epochs 12 --out final.npz     (plain model.fit)

Resumes RUN_URL (or starts it), trains a tiny MLP on fixed synthetic data, and writes the
final weights to ``--out``. Prints one marker per line on stdout, flushed:

    READY initial_epoch=<n> step=<n>   after resume(), before training
    RESUMED <name> batch=<n>           after READY, when resume() found a checkpoint
    LOG resumable: saving <name>       a save starts (from the "resumable" logger)
    LOG resumable: saved <name>        a save is committed
    DONE epochs=<n>                    training finished
    STEP <n>                           after each batch, with --print-steps: the optimizer step reached

Tests fork it from the job server (tests/forked.py): restarts cost ~1 s instead of the 5-7 s
TensorFlow takes to import. Each job is still a separate process that SIGKILL ends.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

SAMPLES = 512
FEATURES = 16


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="write the final weights here (.npz)")
    parser.add_argument("--restored-out", help="write the weights right after resume() here (.npz)")
    parser.add_argument("--strategy", choices=["none", "mirrored"], default="none")
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--weights-only", action="store_true")
    parser.add_argument("--keep-last", type=int, default=2)
    parser.add_argument("--shuffle", action="store_true", help="let model.fit shuffle the batches")
    parser.add_argument("--save-interval", type=float, help="CheckpointCallback(save_interval=...)")
    parser.add_argument("--batch-sleep", type=float, default=0.0, help="sleep this long after each batch")
    parser.add_argument("--data", choices=["arrays", "tfdata"], default="arrays")
    parser.add_argument("--max-shard-size", type=float, default=1.0, help="GiB, as in the callback")
    parser.add_argument("--warnings-on-stderr", action="store_true",
                        help="resumable's warnings on stderr too, as a user sees them")
    parser.add_argument("--when-behind", choices=["skip", "wait"], default="skip")
    parser.add_argument("--lease-timeout", type=float, default=40.0, help="seconds, as in the callback")
    parser.add_argument("--local-tier", help="CheckpointCallback(local_tier=LocalTier(folder=...)) (#55)")
    parser.add_argument("--local-every-steps", type=int, help="LocalTier(every_steps=...)")
    parser.add_argument("--local-every-seconds", type=float, help="LocalTier(every_seconds=...)")
    parser.add_argument("--print-steps", action="store_true", help="print STEP <n> after each batch")
    parser.add_argument("--plain", action="store_true",
                        help="the user's own baseline: plain model.fit, no resumable (RUN_URL unused)")
    return parser.parse_args(argv)


def on_tensorflow() -> bool:
    """Whether Keras runs on TensorFlow here (the lanes also run this job on JAX and torch)."""
    return os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow"


def configure_devices(strategy: str) -> None:
    """Two logical CPUs for MirroredStrategy; must run before TensorFlow initializes devices."""
    if not on_tensorflow():
        return
    import tensorflow as tf

    if strategy == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.experimental.enable_op_determinism()


def data(seed: int) -> tuple[Any, Any, Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES, 1)).astype("float32")
    y = (np.tanh(x @ w) + 0.1 * rng.normal(size=(SAMPLES, 1))).astype("float32")
    split = SAMPLES * 3 // 4
    return x[:split], y[:split], x[split:], y[split:]


def build_model(seed: int) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def sleep_callback(seconds: float) -> Any:
    """A callback that makes batches slow, so a test can signal or kill between two saves."""
    import time

    import keras

    class Sleep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            time.sleep(seconds)

    return Sleep()


def step_printer() -> Any:
    """A callback printing the optimizer step each batch ends at: a killed job's last one is the
    training lost past the checkpoint it resumes from."""
    import keras

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            print(f"STEP {int(self.model.optimizer.iterations)}", flush=True)

    return Steps()


def local_tier(args: argparse.Namespace) -> Any:
    import resumable

    if not args.local_tier:
        return False
    return resumable.LocalTier(folder=args.local_tier, every_steps=args.local_every_steps,
                               every_seconds=args.local_every_seconds)


def save_weights(model: Any, path: str) -> None:
    import numpy as np

    np.savez(path, *[np.asarray(w) for w in model.get_weights()])


def plain_fit(args: argparse.Namespace) -> int:
    """The same training with keras' model.fit alone, as the user would run it without resumable."""
    import keras

    model = build_model(args.seed)
    x, y, x_val, y_val = data(args.seed)
    keras.utils.set_random_seed(args.seed + 1)
    model.fit(x, y, epochs=args.epochs, batch_size=32, shuffle=args.shuffle, validation_data=(x_val, y_val),
              verbose=0)
    if args.out:
        save_weights(model, args.out)
    print(f"DONE epochs={args.epochs}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    args = parse(argv)
    configure_devices(args.strategy)
    import keras

    import resumable

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    log = logging.getLogger("resumable")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    if args.warnings_on_stderr:  # where a notebook shows them: Python's last-resort handler's stderr
        shown = logging.StreamHandler(sys.stderr)
        shown.setLevel(logging.WARNING)
        log.addHandler(shown)

    if args.plain:
        return plain_fit(args)
    strategy = None
    if args.strategy == "mirrored":
        import tensorflow as tf

        strategy = tf.distribute.MirroredStrategy()
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    run = resumable.resume(
        args.url, build_model=lambda: build_model(args.seed), strategy=strategy, monitor="val_loss",
        keep_last=args.keep_last, keep_best=1, save_freq=save_freq, save_weights_only=args.weights_only,
        save_interval=args.save_interval, max_shard_size=args.max_shard_size,
        lease_timeout=args.lease_timeout, when_behind=args.when_behind, local_tier=local_tier(args),
    )
    if strategy is not None:
        print(f"REPLICAS {strategy.num_replicas_in_sync}", flush=True)
    if args.restored_out:
        save_weights(run.model, args.restored_out)
    print(f"READY initial_epoch={run.initial_epoch} step={run.checkpoint.step if run.checkpoint else 0}",
          flush=True)
    if run.checkpoint is not None:
        print(f"RESUMED {run.checkpoint.name} batch={run.callback.resume_batch}", flush=True)
    x, y, x_val, y_val = data(args.seed)
    keras.utils.set_random_seed(args.seed + 1)  # anything random during fit draws from here
    callbacks = [sleep_callback(args.batch_sleep)] if args.batch_sleep else []
    if args.print_steps:
        callbacks.append(step_printer())
    if args.data == "tfdata":
        import tensorflow as tf

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        run.fit(dataset, epochs=args.epochs, validation_data=(x_val, y_val), verbose=0, callbacks=callbacks)
    else:
        run.fit(x, y, epochs=args.epochs, batch_size=32, shuffle=args.shuffle, validation_data=(x_val, y_val),
                verbose=0, callbacks=callbacks)
    if args.out:
        save_weights(run.model, args.out)
    print(f"DONE epochs={run.initial_epoch}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
