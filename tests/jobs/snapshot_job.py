"""A snapshot taken, training going on, then its files written: do they hold the snapshot's step?

    KERAS_BACKEND=jax python tests/jobs/snapshot_job.py FOLDER [--weights-only]

Trains a small functional model one epoch, takes `model_to_files.snapshot`, records the weights and
optimizer variables, trains another epoch (on JAX the next step donates the variables'
buffers), then writes the snapshot and loads it back with plain Keras (``load_model``, or
``load_weights`` into a fresh model). Prints ``EQUAL`` when every weight and optimizer
variable equals the recorded one bitwise and differs from the final one, else ``DIFFERENT``
and the first variable that differs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def build() -> object:
    import keras

    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dropout(0.2)(hidden)))
    model.compile(optimizer="adam", loss="mse")
    return model


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--weights-only", action="store_true")
    args = parser.parse_args()

    import keras
    import numpy as np

    from resumable.keras.checkpoint import model_to_files, snapshot

    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    y = x[:, :2] * 2
    model = build()
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    taken = model_to_files.snapshot(model, weights_only=args.weights_only, state={"epoch": 1})
    assert taken is not None, "this Keras lacks what snapshots need"
    recorded = [np.array(keras.ops.convert_to_numpy(v)) for v in model.weights + model.optimizer.variables]
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # the values move on; the snapshot must not
    final = [np.array(keras.ops.convert_to_numpy(v)) for v in model.weights + model.optimizer.variables]
    taken.write(args.folder)
    if args.weights_only:
        loaded = build()
        loaded.optimizer.build(loaded.trainable_variables)
        loaded.load_weights(str(args.folder / snapshot.WEIGHTS_FILE))
    else:
        loaded = keras.saving.load_model(str(args.folder / snapshot.MODEL_FILE))
    got = [np.array(keras.ops.convert_to_numpy(v)) for v in loaded.weights + loaded.optimizer.variables]
    for i, (a, b) in enumerate(zip(got, recorded, strict=True)):
        if not np.array_equal(a, b):
            print(f"DIFFERENT variable {i}")
            return 1
    if all(np.array_equal(a, c) for a, c in zip(got, final, strict=True)):
        print("DIFFERENT: equal to the final values, training did not move on")
        return 1
    print(f"EQUAL {len(got)} variables; {'TENSORFLOW' if 'tensorflow' in sys.modules else 'no tensorflow'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
