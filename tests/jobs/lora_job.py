"""A LoRA fine-tune of a keras-hub model, as on Colab, small enough for a test: killed and resumed.

    KERAS_BACKEND=jax python tests/jobs/lora_job.py RUN_URL --epochs 3 --trainable-only --out final.npz

A 2-layer Gemma causal LM built from a config with seeded random weights (no download), with
``backbone.enable_lora(rank=4)``, trains on fixed synthetic tokens; resumes RUN_URL (or starts
it) with ``resumable.resume``. ``--out`` gets the final state: every weight (``w<i>``), every
optimizer variable (``o<i>``), and in ``<out>.json`` their paths and which weights train.
Prints one marker per line on stdout, flushed:

    READY initial_epoch=<n> batch=<n>   after resume(), before training
    LOG resumable: saving <name>        a save starts (from the "resumable" logger)
    LOG resumable: saved <name> ...     a save is committed
    DONE epochs=<n>                     training finished
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

SEQUENCES = 48
LENGTH = 16
BATCH = 8  # 6 batches an epoch
VOCABULARY = 256


def build_model() -> Any:
    """What a notebook's build function does with ``from_preset``: the same base every session."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(11)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=VOCABULARY, num_layers=2, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=64, intermediate_dim=128, head_dim=32,
    )
    backbone.enable_lora(rank=4)
    model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data() -> tuple[dict[str, Any], Any]:
    import numpy as np

    rng = np.random.default_rng(5)
    tokens = rng.integers(1, VOCABULARY, size=(SEQUENCES, LENGTH + 1)).astype("int32")
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((SEQUENCES, LENGTH), dtype="int32")}
    return x, tokens[:, 1:]


def dump(model: Any, path: str) -> None:
    import keras
    import numpy as np

    trained = {id(v) for v in model.trainable_variables}
    arrays = {f"w{i}": keras.ops.convert_to_numpy(w) for i, w in enumerate(model.weights)}
    arrays.update({f"o{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.optimizer.variables)})
    np.savez(path, **arrays)
    with open(path + ".json", "w") as f:
        json.dump({"weights": [w.path for w in model.weights],
                   "trainable": [id(w) in trained for w in model.weights],
                   "optimizer": [v.path for v in model.optimizer.variables]}, f)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--trainable-only", action="store_true")
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--batch-sleep", type=float, default=0.0, help="sleep this long after each batch")
    parser.add_argument("--out", help="write the final state here (.npz)")
    args = parser.parse_args(argv)

    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    import resumable

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    log = logging.getLogger("resumable")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    run = resumable.resume(args.url, build_model=build_model, save_trainable_only=args.trainable_only,
                           save_freq=save_freq, monitor="loss", keep_last=2)
    print(f"READY initial_epoch={run.initial_epoch} batch={run.callback.resume_batch}", flush=True)

    class Sleep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            time.sleep(args.batch_sleep)

    x, y = data()
    keras.utils.set_random_seed(12)
    run.fit(x, y, epochs=args.epochs, batch_size=BATCH, verbose=0,
            callbacks=[Sleep()] if args.batch_sleep else [])
    if args.out:
        dump(run.model, args.out)
    print(f"DONE epochs={run.initial_epoch}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
