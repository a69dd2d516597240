"""A save of a model that is one big embedding, written within a budget of 0 while this process'
resident memory is sampled (#54: a big variable is written in slices).

    KERAS_BACKEND=jax python tests/jobs/slice_peak_job.py FOLDER [--format F] [--slice-bytes N]

Builds Embedding(32768, 1024) (128 MiB, float32) with SGD, takes a snapshot with a budget of 0
(``--format``: weights, keras or sharded) and writes it, sampling ``/proc/self/statm`` every
millisecond from just before the write. ``--slice-bytes``: `snapshot.SLICE_BYTES` (a huge
value reads the variable whole). On a CPU, TensorFlow's and JAX's whole read shares the
variable's buffer; a GPU's or TPU's is a copy to the host: ``--copying-reads`` makes the whole
read a copy, as there. Prints ``WRITTEN peak_growth=<bytes over the baseline>
variable=<bytes> slices=<reads of slices> crc=<the payload's CRC32>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).parent))

from resume_memory_job import Peak  # noqa: E402

ROWS, COLUMNS = 32_768, 1_024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--format", choices=["weights", "keras", "sharded"], default="weights")
    parser.add_argument("--slice-bytes", type=int, default=8 * 2**20)
    parser.add_argument("--copying-reads", action="store_true")
    args = parser.parse_args()
    import keras
    import numpy as np

    from resumable.keras.checkpoint import model_to_files, snapshot

    snapshot.SLICE_BYTES = args.slice_bytes
    if args.copying_reads:
        shared = snapshot._host_copy
        snapshot._host_copy = lambda value: np.array(shared(value), copy=True)
        snapshot.whole_read_is_free = lambda variable: False
    slices = []
    read = snapshot.LiveValue.read

    def counted(self: snapshot.LiveValue, start: int, stop: int) -> np.ndarray:
        slices.append(stop - start)
        return read(self, start, stop)

    snapshot.LiveValue.read = counted  # type: ignore[method-assign]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(ROWS, COLUMNS)])
    model.compile(optimizer="sgd", loss="mse")
    taken = model_to_files.snapshot(model, weights_only=args.format == "weights", state={}, budget=0,
                                    max_shard_size=0.1 if args.format == "sharded" else None)
    assert taken is not None and taken.streamed
    for variable in model.weights:  # the initializer done (JAX dispatches it asynchronously)
        float(keras.ops.convert_to_numpy(keras.ops.sum(variable)))
    peak = Peak()
    entries = taken.write(Path(args.folder))
    grown = peak.stop()
    payload = "model_00000.weights.h5" if taken.sharded else taken.payload
    crc = zlib.crc32((Path(args.folder) / payload).read_bytes())
    print(f"WRITTEN peak_growth={grown} variable={ROWS * COLUMNS * 4} slices={len(slices)} crc={crc} "
          f"files={len(entries)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
