"""How `resume()`'s choice, `resumable list` and `resumable prune` grow with a run's length.

A run folder of N committed checkpoints whose run index knows only the first 3: the index
lags after a crash between a manifest and the index, or after the folder was copied by hand.
The first 3 are committed through `RunStorage.commit` (the writer's own path, which writes
the index); the others are written as a crash or a copy leaves them: a tiny payload file and
a valid manifest, no index row. Then, in rounds that run every measure once (a fresh copy of
the run before each destructive one):

- ``resume: newest good``:  `RunManager.arriving_newest`, the manager's part of `resume()`
  (which checkpoint to load, its files checked); no Keras
- ``list``:                 ``resumable list URL`` (table to a string)
- ``prune --dry-run``:      ``resumable prune URL --keep-last 3 --dry-run``
- ``prune``:                ``resumable prune URL --keep-last 3 --yes``: deletes N - 3

Usage::

    python benchmarks/bench_run_length.py                                  # 1k and 10k, local and gs://
    python benchmarks/bench_run_length.py --checkpoints 1000 10000 100000 --where local
    python benchmarks/bench_run_length.py --checkpoints 30 --rounds 1      # a quick run for CI

``--before DIR`` also times another version of the package (a folder holding its
``resumable/``, e.g. ``git archive main resumable | tar -x -C DIR``) on the same runs, the
two interleaved in each round. Each measure runs in a child process that imports the
package first and times only the call.

Prints the median and range (min-max) of each measure over ``--rounds``. A measure slower
than ``--cap`` seconds in its first round is not repeated (its one time is shown). gs:// uses
the emulator at ``STORAGE_EMULATOR_HOST`` when set, else a fresh fake-gcs-server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

# gcsfs' gRPC bucket probe stalls about a minute against an emulator; set before importing it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_list import emulator  # noqa: E402

from resumable.cli.app import main as cli_main  # noqa: E402
from resumable.core.checksum import crc32c_of_bytes  # noqa: E402
from resumable.core.display import format_table  # noqa: E402
from resumable.core.manifest import MANIFEST_NAME, FileEntry, Manifest, now_iso  # noqa: E402
from resumable.manager.run_manager import RunManager  # noqa: E402
from resumable.storage import RunStorage, run_index  # noqa: E402

INDEXED = 3  # checkpoints the run index knows
WHOLE_INDEX = False  # --whole-index: it knows them all
PAYLOAD = "model.weights.h5"
MEASURES = ("resume: newest good", "list", "prune --dry-run", "prune")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[1000, 10000],
                        help="run lengths (default 1000 10000)")
    parser.add_argument("--where", nargs="+", choices=("local", "gs"), default=["local", "gs"])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every measure (default 3)")
    parser.add_argument("--cap", type=float, default=120.0,
                        help="a measure slower than this in round 1 is not repeated (default 120 s)")
    parser.add_argument("--only", choices=MEASURES, nargs="+", default=list(MEASURES))
    parser.add_argument("--before", metavar="DIR", help="also time the package found in DIR")
    parser.add_argument("--whole-index", action="store_true",
                        help="the run index knows every checkpoint (a run that never crashed)")
    parser.add_argument("--child", nargs=3, metavar=("MEASURE", "URL", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        what, url, count = args.child
        fn = measure(what, url, int(count))
        began = time.perf_counter()
        fn()
        print(f"{time.perf_counter() - began:.6f}")
        return 0
    global WHOLE_INDEX
    WHOLE_INDEX = args.whole_index
    versions = {"now": None, **({"before": str(Path(args.before).resolve())} if args.before else {})}
    if min(args.checkpoints) <= INDEXED or args.rounds < 1:
        parser.error(f"--checkpoints must be > {INDEXED}, --rounds >= 1")
    logging.getLogger("resumable").setLevel(logging.ERROR)  # the skipped-folder lines of a big run
    rows = []
    with contextlib.ExitStack() as stack:
        for where in args.where:
            if where == "gs":
                stack.enter_context(emulator())
            for count in args.checkpoints:
                timings = run_one(where, count, args.rounds, args.cap, args.only, versions)
                for what in args.only:
                    for version in versions:
                        rows.append([where, f"{count:,}", what, version, *summary(timings[what, version])])
    print()
    print("\n".join(format_table(["WHERE", "CHECKPOINTS", "MEASURE", "CODE", "MEDIAN", "RANGE", "ROUNDS"],
                                 rows, right={1, 4, 5, 6})))
    return 0


def run_one(where: str, count: int, rounds: int, cap: float, only: list[str],
            versions: dict[str, str | None]) -> dict[tuple[str, str], list[float]]:
    """Every measure's times on a run of ``count`` checkpoints, in interleaved rounds, per version."""
    started = time.perf_counter()
    template, cleanup = build(where, count)
    print(f"{where}: built {count:,} checkpoints ({count if WHOLE_INDEX else INDEXED} in the index) in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    timings: dict[tuple[str, str], list[float]] = {(what, v): [] for what in only for v in versions}
    try:
        for round_ in range(rounds):
            for what in only:
                for version, code in versions.items():
                    times = timings[what, version]
                    if round_ and times and times[0] > cap:
                        continue
                    url = template if what != "prune" else copy_run(where, template)
                    times.append(child(what, url, count, code))
                    print(f"  round {round_ + 1} {what} ({version}): {times[-1]:.3f} s", flush=True)
                    if url != template:
                        remove(where, url)
    finally:
        cleanup()
    return timings


def child(what: str, url: str, count: int, code: str | None) -> float:
    """Seconds of one measure, timed in a fresh process importing the package from ``code``."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([code, *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, __file__, "--child", what, url, str(count)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{what} on {url} failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def measure(what: str, url: str, count: int) -> Callable[[], None]:
    def newest() -> None:
        manager = RunManager(url, staging_dir=tempfile.mkdtemp(prefix="bench-cache-"))
        try:
            found = manager.arriving_newest(warn=lambda line: None)
            assert found is not None and found[0].name == name_of(count), found
            with found[1] as arrival:
                arrival.result()
        finally:
            shutil.rmtree(manager.staging_dir, ignore_errors=True)

    def command(*args: str, lines: int) -> Callable[[], None]:
        def run() -> None:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                assert cli_main([*args]) == 0
            assert out.getvalue().count("\n") > lines, out.getvalue()[-2000:]
        return run

    return {
        "resume: newest good": newest,
        "list": command("list", url, lines=count),
        "prune --dry-run": command("prune", url, "--keep-last", "3", "--dry-run", lines=count),
        "prune": command("prune", url, "--keep-last", "3", "--yes", lines=count),
    }[what]


def name_of(epoch: int) -> str:
    return f"ckpt-{epoch:06d}"


def checkpoint_objects(epoch: int) -> tuple[bytes, bytes]:
    """A checkpoint's payload and its manifest, as `RunStorage.commit` would have written them."""
    payload = epoch.to_bytes(4, "big") * 64
    manifest = Manifest(
        epoch=epoch, step=epoch * 100, created=now_iso(),
        files={PAYLOAD: FileEntry(len(payload), crc32c_of_bytes(payload))},
        metrics={"loss": 1 / epoch, "val_loss": 1.5 / epoch},
        versions={"keras": "3.15.1"}, state={"monitor": "val_loss", "mode": "min"},
    )
    return payload, manifest.to_json()


def build(where: str, count: int) -> tuple[str, Callable[[], None]]:
    """A run folder of ``count`` checkpoints, the index knowing the first 3; its URL and its cleanup."""
    if where == "local":
        root = Path(tempfile.mkdtemp(prefix="bench-run-length-"))
        url = str(root / "run")
        cleanup: Callable[[], None] = lambda: shutil.rmtree(root, ignore_errors=True)  # noqa: E731
    else:
        import gcsfs

        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        gcsfs.GCSFileSystem(token="anon").mkdir(bucket)
        url = f"gs://{bucket}/run"
        cleanup = lambda: None  # noqa: E731 - the emulator's memory goes with it
    storage = RunStorage(url)
    with tempfile.TemporaryDirectory() as stage:
        for epoch in range(1, INDEXED + 1):  # the writer's own path: files, manifest, index
            payload, _ = checkpoint_objects(epoch)
            (Path(stage) / PAYLOAD).write_bytes(payload)
            storage.commit(stage, name_of(epoch), Manifest(
                epoch=epoch, step=epoch * 100, metrics={"loss": 1 / epoch, "val_loss": 1.5 / epoch},
                versions={"keras": "3.15.1"}, state={"monitor": "val_loss", "mode": "min"}))
    objects = {}
    for epoch in range(INDEXED + 1, count + 1):  # as a crash or a copy leaves them: no index row
        payload, manifest = checkpoint_objects(epoch)
        objects[f"{name_of(epoch)}/{PAYLOAD}"] = payload
        objects[f"{name_of(epoch)}/{MANIFEST_NAME}"] = manifest
    if WHOLE_INDEX:  # as the writer's own commits would have left it
        manifests = {rel.split("/")[0]: blob for rel, blob in objects.items() if rel.endswith(MANIFEST_NAME)}
        rows = {name: run_index.entry(Manifest.from_json(blob, name), len(blob))
                for name, blob in manifests.items()}
        rows.update(run_index.decode(storage.fs.cat_file(f"{storage.root}/{run_index.INDEX_NAME}")))
        objects[run_index.INDEX_NAME] = run_index.encode(rows)
    write_objects(storage, objects)
    return url, cleanup


def write_objects(storage: RunStorage, objects: dict[str, bytes]) -> None:
    if storage.is_local:
        for rel, data in objects.items():
            path = Path(storage.root) / rel
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
        return
    items = list(objects.items())
    for at in range(0, len(items), 20000):  # one concurrent pipe per slice: bounded memory in flight
        storage.fs.pipe({f"{storage.root}/{rel}": data for rel, data in items[at:at + 20000]})


def copy_run(where: str, url: str) -> str:
    """A fresh copy of the run (a real prune deletes most of it), index and all."""
    if where == "local":
        copy = f"{url}-{uuid.uuid4().hex[:6]}"
        shutil.copytree(url, copy)
        return copy
    storage = RunStorage(url)
    copy = f"{url}-{uuid.uuid4().hex[:6]}"
    found = storage.fs.find(storage.root)
    prefix = storage.root + "/"
    blobs = storage.fs.cat(found)
    target = RunStorage(copy)
    write_objects(target, {path[len(prefix):]: data for path, data in blobs.items()})
    return copy


def remove(where: str, url: str) -> None:
    if where == "local":
        shutil.rmtree(url, ignore_errors=True)
    else:
        storage = RunStorage(url)
        left = storage.fs.find(storage.root)
        if left:
            storage.fs.rm(left)


def summary(times: list[float]) -> list[str]:
    if not times:
        return ["-", "-", "0"]
    return [f"{statistics.median(times):.3f} s", f"{min(times):.3f}-{max(times):.3f} s", str(len(times))]


if __name__ == "__main__":
    sys.exit(main())
