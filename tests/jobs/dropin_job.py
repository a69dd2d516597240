"""Train with resumable.ModelCheckpoint or resumable.BackupAndRestore, or save with
resumable.save_model; optionally die mid-save.

    python tests/jobs/dropin_job.py model_checkpoint|backup_and_restore|save_model URL --epochs N
        [--kill-at-save K | --kill-in-record K]

``--kill-at-save K``: SIGKILL this process while the K-th file (ModelCheckpoint, save_model) or
the K-th backup (BackupAndRestore) is being written: after its bytes were sent, before the write
is complete (before the rename locally, before the upload's close on GCS). ``--kill-in-record
K``: SIGKILL it while the K-th checksum record is replaced, its temporary copy written and
fsynced, before the rename (local folders). ``save_model`` saves the model after each of the N
epochs to URL. Prints ``EPOCHS <n>`` with the epochs this session trained (BackupAndRestore) and
``DONE``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import numpy as np

FILES_PER_BACKUP = 3  # model.weights.h5, state.json, arrays.npz


def arm_kill(modules: tuple[Any, ...], owner: Any, method: str, at: int) -> None:
    """SIGKILL this process inside the ``at``-th call of ``owner.method``, once a chunk is written
    (the modules' RunningCrc32c is updated right after each write) and before the file is complete."""
    armed = [False]
    calls = [0]
    original_method = getattr(owner, method)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        armed[0] = calls[0] == at
        try:
            return original_method(*args, **kwargs)
        finally:
            armed[0] = False

    class Killing(modules[0].RunningCrc32c):  # type: ignore[misc, name-defined]
        def update(self, chunk: bytes) -> None:
            super().update(chunk)
            if armed[0]:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    setattr(owner, method, counting)
    for module in modules:
        module.RunningCrc32c = Killing


def arm_in_place_kill(at: int) -> None:
    """SIGKILL this process in the ``at``-th checkpoint written in place (a local run), once part
    of its first file is on disk and before the file is complete."""
    from resumable.manager.commits import InPlace
    from resumable.storage.written_files import ChecksummedFile

    calls = [0]
    original_commit = InPlace.run
    original_write = ChecksummedFile.write

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original_commit(self, *args, **kwargs)

    def killing(self: Any, data: Any) -> int:
        written = original_write(self, data)
        if calls[0] == at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    InPlace.run = counting  # type: ignore[method-assign]
    ChecksummedFile.write = killing  # type: ignore[method-assign]


def arm_record_kill(at: int) -> None:
    """SIGKILL this process in the ``at``-th record replacement, between its fsync and its rename."""
    from resumable.storage import folder

    calls = [0]
    original = folder.fsync

    def killing(path: str) -> None:
        original(path)
        if path.endswith(".tmp") and ".resumable.json." in path:
            calls[0] += 1
            if calls[0] == at:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    folder.fsync = killing  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["model_checkpoint", "backup_and_restore", "save_model"])
    parser.add_argument("url")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-at-save", type=int, default=0)
    parser.add_argument("--kill-in-record", type=int, default=0)
    args = parser.parse_args()
    if args.kill_in_record:
        arm_record_kill(args.kill_in_record)

    import keras

    import resumable
    from resumable.storage import single_file, transfers

    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    if args.kind in ("model_checkpoint", "save_model"):
        if args.kill_at_save:
            # a local file is copied by single_file, a remote one streamed by transfers.put_streamed
            arm_kill((single_file, transfers), single_file.FileTarget, "_put", args.kill_at_save)
        callback: keras.callbacks.Callback = resumable.ModelCheckpoint(args.url, monitor="loss")
        if args.kind == "save_model":
            callback = keras.callbacks.LambdaCallback(
                on_epoch_end=lambda epoch, logs: resumable.save_model(model, args.url))
    else:
        if args.kill_at_save and "://" in args.url:
            # each backup uploads its files one by one: die in the first file of backup K
            first_file = 1 + FILES_PER_BACKUP * (args.kill_at_save - 1)
            arm_kill((transfers,), transfers.Transfers, "upload", first_file)
        elif args.kill_at_save:  # a local run's backups are written straight into it
            arm_in_place_kill(args.kill_at_save)
        callback = resumable.BackupAndRestore(args.url, delete_checkpoint=False)
    history = model.fit(x, y, batch_size=16, epochs=args.epochs, callbacks=[callback], verbose=0)
    print(f"EPOCHS {len(history.epoch)} FIRST {history.epoch[0] if history.epoch else -1}", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
