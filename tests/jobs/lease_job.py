"""A tiny training job for the writer-lease tests: two of these write one run folder.

    python tests/jobs/lease_job.py RUN_URL --epochs 3 [--takeover] [--hold 120] [--lease-timeout 5]
                                   [--as-host NAME]

Prints one marker per line on stdout, flushed:

    READY initial_epoch=<n>     after resume()
    TRAINING                    the fit began: this process holds the lease
    LOG resumable: saved <name> a checkpoint is committed
    DONE epochs=<n>             training finished; exit 0
    LEASE_HELD <message>        another process holds the lease; exit 3
    LEASE_LOST <message>        another process took the lease over; exit 4

``--hold S``: after the first epoch, every batch waits up to S seconds, ending early once the
lease is lost, so the process holds the run without committing while a test takes it over.
``--as-host NAME``: the lease names host NAME, as a process on another machine (a new Colab VM)
would; whether its process runs can then not be asked, only whether it renews its lease.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--takeover", action="store_true")
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--lease-timeout", type=float, default=None)
    parser.add_argument("--as-host", default=None)
    args = parser.parse_args(argv)

    import keras
    import numpy as np

    import resumable
    from resumable.core.errors import LeaseHeldError, LeaseLostError
    from resumable.storage import lease, this_machine

    if args.as_host:
        this_machine.HOST = args.as_host

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    log = logging.getLogger("resumable")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    def build() -> Any:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    run = resumable.resume(args.url, build_model=build, monitor="loss", keep_last=None,
                           takeover=args.takeover, lease_timeout=args.lease_timeout or lease.DEFAULT_TIMEOUT)
    print(f"READY initial_epoch={run.initial_epoch}", flush=True)

    class Markers(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if not getattr(self, "started", False):  # after every on_train_begin: the lease is taken
                self.started = True
                print("TRAINING", flush=True)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if args.hold and run.callback.epochs_done >= 1:
                deadline = time.monotonic() + args.hold
                while time.monotonic() < deadline and run.callback.manager.writer.lease.lost is None:
                    time.sleep(0.05)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    try:
        run.fit(x, y, epochs=args.epochs, batch_size=32, verbose=0, callbacks=[Markers()])
    except LeaseHeldError as e:
        print(f"LEASE_HELD {e}", flush=True)
        return 3
    except LeaseLostError as e:
        print(f"LEASE_LOST {e}", flush=True)
        return 4
    print(f"DONE epochs={run.initial_epoch}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
