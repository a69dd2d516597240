"""How long training waits for checkpoints, and how long a resume takes, on fake-gcs-server.

One process, one model shape (an MLP of about ``--params`` parameters with Adam, trained on
synthetic data), four configurations trained in turn, each from the same initial weights:

1. no checkpointing
2. ``keras.callbacks.ModelCheckpoint`` saving ``.keras`` to a local folder every epoch
3. ``resumable.CheckpointCallback`` to ``gs://`` on fake-gcs-server, background uploads
4. the same with ``async_upload=False``

Per configuration: the median epoch time (epoch start to next epoch start, first epoch
excluded: it traces the graph), the median time training was blocked per save (the
checkpoint callback's ``on_epoch_end``), the wait at the end of training, the peak RSS
above the pre-save baseline during a save, and the CPU time per epoch of this process and of
the emulator (which, on one machine, competes with training as a remote server would not).
Then ``resume()`` from call to model ready (a cold local cache) against a bare gcsfs
``get_file`` + ``keras.models.load_model`` of the same file.

Usage::

    python benchmarks/bench_save.py --write-docs     # 25M parameters; table into docs/benchmarks.md
    python benchmarks/bench_save.py --tiny           # a small model, seconds: what CI runs
    python benchmarks/bench_save.py --configs 2,3 --emulator-nice 19   # the emulator yields the CPU
    python benchmarks/bench_save.py --configs 2,3 --emulator-cpu 1     # the emulator on a CPU of its own

Uses the emulator at ``STORAGE_EMULATOR_HOST`` when set, else starts its own fake-gcs-server.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).parent))

from bench_list import emulator  # noqa: E402

from resumable.core.display import format_table, human_size  # noqa: E402

DOCS = Path(__file__).parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench_save: begin -->", "<!-- bench_save: end -->"
BLOCKED_TARGET = 1.1  # issue #5: blocked per save <= 1.1x the local .keras save
EPOCH_TARGET = 1.10  # epoch time with background uploads within 10 % of ModelCheckpoint's
RESUME_TARGET = 1.2  # resume() within 1.2x of gcsfs get + load_model


class RSS:
    """Samples this process' resident set size every few milliseconds in a thread."""

    def __init__(self) -> None:
        self.peak = self.now()
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.now())

    def window(self) -> int:
        """Start a window: the peak restarts from now; returns the baseline."""
        self.peak = base = self.now()
        return base

    def stop(self) -> None:
        self._stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=25e6, help="model parameters (default 25e6)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per configuration (default 6)")
    parser.add_argument("--steps", type=int, default=8, help="batches per epoch (default 8)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3, help="resume timings, median kept (default 3)")
    parser.add_argument("--tiny", action="store_true", help="200k parameters, 3 epochs: proves it works")
    parser.add_argument("--configs", default="1,2,3,4",
                        help="configurations to run, in this order (default 1,2,3,4)")
    parser.add_argument("--emulator-nice", type=int, default=0, metavar="N",
                        help="run the emulator at nice N: on one machine, its CPU competes with training, "
                             "which a remote server's does not (default 0)")
    parser.add_argument("--emulator-cpu", type=int, default=None, metavar="N",
                        help="pin the emulator to CPU N and this process (training, uploads) to the "
                             "others, as if the server were elsewhere (default: not pinned)")
    parser.add_argument("--write-docs", action="store_true", help=f"put the tables into {DOCS.name}")
    args = parser.parse_args(argv)
    if args.tiny:
        args.params, args.epochs, args.steps, args.repeat = 2e5, 3, 4, 1
    if args.epochs < 3 or args.steps < 1 or args.repeat < 1:
        parser.error("--epochs must be >= 3, --steps and --repeat >= 1")
    server_cpus = None
    if args.emulator_cpu is not None:
        cpus = os.sched_getaffinity(0)
        if args.emulator_cpu not in cpus or len(cpus) < 2:
            parser.error(f"--emulator-cpu: CPU {args.emulator_cpu} is not one of this process' "
                         f"{sorted(cpus)}, or it is the only one")
        server_cpus = {args.emulator_cpu}
        os.sched_setaffinity(0, cpus - server_cpus)  # before TensorFlow sizes its thread pools
    order = [c.strip() for c in args.configs.split(",")]
    wanted = set(order)
    if "2" not in wanted or not wanted <= {"1", "2", "3", "4"} or len(order) != len(wanted):
        parser.error("--configs: some of 1,2,3,4, each once, including 2 (the baseline of every ratio)")

    import keras
    import numpy as np

    import resumable

    width = int(math.sqrt(args.params / 1.25))  # features = width / 4: params ~ 1.25 width^2
    features = max(width // 4, 8)

    def build() -> Any:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    samples = args.steps * args.batch_size
    x = rng.normal(size=(samples, features)).astype("float32")
    y = rng.integers(0, 10, size=(samples,))
    rss = RSS()
    results: dict[str, dict[str, float]] = {}
    server = emulator(args.emulator_nice, server_cpus)
    with server as endpoint, tempfile.TemporaryDirectory(prefix="bench-save-") as tmp:
        import gcsfs

        fs = gcsfs.GCSFileSystem(token="anon")
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        fs.mkdir(bucket)
        model = build()
        params = model.count_params()
        print(f"fake-gcs-server at {endpoint}; model: {params / 1e6:.1f}M parameters, Adam; "
              f"{args.epochs} epochs of {args.steps} batches of {args.batch_size}", flush=True)
        del model
        emulator_process = _emulator_process(endpoint)
        configs: dict[str, Callable[[], Any]] = {
            "1. no checkpointing": lambda: None,
            "2. ModelCheckpoint .keras, local": lambda: keras.callbacks.ModelCheckpoint(
                f"{tmp}/modelcheckpoint/last.keras", save_freq="epoch"),
            "3. CheckpointCallback gs://, background": lambda: resumable.CheckpointCallback(
                f"gs://{bucket}/async", staging_dir=f"{tmp}/stage-async"),
            "4. CheckpointCallback gs://, async_upload=False": lambda: resumable.CheckpointCallback(
                f"gs://{bucket}/sync", staging_dir=f"{tmp}/stage-sync", async_upload=False),
        }
        by_number = {label.split(".")[0]: label for label in configs}
        for label in [by_number[n] for n in order]:  # in the order asked: shows effects of running later
            results[label] = train(build, configs[label](), x, y, args, rss, emulator_process)
            print(f"{label}: " + ", ".join(f"{k} {v:.2f}" for k, v in results[label].items()), flush=True)
        checkpoint_size = Path(f"{tmp}/modelcheckpoint/last.keras").stat().st_size
        source = "async" if "3" in wanted else "sync" if "4" in wanted else None
        resume_times = time_resume(fs, f"gs://{bucket}/{source}", tmp, args.repeat) if source else {}
    rss.stop()

    report = render(results, resume_times, params, checkpoint_size, args)
    print()
    print(report)
    if args.write_docs:
        write_docs(report)
        print(f"\nwritten to {DOCS}")
    return 0


def train(build: Callable[[], Any], checkpoint: Any, x: Any, y: Any, args: argparse.Namespace,
          rss: RSS, emulator_process: int | None) -> dict[str, float]:
    import keras

    model = build()
    begins: list[float] = []
    cpu_here: list[float] = []
    cpu_emulator: list[float] = []

    def mark() -> None:
        begins.append(time.perf_counter())
        cpu_here.append(_cpu_seconds(None))
        cpu_emulator.append(_cpu_seconds(emulator_process))
    blocked: list[float] = []
    peaks: list[int] = []
    final_wait = [0.0]

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            mark()

        def on_train_end(self, logs: Any = None) -> None:
            mark()

    callbacks: list[Any] = [EpochTimer()]
    if checkpoint is not None:
        epoch_end, train_end = checkpoint.on_epoch_end, checkpoint.on_train_end

        def timed_epoch_end(epoch: int, logs: Any = None) -> None:
            base = rss.window()
            started = time.perf_counter()
            epoch_end(epoch, logs)
            blocked.append(time.perf_counter() - started)
            peaks.append(rss.peak - base)

        def timed_train_end(logs: Any = None) -> None:
            started = time.perf_counter()
            train_end(logs)
            final_wait[0] = time.perf_counter() - started

        checkpoint.on_epoch_end, checkpoint.on_train_end = timed_epoch_end, timed_train_end
        callbacks.append(checkpoint)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=False, verbose=0,
              callbacks=callbacks)
    # the first epoch traces the graph: left out
    def per_epoch(marks: list[float]) -> float:
        return statistics.median([b - a for a, b in zip(marks[:-1], marks[1:], strict=True)][1:])

    result = {"epoch_s": per_epoch(begins), "cpu_here_s": per_epoch(cpu_here),
              "cpu_emulator_s": per_epoch(cpu_emulator) if emulator_process else math.nan}
    if checkpoint is not None:
        result["blocked_s"] = statistics.median(blocked[1:])
        result["final_wait_s"] = final_wait[0]
        result["peak_rss_mb"] = max(peaks[1:]) / 2**20
    return result


def _emulator_process(endpoint: str) -> int | None:
    """The pid of the fake-gcs-server child serving ``endpoint``, if this process started it."""
    port = endpoint.rsplit(":", 1)[-1]
    for child in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (child / "cmdline").read_bytes().split(b"\0")
            parent = int((child / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"fake-gcs-server" in cmdline[0] and port.encode() in cmdline:
            return int(child.name)
    return None


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of this process (pid None) or of process ``pid`` (0.0 if unknown)."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def time_resume(fs: Any, url: str, tmp: str, repeat: int) -> dict[str, float]:
    """Interleaved: resume() with a cold cache, and gcsfs get_file + load_model of the same file."""
    import keras

    import resumable

    latest = resumable.RunStorage(url).latest()
    assert latest is not None
    remote = f"{url}/{latest.name}/model.keras"
    times: dict[str, list[float]] = {"resume": [], "bare": []}
    for i in range(repeat):
        started = time.perf_counter()
        run = resumable.resume(url, staging_dir=f"{tmp}/resume-{i}")
        times["resume"].append(time.perf_counter() - started)
        assert run.initial_epoch == latest.epoch
        del run
        local = f"{tmp}/bare-{i}.keras"
        started = time.perf_counter()
        fs.get_file(remote, local)
        keras.models.load_model(local)
        times["bare"].append(time.perf_counter() - started)
        os.unlink(local)
    return {k: statistics.median(v) for k, v in times.items()}


def render(results: dict[str, dict[str, float]], resume: dict[str, float], params: int,
           checkpoint_size: int, args: argparse.Namespace) -> str:
    by_number = {label.split(".")[0]: r for label, r in results.items()}
    base = by_number["2"]  # ModelCheckpoint
    rows = []
    for label, r in sorted(results.items()):
        saved = "blocked_s" in r
        rows.append([
            label, f"{r['epoch_s']:.2f} s", f"{r['epoch_s'] / base['epoch_s']:.2f}x",
            f"{r['blocked_s']:.2f} s" if saved else "-",
            f"{r['blocked_s'] / base['blocked_s']:.2f}x" if saved else "-",
            f"{r['final_wait_s']:.2f} s" if saved else "-",
            f"{r['peak_rss_mb']:.0f} MB" if saved else "-",
            f"{r['cpu_here_s']:.2f} s",
            "-" if math.isnan(r["cpu_emulator_s"]) else f"{r['cpu_emulator_s']:.2f} s",  # not ours to see
        ])
    table = format_table(
        ["configuration", "epoch (median)", "vs 2", "blocked per save", "vs 2", "wait at end",
         "peak RSS over baseline", "CPU/epoch, this process", "CPU/epoch, emulator"],
        rows, right={1, 2, 3, 4, 5, 6, 7, 8})

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    emulator = "fake-gcs-server (memory backend) on loopback" + (
        f", run at nice {args.emulator_nice}" if args.emulator_nice else "") + (
        f", pinned to CPU {args.emulator_cpu} (training and uploads on the others)"
        if args.emulator_cpu is not None else "")
    lines = [
        f"Run {date.today().isoformat()} on {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {emulator}; "
        f"{params / 1e6:.1f}M parameters with Adam, checkpoint {human_size(checkpoint_size)}; "
        f"{args.epochs} epochs of {args.steps} batches of {args.batch_size}; medians over epochs 2 to "
        f"{args.epochs}.",
        "",
        "```",
        *table,
        "```",
        "",
    ]
    for number, kind in (("3", "background uploads"), ("4", "async_upload=False")):
        if number in by_number:
            r = by_number[number]
            blocked, epoch = r["blocked_s"] / base["blocked_s"], r["epoch_s"] / base["epoch_s"]
            goals = (f" (targets <= {BLOCKED_TARGET}x: {verdict(blocked <= BLOCKED_TARGET)}, "
                     f"<= {EPOCH_TARGET:.2f}x: {verdict(epoch <= EPOCH_TARGET)})") if number == "3" else ""
            lines.append(f"- {kind}, {number}/2: blocked per save {blocked:.2f}x, "
                         f"epoch time {epoch:.2f}x{goals}")
    if resume:
        ratio = resume["resume"] / resume["bare"]
        lines.append(
            f"- resume: `resume()` {resume['resume']:.2f} s, gcsfs `get_file` + `load_model` "
            f"{resume['bare']:.2f} s: {ratio:.2f}x (target <= {RESUME_TARGET}x: "
            f"{verdict(ratio <= RESUME_TARGET)}); median of {args.repeat}")
    return "\n".join(lines)


def write_docs(report: str) -> None:
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOCS}: markers {BEGIN} ... {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOCS.write_text(f"{head}{BEGIN}\n{report}\n{END}{tail}")


if __name__ == "__main__":
    sys.exit(main())
