"""Training with saves inside a memory cgroup (#54): the job moves itself into the cgroup first.

    python tests/jobs/memory_budget_job.py MODE RUN [--cgroup DIR] [--weights-only]
        [--snapshot-memory N|auto] [--kill-at-epoch K] [--epochs E]

MODE: ``plain`` (``model.fit`` alone, no save), ``resume`` (``resumable.resume`` + ``run.fit``),
``dropin`` (``model.fit`` with ``resumable.ModelCheckpoint`` writing ``RUN/model.weights.h5`` each
epoch). ``--cgroup``: the cgroup folder whose ``cgroup.procs`` this process joins before it
builds anything. ``--kill-at-epoch K``: SIGKILL itself at the start of epoch K (0-based), once a
checkpoint is committed.
Prints ``CHECKPOINT bytes=<weights and optimizer state>`` and, once trained,
``DIGEST <sha256 of every weight and optimizer variable>`` and ``PEAK rss=<VmHWM bytes>``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

LAYERS, WIDTH = 6, 2048  # about 27M parameters: a 0.3 GB checkpoint with Adam


def build_model():  # type: ignore[no-untyped-def]
    import keras

    keras.utils.set_random_seed(7)
    inputs = keras.Input((WIDTH // 2,))
    hidden = inputs
    for _ in range(LAYERS):
        hidden = keras.layers.Dense(WIDTH, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    return model


def peak_rss() -> int:
    """This process' peak resident set (VmHWM), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["plain", "resume", "dropin"])
    parser.add_argument("run")
    parser.add_argument("--cgroup")
    parser.add_argument("--weights-only", action="store_true")
    parser.add_argument("--snapshot-memory", default="auto")
    parser.add_argument("--kill-at-epoch", type=int)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if args.cgroup:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))

    import keras
    import numpy as np

    import resumable

    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, WIDTH // 2)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    memory = args.snapshot_memory if args.snapshot_memory == "auto" else int(args.snapshot_memory)
    callbacks: list[keras.callbacks.Callback] = []
    if args.kill_at_epoch is not None:
        kill_at = args.kill_at_epoch

        class Kill(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
                if epoch == kill_at:
                    # A 0.3 GB commit (fsynced) can outlast a short epoch on a busy machine:
                    # killed before any commit, the run would have nothing to resume from.
                    deadline = time.monotonic() + 120
                    while not glob.glob(os.path.join(args.run, "ckpt-*", "manifest.json")):
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.1)
                    os.kill(os.getpid(), signal.SIGKILL)

        callbacks.append(Kill())
    if args.mode == "resume":
        run = resumable.resume(args.run, build_model,
                               monitor="loss", save_weights_only=args.weights_only, snapshot_memory=memory)
        model = run.model
        fit = run.fit
    else:
        model = build_model()
        fit = model.fit
        if args.mode == "dropin":
            os.makedirs(args.run, exist_ok=True)
            callbacks.append(resumable.ModelCheckpoint(os.path.join(args.run, "model.weights.h5"),
                                                       save_weights_only=True))
    model.optimizer.build(model.trainable_variables)
    held = model.weights + model.optimizer.variables
    print(f"CHECKPOINT bytes={sum(int(np.prod(v.shape)) * 4 for v in held)}", flush=True)
    fit(x, y, batch_size=16, epochs=args.epochs, verbose=0, callbacks=callbacks)
    digest = hashlib.sha256()
    for variable in model.weights + model.optimizer.variables:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(variable)).tobytes())
    print(f"DIGEST {digest.hexdigest()}", flush=True)
    print(f"PEAK rss={peak_rss()}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
