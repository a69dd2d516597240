"""A run continued on another Keras backend: TensorFlow (a Colab GPU runtime) and JAX (a TPU VM).

    KERAS_BACKEND=jax python tests/jobs/backend_job.py RUN_URL --epochs 4 --dump state.npz

Resumes RUN_URL (or starts it) on the backend KERAS_BACKEND names, writes what it holds right
after ``resume()`` (``--resumed``) and after training (``--dump``): the weights, the optimizer's
variables (iterations and Adam's moments), the layers' seed-generator states, and in
``<file>.json`` the epochs done, best value and history. Never imports TensorFlow on JAX. Prints:

    READY initial_epoch=<n>     after resume()
    DONE epochs=<n>             training finished
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def seed(value: int) -> None:
    import keras
    import numpy as np

    if keras.backend.backend() == "tensorflow":
        keras.utils.set_random_seed(value)
        return
    # keras.utils.set_random_seed, without its TensorFlow import
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, value)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(value)
    np.random.seed(value)


def build() -> Any:
    import keras

    seed(11)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.1), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    return model


def dump(run: Any, path: str) -> None:
    import keras
    import numpy as np

    model = run.model
    weights = [np.asarray(w) for w in model.get_weights()]
    optimizer = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    seeds = [keras.ops.convert_to_numpy(v) for v in model.variables if all(v is not w for w in model.weights)]
    arrays = {**{f"w{i}": w for i, w in enumerate(weights)}, **{f"o{i}": o for i, o in enumerate(optimizer)},
              **{f"s{i}": s for i, s in enumerate(seeds)}}
    np.savez(path, **arrays)
    with open(path + ".json", "w") as f:
        json.dump({"epochs": run.initial_epoch, "best": run.callback.best, "history": run.history,
                   "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
                   "optimizer": [v.path for v in model.optimizer.variables]}, f)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--resumed", help="write the state right after resume() here (.npz)")
    parser.add_argument("--dump", help="write the state after training here (.npz)")
    args = parser.parse_args(argv)

    import numpy as np

    import resumable

    run = resumable.resume(args.url, build_model=build, monitor="val_loss", keep_last=None)
    print(f"READY initial_epoch={run.initial_epoch}", flush=True)
    if args.resumed:
        dump(run, args.resumed)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(96, 6)).astype("float32")
    y = (x[:, :1] - 2 * x[:, 1:2]).astype("float32")
    seed(12)
    run.fit(x[:80], y[:80], epochs=args.epochs, batch_size=16, validation_data=(x[80:], y[80:]), verbose=0)
    if args.dump:
        dump(run, args.dump)
    print(f"DONE epochs={run.initial_epoch}", flush=True)
    print(f"TENSORFLOW imported={'tensorflow' in sys.modules}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
