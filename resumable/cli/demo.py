"""`resumable demo`: train a small model, kill it mid-training, resume it, list the checkpoints.

Everything runs on the local disk and the CPU; no cloud account needed. The training runs in
a child process so that it can be killed for real (SIGKILL, like a Colab runtime that dies).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

DEFAULT_FOLDER = "./resumable-demo"
EPOCHS = 8
KILL_AFTER_EPOCH = 3


def main(folder: str | None = None) -> int:
    """Run the demo in a new run folder under ``folder``; return an exit code.

    Called by `resumable demo`, whose `resumable.cli.app.main` reports any error it raises.
    """
    from resumable.cli.listing import run_list
    from resumable.storage import RunStorage

    run = Path(folder or DEFAULT_FOLDER) / datetime.now().strftime("run-%Y%m%d-%H%M%S")
    storage = RunStorage(str(run))
    print(f"resumable demo: training a small model for {EPOCHS} epochs into {run}", flush=True)

    print(f"\n== Session 1: train; the runtime dies (SIGKILL) after epoch {KILL_AFTER_EPOCH}", flush=True)
    child = _start_training(run)
    deadline = time.monotonic() + 600
    while child.poll() is None and time.monotonic() < deadline:
        latest = storage.latest()
        if latest is not None and latest.epoch is not None and latest.epoch >= KILL_AFTER_EPOCH:
            break
        time.sleep(0.2)
    if child.poll() is not None:
        print(f"error: training ended early with exit code {child.returncode}", file=sys.stderr)
        return 2
    child.send_signal(signal.SIGKILL)
    child.wait()
    print(f"-- killed the training process (pid {child.pid}) with SIGKILL", flush=True)

    print("\n== Session 2: run the same code again; it continues where it stopped", flush=True)
    child = _start_training(run)
    if child.wait() != 0:
        print(f"error: the resumed training failed with exit code {child.returncode}", file=sys.stderr)
        return 2

    print("\n== The checkpoints (`resumable list`):", flush=True)
    return run_list(str(run))


def _start_training(run: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen([sys.executable, "-m", "resumable.cli.demo", "--train", str(run)], env=env)


def _train(run: str) -> None:
    """What a user's notebook does: resume(), then run.fit(). Runs in the child process."""
    import keras
    import numpy as np

    import resumable

    def build_model() -> keras.Model:
        model = keras.Sequential([
            keras.Input(shape=(20,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=["accuracy"])
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 20)).astype("float32")
    y = (x[:, :5].sum(axis=1) > 0).astype("float32")

    keras.utils.set_random_seed(0)
    run_ = resumable.resume(run, build_model=build_model, monitor="val_loss", keep_last=3, keep_best=1)
    if run_.checkpoint is None:
        print(f"new run: starting at epoch 1 of {EPOCHS}", flush=True)
    else:
        print(f"resumed from {run_.checkpoint.name}: {run_.initial_epoch} epochs done, "
              f"continuing at epoch {run_.initial_epoch + 1} of {EPOCHS}", flush=True)
    # Slow each epoch down a little, so that the kill lands mid-training as on a real runtime.
    slow = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: time.sleep(0.5))
    run_.fit(x, y, epochs=EPOCHS, batch_size=64, validation_split=0.2, callbacks=[slow], verbose=2)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--train":
        _train(sys.argv[2])
    else:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
