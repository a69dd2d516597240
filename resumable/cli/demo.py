"""`resumable demo`: train a small model, kill it mid-training, resume it, list the checkpoints,
and check that the resumed run ends with the same weights as one never killed.

Everything runs on the local disk and the CPU; no cloud account needed. The training runs in
a child process so that it can be killed for real (SIGKILL, like a Colab runtime that dies).
The unbroken reference run trains into a temporary folder, deleted at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from resumable.cli.child_output import BannerOnce, forward

DEFAULT_FOLDER = "./resumable-demo"
EPOCHS = 8
KILL_AFTER_EPOCH = 3


def main(folder: str | None = None) -> int:
    """Run the demo in a new run folder under ``folder``; return an exit code.

    Called by `resumable demo`, whose `resumable.cli.app.main` reports any error it raises.
    """
    from resumable.cli.listing import run_list
    from resumable.storage import RunStorage

    run = Path(folder or DEFAULT_FOLDER) / datetime.now().strftime("run-%Y%m%d-%H%M%S")
    storage = RunStorage(str(run))
    banner = BannerOnce()  # TensorFlow's start-up lines: once for the demo, not twice a process
    print(f"resumable demo: training a small model for {EPOCHS} epochs into {run}", flush=True)
    with tempfile.TemporaryDirectory(prefix="resumable-demo-") as scratch:
        resumed_weights, unbroken_weights = Path(scratch) / "resumed.npz", Path(scratch) / "unbroken.npz"

        print(f"\n== Session 1: train; the runtime dies (SIGKILL) after epoch {KILL_AFTER_EPOCH}", flush=True)
        child = _start_training(run, resumed_weights, banner)
        deadline = time.monotonic() + 600
        while child.poll() is None and time.monotonic() < deadline:
            with _quiet():  # a checkpoint being written is no news: the child says its own lines
                latest = storage.latest()
            if latest is not None and latest.epoch is not None and latest.epoch >= KILL_AFTER_EPOCH:
                break
            time.sleep(0.2)
        if child.poll() is not None:
            print(f"error: training ended early with exit code {child.returncode}", file=sys.stderr)
            return 2
        child.send_signal(signal.SIGKILL)
        child.wait()
        print(f"-- killed the training process (pid {child.pid}) with SIGKILL", flush=True)
        resumed_from = storage.latest()

        print("\n== Session 2: run the same code again; it continues where it stopped", flush=True)
        child = _start_training(run, resumed_weights, banner)
        if child.wait() != 0:
            print(f"error: the resumed training failed with exit code {child.returncode}", file=sys.stderr)
            return 2

        print("\n== The checkpoints (`resumable list`):", flush=True)
        code = run_list(str(run))
        if resumed_from is not None:
            print(f"session 2 resumed from {resumed_from.name}, the last checkpoint session 1 committed "
                  "before the kill (the demo keeps every checkpoint: keep_last=None)", flush=True)

        print(f"\n== For comparison: the same {EPOCHS} epochs, never killed (in a temporary folder)",
              flush=True)
        child = _start_training(Path(scratch) / "unbroken", unbroken_weights, banner, reference=True)
        if child.wait() != 0:
            print(f"error: the unbroken training failed with exit code {child.returncode}", file=sys.stderr)
            return 2
        print(_compare(resumed_weights, unbroken_weights), flush=True)
    return code


def _compare(resumed: Path, unbroken: Path) -> str:
    """One line: do the resumed run's final weights equal those of the run never killed?"""
    import numpy as np

    with np.load(resumed) as a, np.load(unbroken) as b:
        if sorted(a.files) != sorted(b.files) or any(a[k].shape != b[k].shape for k in a.files):
            return "resumed vs never killed: the final models differ in shape (this is a bug)"
        pairs = [(a[key], b[key]) for key in a.files]
    if all(np.array_equal(x, y) for x, y in pairs):
        return (f"resumed vs never killed: the final weights are bitwise equal ({len(pairs)} arrays); "
                "the kill cost only the time of the epoch in progress")
    differ = max(float(np.max(np.abs(x - y))) for x, y in pairs if x.size)
    return (f"resumed vs never killed: the final weights differ by up to {differ:.3g} "
            "(expected only with nondeterministic ops)")


class _Training(subprocess.Popen[bytes]):
    """A training process whose stderr a thread passes on; `wait` lets that thread finish too."""

    stderr_thread: threading.Thread | None = None

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        if self.stderr_thread is not None:
            self.stderr_thread.join(timeout=10)
        return code


def _start_training(run: Path, weights: Path, banner: BannerOnce, reference: bool = False) -> _Training:
    """The training in a child process; it writes its final weights to ``weights``.

    ``reference``: the run never killed, quiet and at full speed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    argv = [sys.executable, "-m", "resumable.cli.demo", "--train", str(run), str(weights)]
    if reference:
        argv.append("--reference")
    child = _Training(argv, env=env, stdout=subprocess.DEVNULL if reference else None, stderr=subprocess.PIPE)
    assert child.stderr is not None
    child.stderr_thread = forward(child.stderr, sys.stderr, banner)
    return child


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """resumable's warnings off: the demo's own process only watches the run folder."""
    log = logging.getLogger("resumable")
    before = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(before)


def _train(run: str, weights: str, slow: bool = True) -> None:
    """What a user's notebook does: resume(), then run.fit(). Runs in the child process."""
    import keras
    import numpy as np

    import resumable

    def build_model() -> keras.Model:
        model = keras.Sequential([
            keras.Input(shape=(20,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=["accuracy"])
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 20)).astype("float32")
    y = (x[:, :5].sum(axis=1) > 0).astype("float32")

    keras.utils.set_random_seed(0)
    if keras.backend.backend() == "tensorflow":  # deterministic ops: a resumed run ends bitwise equal
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    # Every checkpoint is kept, so the listing shows both sessions' (the default keeps the last 3).
    run_ = resumable.resume(run, build_model=build_model, monitor="val_loss", keep_last=None)
    if run_.checkpoint is None:
        print(f"new run: starting at epoch 1 of {EPOCHS}", flush=True)
    else:
        print(f"resumed from {run_.checkpoint.name}: {run_.initial_epoch} epochs done, "
              f"continuing at epoch {run_.initial_epoch + 1} of {EPOCHS}", flush=True)
    # Slow each epoch down a little, so that the kill lands mid-training as on a real runtime.
    pause = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: time.sleep(0.5))
    run_.fit(x, y, epochs=EPOCHS, batch_size=64, validation_split=0.2, callbacks=[pause] if slow else [],
             verbose=2)
    np.savez(weights, *[np.asarray(w) for w in run_.model.get_weights()])


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--train":
        _train(sys.argv[2], sys.argv[3], slow=sys.argv[4:] != ["--reference"])
    else:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
