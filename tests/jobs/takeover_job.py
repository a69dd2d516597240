"""A training job that another process takes over, for what the user then sees.

    python tests/jobs/takeover_job.py RUN_URL --wait-for FILE [--epochs 3]

Trains with ``verbose=1`` checkpoints and does not catch anything: what it prints is what a
user of a script (or, under IPython, a notebook) sees. After the first batch of epoch 2 it
prints ``HOLDING`` and waits until FILE exists (the test takes the run over meanwhile), then
goes on: its next save finds the lease lost. Prints ``DONE`` if training ends normally.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--wait-for", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)

    import keras
    import numpy as np

    import resumable

    def build() -> Any:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    run = resumable.resume(args.url, build_model=build, monitor="loss", keep_last=None, verbose=1)

    class Hold(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if run.callback.epochs_done == 1 and batch == 0:
                # Epoch 1 is committed in the background: said once its manifest is there, so that
                # the taker resumes it (under load the commit may still run at this batch).
                manifest = Path(args.url) / "ckpt-000001" / "manifest.json"
                deadline = time.monotonic() + 120
                while not manifest.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                print("HOLDING", flush=True)
                deadline = time.monotonic() + 120
                while not Path(args.wait_for).exists() and time.monotonic() < deadline:
                    time.sleep(0.05)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    run.fit(x, y, epochs=args.epochs, batch_size=32, verbose=0, callbacks=[Hold()])
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
