"""Mixed precision runs stopped and resumed, against runs never stopped, on the backend KERAS_BACKEND names.

    KERAS_BACKEND=jax python tests/jobs/mixed_precision_job.py FOLDER

For each policy (``mixed_float16``, whose optimizer is a LossScaleOptimizer, and ``mixed_bfloat16``)
and each checkpoint kind (the ``.keras`` file, ``save_weights_only``, ``save_trainable_only``):
trains 3 epochs straight; trains 1 epoch, resumes with ``resumable.resume`` into a new model
and trains to 3; then compares every variable of the two models and of their optimizers,
bit for bit. The loss scale grows every 3 steps, so float16 overflows: steps are skipped and
the scale moves (and its step counter), state the resume must carry. Prints one line per case:

    CASE <policy> <kind> differ=<variable paths that differ, comma-separated, or nothing> steps=<n> scale=<s>
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

KINDS = {"keras": {}, "weights": {"save_weights_only": True}, "trainable": {"save_trainable_only": True}}
FIT = {"batch_size": 16, "shuffle": False, "verbose": 0}


def build(policy: str) -> Any:
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, dtype="float32")])
    optimizer = keras.optimizers.Adam(1e-2)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, dynamic_growth_steps=3)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def differing(a: Any, b: Any) -> list[str]:
    import keras
    import numpy as np

    pairs = [*zip(a.variables, b.variables, strict=True),
             *zip(a.optimizer.variables, b.optimizer.variables, strict=True)]
    return [x.path for x, y in pairs
            if not np.array_equal(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y))]


def main(folder: str) -> int:
    import keras
    import numpy as np

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    import resumable

    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype("float32")
    y = (x[:, :1] * 2).astype("float32")
    for policy in ("mixed_float16", "mixed_bfloat16"):
        keras.mixed_precision.set_global_policy(policy)
        for kind, options in KINDS.items():
            where = os.path.join(folder, f"{policy}-{kind}")
            build_model = functools.partial(build, policy)
            straight = resumable.resume(where + "-straight", build_model=build_model, **options)
            straight.fit(x, y, epochs=3, **FIT)
            first = resumable.resume(where, build_model=build_model, **options)
            first.fit(x, y, epochs=1, **FIT)
            resumed = resumable.resume(where, build_model=None if kind == "keras" else build_model, **options)
            assert resumed.initial_epoch == 1, resumed
            resumed.fit(x, y, epochs=3, **FIT)
            optimizer = resumed.model.optimizer
            steps = int(keras.ops.convert_to_numpy(optimizer.iterations))
            scale = float(keras.ops.convert_to_numpy(getattr(optimizer, "dynamic_scale", 1.0)))
            print(f"CASE {policy} {kind} differ={','.join(differing(straight.model, resumed.model))} "
                  f"steps={steps} scale={scale:g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
