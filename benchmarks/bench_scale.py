"""A checkpoint of several GB: saved in the background and resumed, with memory measured.

One process: a functional MLP of about ``--params`` parameters with Adam (250M: a 3 GB
checkpoint of weights and two moments), two epochs of a few small batches with
`resumable.CheckpointCallback` saving every epoch (``verbose=1``: the progress lines), to a
local folder or, with ``--gcs``, to ``gs://`` on a fake-gcs-server. Weights over
``--max-shard-size`` GiB (default 1, the callback's default) are written in shards, moved four
at a time. Reports the time training was blocked per save, the checkpoint's size and files, the
peak RSS above the baseline taken at the start of each save and of each resume (after Keras and
its backend are imported: TensorFlow's import alone is 0.6 GB), and the resume
times (each in a fresh process) against plain Keras reading the same checkpoint: its
``load_model`` of the ``.keras`` file or, for shards, ``model_from_json`` and ``load_weights``
of ``model.weights.json`` (from ``gs://``: after a gcsfs ``get`` of the folder), and against
resumable's own download of every file before loading ("fetch, then load": the effect of
loading shards as they land).

    python benchmarks/bench_scale.py                       # 250M parameters (~3 GB), local, shards of 1 GiB
    python benchmarks/bench_scale.py --gcs                 # the same to gs:// on fake-gcs-server
    python benchmarks/bench_scale.py --max-shard-size 0    # one model.keras, as before shards
    python benchmarks/bench_scale.py --params 20e6         # a quick look
    python benchmarks/bench_scale.py --backend both        # TensorFlow, then JAX (default: KERAS_BACKEND)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_list import emulator  # noqa: E402
from bench_save import RSS  # noqa: E402  (the same sampler as the save benchmark)

LOADS = ("keras", "resume(build_model)", "resume()", "fetch, then load")


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
    """Time one load of the run's newest checkpoint in this fresh process; print seconds and MB
    (the peak over the resident set once Keras and its backend are imported: what the load
    itself holds, as tests/keras/test_resume_memory.py measures it)."""
    import keras  # noqa: F401  (its backend with it)

    import resumable

    latest = resumable.RunStorage(args.folder).latest()
    assert latest is not None and latest.manifest is not None
    rss = RSS()
    started = time.perf_counter()
    if args.load == "keras":
        plain_keras_load(args.folder, latest.name, latest.manifest.payload or "model.keras")
    elif args.load == "resume()":
        resumable.resume(args.folder, monitor="loss")
    elif args.load == "fetch, then load":  # what resume() did before it read shards as they land
        from resumable.keras.checkpoint import files_to_model, state_file

        manager = resumable.CheckpointCallback(args.folder, monitor="loss").manager
        found = manager.fetch_newest(warn=print, check=state_file.read_state)
        assert found is not None
        files_to_model.load_model(found[1], None, where=found[0].url)
    else:
        resumable.resume(args.folder, build_model=lambda: build_model(args.params), monitor="loss")
    print(time.perf_counter() - started, rss.over())
    return 0


def plain_keras_load(url: str, name: str, payload: str) -> Any:
    """What a Keras user does by hand with the same checkpoint (from gs://: a gcsfs ``get`` first)."""
    import fsspec
    import keras

    with tempfile.TemporaryDirectory(prefix="bench-scale-get-") as local:
        folder = f"{url}/{name}"
        if url.startswith("gs://"):
            fs = fsspec.filesystem("gs")
            fs.get(f"{folder}/", f"{local}/", recursive=True)
            folder = local
        if payload == "model.keras":
            return keras.saving.load_model(f"{folder}/model.keras")
        with open(f"{folder}/config.json") as config:
            model = keras.models.model_from_json(config.read())
        model.optimizer.build(model.trainable_variables)
        model.load_weights(f"{folder}/{payload}")
        return model


@contextlib.contextmanager
def run_folder(args: argparse.Namespace, tmp: str) -> Iterator[str]:
    """The run folder: ``--folder``, else a new one locally or in a bucket of a fake-gcs-server."""
    if args.folder:
        yield args.folder
        return
    if not args.gcs:
        yield f"{tmp}/run"
        return
    import fsspec

    with emulator() as endpoint:
        print(f"fake-gcs-server at {endpoint}", flush=True)
        bucket = f"bench-scale-{uuid.uuid4().hex[:8]}"
        fsspec.filesystem("gs").mkdir(bucket)
        yield f"gs://{bucket}/run"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=250e6)
    parser.add_argument("--folder", default=None, help="run folder (default: a temporary folder)")
    parser.add_argument("--gcs", action="store_true", help="a run folder in a fresh fake-gcs-server")
    parser.add_argument("--max-shard-size", type=float, default=1.0, help="GiB; 0: one file")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the timed loads (default 3)")
    parser.add_argument("--backend", choices=["tensorflow", "jax", "both"], default=None,
                        help="Keras backend; both: one process each (default: KERAS_BACKEND)")
    parser.add_argument("--load", choices=LOADS, help=argparse.SUPPRESS)  # one timed load (a child)
    args = parser.parse_args(argv)
    if args.backend == "both":  # KERAS_BACKEND counts only before Keras is imported: a process each
        same = ["--params", str(args.params), "--max-shard-size", str(args.max_shard_size),
                "--rounds", str(args.rounds), *(["--gcs"] if args.gcs else [])]
        for backend in ("tensorflow", "jax"):  # a folder of its own each (--folder is one run's)
            print(f"\n== {backend} ==", flush=True)
            if subprocess.run([sys.executable, __file__, *same, "--backend", backend]).returncode:
                return 1
        return 0
    if args.backend is not None:
        os.environ["KERAS_BACKEND"] = args.backend  # the timed loads, children, inherit it
    if args.load:
        return load_once(args)

    import keras


    def build() -> keras.Model:
        return build_model(args.params)

    tmp = tempfile.mkdtemp(prefix="bench-scale-")
    try:
        with run_folder(args, tmp) as folder:
            return measure(args, build, folder, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(args: argparse.Namespace, build: Any, folder: str, tmp: str) -> int:
    import keras
    import numpy as np

    import resumable

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
                                              staging_dir=f"{tmp}/staging",
                                              max_shard_size=args.max_shard_size or None)
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
    assert latest.manifest is not None
    files = latest.manifest.files
    print(f"checkpoint {size:,.0f} MB ({latest.name}, {len(files)} files: "
          f"{', '.join(f'{rel} {entry.size / 2**20:,.0f} MB' for rel, entry in sorted(files.items()))}); "
          f"fit with 2 saves {total:.1f} s")
    print(f"blocked per save: {', '.join(f'{b:.3f} s' for b in blocked)}")
    print(f"peak RSS over the baseline per save window: {', '.join(f'{p:,.0f} MB' for p in peaks)} "
          f"({max(peaks) / size:.2f}x the checkpoint); training alone, same windows: "
          f"{', '.join(f'{p:,.0f} MB' for p in alone)}", flush=True)

    # Each load in a fresh process: its peak is its own, and the training above is not in it.
    # Rounds in rotated order; each round's time over plain Keras' in the same round.
    times: dict[str, list[float]] = {how: [] for how in LOADS}
    peaks_mb: dict[str, float] = {}
    for number in range(args.rounds):
        for how in LOADS[number % len(LOADS):] + LOADS[:number % len(LOADS)]:
            done = subprocess.run([sys.executable, __file__, "--load", how, "--folder", folder,
                                   "--params", str(args.params)], capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{how} failed:\n{done.stderr[-3000:]}")
            seconds, peak = map(float, done.stdout.split()[-2:])
            times[how].append(seconds)
            peaks_mb[how] = max(peaks_mb.get(how, 0.0), peak)
    for how in LOADS:
        ratios = sorted(t / k for t, k in zip(times[how], times["keras"], strict=True))
        print(f"{how:<18} median {statistics.median(times[how]):6.2f} s, {statistics.median(ratios):.2f}x "
              f"plain Keras (range {ratios[0]:.2f}x to {ratios[-1]:.2f}x over {args.rounds} rounds); "
              f"peak RSS over baseline {peaks_mb[how]:,.0f} MB ({peaks_mb[how] / size:.2f}x)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
