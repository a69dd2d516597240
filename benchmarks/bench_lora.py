"""Trainable-only against full checkpoints of a keras-hub Gemma with LoRA: sizes and times.

    python benchmarks/bench_lora.py                # the 2-layer test model (seconds)
    python benchmarks/bench_lora.py --model 2b     # Gemma 2B's shape, bfloat16 (minutes, ~12 GB RAM)

Builds the model from a config with seeded random weights (nothing is downloaded), enables
LoRA (rank 4), trains one step so the optimizer has its state, then times resumable's own
serialization (``model_to_files.save``: what blocks training; the upload runs in the background)
and load (``files_to_model.load_into``) of each kind of checkpoint, and the fingerprint of the
frozen weights (once a session: the first save, or the check of a resume; the saves after it
reuse it). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MODELS = {
    "tiny": {"vocabulary_size": 256, "num_layers": 2, "num_query_heads": 2, "num_key_value_heads": 1,
             "hidden_dim": 64, "intermediate_dim": 128, "head_dim": 32},
    # keras-hub's gemma_2b_en preset
    "2b": {"vocabulary_size": 256000, "num_layers": 18, "num_query_heads": 8, "num_key_value_heads": 1,
           "hidden_dim": 2048, "intermediate_dim": 32768, "head_dim": 256},
}


def build(config: dict[str, Any], dtype: str) -> Any:
    import keras
    import keras_hub

    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GemmaBackbone(**config, dtype=dtype)
    backbone.enable_lora(rank=4)
    model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--dtype", help="the model's dtype (default: float32 for tiny, bfloat16 for 2b)")
    args = parser.parse_args(argv)
    dtype = args.dtype or ("float32" if args.model == "tiny" else "bfloat16")

    import keras
    import numpy as np

    from resumable.core.display import human_size
    from resumable.keras.checkpoint import files_to_model, model_to_files, trainable

    started = time.perf_counter()
    model = build(MODELS[args.model], dtype)
    built = time.perf_counter() - started
    tokens = np.ones((1, 8), dtype="int32")
    model.fit({"token_ids": tokens, "padding_mask": tokens}, tokens, batch_size=1, verbose=0)
    weights = sum(int(np.prod(w.shape)) for w in model.weights)
    trains = sum(int(np.prod(w.shape)) for w in model.trainable_weights)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trainable._fingerprints.clear()
        fingerprint = timed(lambda: trainable.fingerprint(model))
        for name, options in (("full (`model.keras`)", {"weights_only": False}),
                              ("full, `save_weights_only`", {"weights_only": True}),
                              ("`save_trainable_only`", {"weights_only": False, "trainable_only": True})):
            folder = Path(tmp) / name.replace(" ", "_")
            trainable.fingerprint(model)  # a session's first save computes it; the others reuse it
            saved = timed(lambda folder=folder, options=options: model_to_files.save(
                model, folder, state={}, **options))
            size = folder_size(folder)
            trainable._fingerprints.clear()  # a resuming session computes it again, to check it
            loaded = timed(lambda folder=folder: files_to_model.load_into(model, folder, str(folder)))
            rows.append((name, size, saved, loaded))
            for path in folder.iterdir():
                path.unlink()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    print(f"Gemma `{args.model}` ({dtype}, {keras.backend.backend()}): {weights:,} weights, {trains:,} "
          f"trainable with LoRA rank 4 ({trains / weights:.3%}); built in {built:.1f} s; frozen-weight "
          f"fingerprint {fingerprint:.2f} s; peak RSS {human_size(peak)}\n")
    print("| checkpoint | size | of full | a save (staging) | load into the built model, checks included |")
    print("|---|---|---|---|---|")
    full = rows[0][1]
    for name, size, saved, loaded in rows:
        print(f"| {name} | {human_size(size)} | {size / full:.2%} | {saved:.2f} s | {loaded:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
