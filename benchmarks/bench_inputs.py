"""What resuming a large ``tf.data`` input costs: resumable's replay against TensorFlow's own way,
saving the iterator with ``tf.train.Checkpoint``.

    python benchmarks/bench_inputs.py                 # 500,000 samples of 64 floats, 3 rounds
    python benchmarks/bench_inputs.py --tiny          # seconds: checks that it runs

The pipeline is what keras.io teaches: ``from_tensor_slices(...).map(f, num_parallel_calls=
AUTOTUNE).shuffle(10_000, seed=1).batch(256).prefetch(AUTOTUNE)`` (``.repeat()`` for the stream
rows). Times are to the first batch of the resumed session, as ``model.fit`` would read it
(training excluded, which both ways leave the same):

- **epoch end, epoch 100**: resumable creates (and never reads) the iterators an unbroken run
  created before epoch 100. TensorFlow's iterator checkpoint has nothing to offer here: a new
  session's iterator gives epoch 1's order.
- **mid-epoch, half an epoch in**: resumable reads the first half of that epoch's pass again
  (not training on it); ``tf.train.Checkpoint`` restores the iterator it saved, shuffle buffer
  included, which every save has to write.
- **stream (.repeat(), steps_per_epoch), 1.5 epochs in**: resumable reads every batch since the
  run began (k epochs in: about k epochs of reading); ``tf.train.Checkpoint`` restores its
  iterator.
- **reading an epoch**: batches per second through ``run.fit``'s wrapper against the dataset itself.

Configurations run in rounds, in an order rotated each round; cells are median [min-max].
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 256
BUFFER = 10_000


def pipeline(samples: int, features: int, repeat: bool) -> Any:
    import numpy as np
    import tensorflow as tf

    data = np.random.default_rng(0).normal(size=(samples, features)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices(data).map(
        lambda x: tf.tanh(x) * 2.0, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.shuffle(BUFFER, seed=1).batch(BATCH)
    return (dataset.repeat() if repeat else dataset).prefetch(tf.data.AUTOTUNE)


def first_batch(iterator: Any) -> None:
    next(iterator)


def checkpoint_size(path: str) -> int:
    """Bytes of the files tf.train.Checkpoint wrote at ``path`` (``path.index``, ``path.data-*``)."""
    found = Path(path)
    return sum(p.stat().st_size for p in found.parent.glob(found.name + "*") if p.is_file())


class Scenario:
    """One way to resume: a fresh dataset each time, as a new session builds it."""

    def __init__(self, make: Callable[[], Any], epoch_batches: int, folder: Path) -> None:
        self.make = make
        self.batches = epoch_batches
        self.folder = folder

    def resumable_epoch_end(self, epoch: int) -> Callable[[], None]:
        from resumable.keras.replay import tf_data

        def run() -> None:
            passes = tf_data.Passes(self.make())
            passes.bring_to(passes.slot(epoch, "x"))
            first_batch(iter(passes.wrapper()))
        return run

    def resumable_mid_epoch(self, batch: int) -> Callable[[], None]:
        from resumable.keras.replay import tf_data

        def run() -> None:
            passes = tf_data.Passes(self.make())
            passes.bring_to(passes.slot(0, "x"))
            first_batch(iter(passes.wrapper(skip=batch)))
        return run

    def resumable_stream(self, position: int) -> Callable[[], None]:
        from resumable.keras.replay import tf_data

        def run() -> None:
            first_batch(iter(tf_data.Stream(self.make(), position).wrapper()))
        return run

    def checkpoint_saved_at(self, batch: int) -> tuple[str, float]:
        """An iterator read ``batch`` batches, saved with tf.train.Checkpoint; its path and save time."""
        import tensorflow as tf

        iterator = iter(self.make())
        for _ in range(batch):
            next(iterator)
        started = time.perf_counter()
        path = tf.train.Checkpoint(iterator=iterator).write(str(self.folder / f"it-{batch}"))
        return path, time.perf_counter() - started

    def checkpoint_restore(self, path: str) -> Callable[[], None]:
        import tensorflow as tf

        def run() -> None:
            iterator = iter(self.make())
            tf.train.Checkpoint(iterator=iterator).read(path).assert_consumed()
            first_batch(iterator)
        return run


def read_epoch(dataset: Callable[[], Any], batches: int) -> Callable[[], None]:
    def run() -> None:
        iterator = iter(dataset())
        for _ in range(batches):
            next(iterator)
    return run


def rounds(configs: dict[str, Callable[[], None]], count: int) -> dict[str, list[float]]:
    """Each configuration once per round, the order rotated each round."""
    names = list(configs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(count):
        for name in names[r % len(names):] + names[:r % len(names)]:
            started = time.perf_counter()
            configs[name]()
            times[name].append(time.perf_counter() - started)
    return times


def cell(values: list[float], scale: float = 1.0, unit: str = "s") -> str:
    values = [v * scale for v in values]
    median = statistics.median(values)
    digits = 0 if median >= 100 else 1 if median >= 10 else 2 if median >= 1 else 3
    return f"{median:.{digits}f} {unit} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=500_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a few thousand samples, one round")
    args = parser.parse_args(argv)
    if args.tiny:
        args.samples, args.rounds = 20_000, 1
    import tensorflow as tf

    from resumable.core.display import format_table, human_size
    from resumable.keras.replay import tf_data

    batches = -(-args.samples // BATCH)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        passes = Scenario(lambda: pipeline(args.samples, args.features, repeat=False), batches, folder)
        stream = Scenario(lambda: pipeline(args.samples, args.features, repeat=True), batches, folder)
        half = batches // 2
        mid_path, mid_save = passes.checkpoint_saved_at(half)
        stream_path, stream_save = stream.checkpoint_saved_at(batches + half)
        epoch = 100 if not args.tiny else 5
        configs = {
            f"epoch end, epoch {epoch}: resumable": passes.resumable_epoch_end(epoch),
            "mid-epoch, half an epoch in: resumable": passes.resumable_mid_epoch(half),
            "mid-epoch, half an epoch in: tf.train.Checkpoint": passes.checkpoint_restore(mid_path),
            "stream, 1.5 epochs in: resumable": stream.resumable_stream(batches + half),
            "stream, 1.5 epochs in: tf.train.Checkpoint": stream.checkpoint_restore(stream_path),
            "reading an epoch: the dataset": read_epoch(passes.make, batches),
            "reading an epoch: run.fit's wrapper": read_epoch(
                lambda: tf_data.Passes(passes.make()).wrapper(), batches),
        }
        times = rounds(configs, args.rounds)
        sizes = checkpoint_size(mid_path), checkpoint_size(stream_path)

    rows = [[name, cell(values)] for name, values in times.items()]
    size = human_size(args.samples * args.features * 4)
    print(f"{args.samples:,} samples of {args.features} float32 ({size}), batches of {BATCH} ({batches} per "
          f"epoch), shuffle buffer {BUFFER:,}; TensorFlow {tf.__version__}; {args.rounds} round(s), "
          "median [min-max]\n")
    print("\n".join(format_table(["to the first batch of the resumed session", "time"], rows, right={1})))
    raw, wrapped = times["reading an epoch: the dataset"], times["reading an epoch: run.fit's wrapper"]
    ratios = [w / r for w, r in zip(wrapped, raw, strict=True)]
    print(f"\nreading through run.fit's wrapper / the dataset: {statistics.median(ratios):.2f}x "
          f"[{min(ratios):.2f}-{max(ratios):.2f}]")
    print(f"tf.train.Checkpoint of the iterator, written at each save: {human_size(sizes[0])} in "
          f"{mid_save:.2f} s (mid-epoch), {human_size(sizes[1])} in {stream_save:.2f} s (stream); "
          "resumable records a batch count")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
