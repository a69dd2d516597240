"""A checkpoint of several GB: saved in the background and resumed, with memory measured.

One process: a functional MLP of about ``--params`` parameters with Adam (250M: a 3 GB
checkpoint of weights and two moments), two epochs of a few small batches with
`resumable.CheckpointCallback` saving every epoch to a local folder (``verbose=1``: the
progress lines), then `resumable.resume` with ``build_model`` and without. Reports the time
training was blocked per save, the wait for the last upload, the checkpoint's size, the peak
RSS above the baseline taken at the start of each save and of each resume, and the resume
times against a bare ``keras.saving.load_model`` of the same file.

    python benchmarks/bench_scale.py                  # 250M parameters (~3 GB), a few minutes
    python benchmarks/bench_scale.py --params 20e6    # a quick look
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_save import RSS  # noqa: E402  (the same sampler as the save benchmark)

LOADS = ("load_model", "resume(build_model)", "resume()")


LOADS = ("load_model", "resume(build_model)", "resume()")


def build_model(params: float) -> Any:
    """A functional MLP of about ``params`` parameters with Adam."""
    import keras

    features = 1000
    # features*w + w*w + w*10 parameters (biases aside) = params
    width = int((-(features + 10) + math.sqrt((features + 10) ** 2 + 4 * params)) / 2)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((features,))
    hidden = keras.layers.Dense(width, activation="relu")(inputs)
    hidden = keras.layers.Dense(width, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def load_once(args: argparse.Namespace) -> int:
    """Time one load of the run's newest checkpoint in this fresh process; print seconds and MB."""
    import keras

    import resumable

    latest = resumable.RunStorage(args.folder).latest()
    assert latest is not None
    rss = RSS()
    started = time.perf_counter()
    if args.load == "load_model":
        keras.saving.load_model(f"{args.folder}/{latest.name}/model.keras")
    elif args.load == "resume()":
        resumable.resume(args.folder, monitor="loss")
    else:
        resumable.resume(args.folder, build_model=lambda: build_model(args.params), monitor="loss")
    print(time.perf_counter() - started, rss.over())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=250e6)
    parser.add_argument("--folder", default=None, help="run folder (default: a temporary folder)")
    parser.add_argument("--load", choices=LOADS, help=argparse.SUPPRESS)  # one timed load (a child)
    args = parser.parse_args(argv)
    if args.load:
        return load_once(args)

    import keras
    import numpy as np

    import resumable

    def build() -> keras.Model:
        return build_model(args.params)

    tmp = tempfile.mkdtemp(prefix="bench-scale-")
    folder = args.folder or f"{tmp}/run"
    x = np.random.default_rng(0).random((64, 1000), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 64)
    model = build()
    print(f"{model.count_params() / 1e6:.0f}M parameters, {keras.backend.backend()}", flush=True)
    rss = RSS()
    blocked: list[float] = []
    peaks: list[float] = []
    alone: list[float] = []

    class Windows(keras.callbacks.Callback):  # the same windows without a checkpoint: training's own
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch:
                alone.append(rss.over())
            rss.window()

    model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[Windows()])  # also traces the step

    checkpoint = resumable.CheckpointCallback(folder, monitor="loss", keep_last=1, verbose=1,
                                              staging_dir=f"{tmp}/staging")
    epoch_end = checkpoint.on_epoch_end

    def timed_epoch_end(epoch: int, logs: Any = None) -> None:
        if peaks or blocked:
            peaks.append(rss.over())  # the previous save's window: its background write included
        rss.window()
        started = time.perf_counter()
        epoch_end(epoch, logs)
        blocked.append(time.perf_counter() - started)

    checkpoint.on_epoch_end = timed_epoch_end
    started = time.perf_counter()
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[checkpoint])
    peaks.append(rss.over())
    total = time.perf_counter() - started
    latest = resumable.RunStorage(folder).latest()
    assert latest is not None
    size = latest.size / 2**20
    print()
    print(f"checkpoint {size:,.0f} MB ({latest.name}); fit with 2 saves {total:.1f} s")
    print(f"blocked per save: {', '.join(f'{b:.3f} s' for b in blocked)}")
    print(f"peak RSS over the baseline per save window: {', '.join(f'{p:,.0f} MB' for p in peaks)} "
          f"({max(peaks) / size:.2f}x the checkpoint); training alone, same windows: "
          f"{', '.join(f'{p:,.0f} MB' for p in alone)}", flush=True)

    # Each load in a fresh process: its peak is its own, and the training above is not in it.
    timings: dict[str, tuple[float, float]] = {}
    for _ in range(2):  # interleaved twice; the faster of each
        for how in LOADS:
            done = subprocess.run([sys.executable, __file__, "--load", how, "--folder", folder,
                                   "--params", str(args.params)], capture_output=True, text=True, check=True)
            seconds, peak = map(float, done.stdout.split()[-2:])
            if how not in timings or seconds < timings[how][0]:
                timings[how] = (seconds, peak)
    base = timings["load_model"][0]
    for how, (seconds, peak) in timings.items():
        print(f"{how:<22} {seconds:6.2f} s ({seconds / base:.2f}x load_model), peak RSS over baseline "
              f"{peak:,.0f} MB ({peak / size:.2f}x)")
    return 0



if __name__ == "__main__":
    sys.exit(main())
