"""A checkpoint of a deep MLP saved, or resumed while this process' resident memory is sampled.

    KERAS_BACKEND=tensorflow python tests/jobs/resume_memory_job.py save RUN_URL [--wide]
    KERAS_BACKEND=tensorflow python tests/jobs/resume_memory_job.py resume RUN_URL [--build] [--wide]
    KERAS_BACKEND=jax python tests/jobs/resume_memory_job.py build RUN_URL [--wide]

``save``: 48 Dense layers of 1024 units with Adam (about 50M parameters, a 0.6 GB checkpoint;
``--wide``: one Dense layer of 65,536 units, whose 256 MiB kernel is a third of the 0.8 GB
checkpoint), one epoch, saved by `resumable.CheckpointCallback`. ``resume``: Keras and resumable imported,
then the resident set size (``/proc/self/statm``) sampled every millisecond in a thread from
just before ``resume()`` (``--build``: with ``build_model``) to its end. ``build``: the same
around building the model and its optimizer alone, as ``build_model`` does in a resume. Prints:

    SAVED bytes=<checkpoint size>
    RESUMED peak_growth=<bytes over the baseline> checkpoint=<bytes> initial_epoch=<n>
    BUILT peak_growth=<bytes over the baseline> checkpoint=<bytes>
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

LAYERS, WIDTH = 48, 1024
WIDE = 65_536  # --wide: units of its one hidden layer


def build_model(wide: bool = False) -> Any:
    import keras

    inputs = keras.Input((WIDTH,))
    hidden = inputs
    for units in [WIDE] if wide else [WIDTH] * LAYERS:
        hidden = keras.layers.Dense(units, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Peak:
    """The highest resident set size since it started, sampled in a thread."""

    def __init__(self) -> None:
        self.base = self.peak = resident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, resident())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, resident()) - self.base


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["save", "resume", "build"])
    parser.add_argument("url")
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--wide", action="store_true")
    args = parser.parse_args()
    import keras
    import numpy as np

    import resumable

    if args.what == "save":
        keras.utils.set_random_seed(0)
        x = np.random.default_rng(0).random((32, WIDTH), dtype=np.float32)
        y = np.random.default_rng(1).integers(0, 10, 32)
        model = build_model(args.wide)
        model.fit(x, y, epochs=1, batch_size=16, verbose=0,
                  callbacks=[resumable.CheckpointCallback(args.url, monitor="loss")])
        latest = resumable.RunStorage(args.url).latest()
        assert latest is not None
        print(f"SAVED bytes={latest.size}", flush=True)
        return 0
    latest = resumable.RunStorage(args.url).latest()
    assert latest is not None
    peak = Peak()
    if args.what == "build":
        model = build_model(args.wide)
        model.optimizer.build(model.trainable_variables)
        print(f"BUILT peak_growth={peak.stop()} checkpoint={latest.size}", flush=True)
        return 0
    build = (lambda: build_model(args.wide)) if args.build else None
    run = resumable.resume(args.url, build_model=build, monitor="loss")
    growth = peak.stop()
    print(f"RESUMED peak_growth={growth} checkpoint={latest.size} initial_epoch={run.initial_epoch}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
