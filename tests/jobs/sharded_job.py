"""Train into a run folder with weights in shards, resume it, and compare with a run never stopped.

    python sharded_job.py RUN_FOLDER     (KERAS_BACKEND picks the backend)

Prints EQUAL when a run resumed from a sharded checkpoint (with and without build_model) ends
with the weights and optimizer state of one that trained straight through.
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras
import numpy as np

import resumable
from resumable.keras import compat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: reshard
from reshard import reshard  # noqa: E402

TINY = 4e-6  # GiB: several shards for this model
X = np.random.default_rng(3).normal(size=(64, 16)).astype("float32")
Y = X[:, :2] * 0.5


def build() -> keras.Model:
    keras.utils.set_random_seed(11)
    inputs = keras.Input((16,))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(32, activation="relu")(inputs)))
    model.compile(optimizer="adam", loss="mse")
    return model


def values(model: keras.Model) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v) for v in [*model.weights, *model.optimizer.variables]]


def main(run: str) -> int:
    straight = resumable.resume(run + "-straight", build_model=build, monitor="loss", max_shard_size=TINY)
    straight.fit(X, Y, epochs=3, batch_size=16, verbose=0)
    first = resumable.resume(run, build_model=build, monitor="loss", max_shard_size=TINY, keep_last=None)
    first.fit(X, Y, epochs=2, batch_size=16, verbose=0)
    if not compat.can_shard():  # a Keras that writes one file: shards as a newer one writes them
        reshard(Path(run), int(TINY * 2**30))
    for build_model in (None, build):
        resumed = resumable.resume(run, build_model=build_model, monitor="loss", max_shard_size=TINY)
        assert resumed.initial_epoch == 2, resumed.initial_epoch
        resumed.fit(X, Y, epochs=3, batch_size=16, verbose=0)
        for a, b in zip(values(resumed.model), values(straight.model), strict=True):
            if not np.array_equal(a, b):
                print("DIFFERENT")
                return 1
        # The next one resumes at epoch 2 again. Deleted as a new process would: this fit gave its
        # writer lease back, and a writer that did writes nothing more.
        resumable.RunStorage(run).delete("ckpt-000003")
    print("EQUAL")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
