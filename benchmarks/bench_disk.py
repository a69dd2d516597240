"""The floor of a save's background write on this machine: the same bytes written by hand.

Each round writes ``--mb`` MB from memory into a new file (in 64 MiB writes, as a writer thread
would), then fsyncs it, and copies the same bytes in memory. A checkpoint's last save cannot
finish before the write and the fsync a commit needs; when the kernel holds many dirty pages it
paces writers to the disk, and the write alone takes ten times longer than when it does not.

    python benchmarks/bench_disk.py                     # 287 MB (bench_save's checkpoint), 8 rounds
    python benchmarks/bench_disk.py --folder /content/drive/MyDrive/tmp
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

WRITE = 64 * 2**20


def one_round(folder: str, data: np.ndarray, number: int) -> dict[str, float]:
    view = memoryview(data).cast("B")
    path = os.path.join(folder, f"floor-{number}.bin")
    started = time.perf_counter()
    copy = data.copy()
    copied = time.perf_counter() - started
    del copy
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        started = time.perf_counter()
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:done + WRITE], done)
        written = time.perf_counter() - started
        os.fsync(fd)
        synced = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return {"memory copy": copied, "write into a new file": written, "write, then fsync": synced}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=287, help="bytes per round, in MB (default 287)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds (default 8)")
    parser.add_argument("--folder", default=None, help="where to write (default: the temp folder)")
    args = parser.parse_args(argv)
    data = np.random.default_rng(0).integers(0, 256, int(args.mb * 2**20), dtype=np.uint8)
    with tempfile.TemporaryDirectory(prefix="bench-disk-", dir=args.folder) as folder:
        rounds = [one_round(folder, data, number) for number in range(args.rounds)]
    print(f"{args.mb:g} MB, {args.rounds} rounds, in {args.folder or tempfile.gettempdir()}: "
          "median [min-max] seconds")
    for what in rounds[0]:
        times = sorted(r[what] for r in rounds)
        print(f"{what:<22} {statistics.median(times):.3f} [{times[0]:.3f}-{times[-1]:.3f}]  "
              f"each round: {' '.join(f'{r[what]:.3f}' for r in rounds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
