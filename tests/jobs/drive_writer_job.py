"""A writer of the two-writer Drive tests: a lease and small commits, no Keras (it starts fast).

    python tests/jobs/drive_writer_job.py FOLDER --host NAME --commits N [--every S] [--lease-timeout T]

FOLDER is this "machine's" view of the shared Drive folder (tests/drive_visibility.py). The lease
names host NAME, as a process on another Colab VM would. Once it holds the lease it commits
checkpoints numbered on from the newest one it sees, each holding ``model.keras`` =
"NAME epoch E" and a few KB, one every S seconds. Prints one marker per line, flushed:

    HELD after=<newest epoch seen>   the lease is ours
    COMMITTED <name>                 a checkpoint is committed
    DONE                             all committed, the lease released; exit 0
    LEASE_HELD <message>             another process holds the lease; exit 3
    LEASE_LOST <message>             another process took the lease over; exit 4
    EXISTS <message>                 the name is committed already (another writer); exit 5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--host", required=True)
    parser.add_argument("--commits", type=int, default=3)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--lease-timeout", type=float, default=2.0)
    args = parser.parse_args(argv)

    from resumable import Manifest, RunStorage
    from resumable.core.errors import CheckpointExistsError, LeaseHeldError, LeaseLostError
    from resumable.storage import lease, this_machine

    this_machine.HOST = args.host
    storage = RunStorage(args.folder)
    held = lease.Lease(storage, timeout=args.lease_timeout)
    try:
        held.acquire()
    except LeaseHeldError as e:
        print(f"LEASE_HELD {e}", flush=True)
        return 3
    held.start_renewing()
    storage.fence = held.fence
    latest = storage.latest()
    after = latest.epoch if latest is not None and latest.epoch is not None else 0
    print(f"HELD after={after}", flush=True)
    stage_root = Path(tempfile.mkdtemp(prefix="drive-writer-"))
    try:
        for epoch in range(after + 1, after + 1 + args.commits):
            stage = stage_root / str(epoch)
            stage.mkdir()
            (stage / "model.keras").write_bytes(f"{args.host} epoch {epoch}".encode() + bytes(4096))
            (stage / "state.json").write_bytes(b'{"epoch": %d}' % epoch)
            name = f"ckpt-{epoch:06d}"
            storage.commit(stage, name, Manifest(epoch=epoch, step=epoch))
            print(f"COMMITTED {name}", flush=True)
            time.sleep(args.every)
    except LeaseLostError as e:
        print(f"LEASE_LOST {e}", flush=True)
        return 4
    except CheckpointExistsError as e:
        print(f"EXISTS {e}", flush=True)
        return 5
    held.release()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
