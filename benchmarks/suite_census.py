"""What the test suite spends: its CPU-minutes and every Python process it starts.

    python3 benchmarks/suite_census.py -- .venv/bin/python -m pytest -n auto --dist loadscope

Runs the command with a ``sitecustomize`` of its own first on ``PYTHONPATH``: every Python process
the command starts (pytest's workers, the fork servers, each job, each CLI run) writes, as it exits,
its CPU time and whether it imported TensorFlow, JAX or torch, and whether it was forked from a
server that had imported them already (a fork skips the import); ``os._exit`` (pytest-xdist's
workers, forked children) included. A process killed by SIGKILL writes nothing: its CPU is in the
total, not in the rows. The total is the command's cgroup's (cpuacct: every process it started,
reaped or not; run as root), else ``RUSAGE_CHILDREN`` (the processes reaped: less). Prints the
total, the process counts, and the modules and commands that spent the most.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SITECUSTOMIZE = '''
import atexit, json, os, resource, sys
_census = {"forked": False}
def _forked():
    _census["forked"] = True
os.register_at_fork(after_in_child=_forked)
def _record():
    if _census.get("done") == os.getpid():
        return
    _census["done"] = os.getpid()
    try:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        heavy = [m for m in ("tensorflow", "jax", "torch", "keras") if m in sys.modules]
        entry = {"pid": os.getpid(), "argv": sys.argv[:4], "forked": _census["forked"],
                 "cpu": usage.ru_utime + usage.ru_stime, "imports": heavy,
                 "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
        with open(os.path.join(os.environ["SUITE_CENSUS_DIR"], f"{os.getpid()}.json"), "w") as f:
            json.dump(entry, f)
    except Exception:
        pass
atexit.register(_record)
_real_exit = os._exit
def _exit(code):
    _record()
    _real_exit(code)
os._exit = _exit
'''


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    with tempfile.TemporaryDirectory() as hooks, tempfile.TemporaryDirectory() as records:
        Path(hooks, "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {**os.environ, "SUITE_CENSUS_DIR": records,
               "PYTHONPATH": os.pathsep.join(filter(None, [hooks, os.environ.get("PYTHONPATH")]))}
        group = cpu_group()
        started = time.monotonic()
        code = subprocess.run(command, env=env, preexec_fn=group.enter if group else None).returncode
        wall = time.monotonic() - started
        if group is not None:
            total, how = group.seconds(), "its cgroup"
            group.remove()
        else:
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            total, how = children.ru_utime + children.ru_stime, "the processes reaped (no cgroup here)"
        rows = []
        for record in Path(records).glob("*.json"):
            with contextlib.suppress(ValueError):  # a process killed while it wrote its row
                rows.append(json.loads(record.read_text()))
    report(rows, wall, total, how)
    return code


class CpuGroup:
    """A cpuacct cgroup (v1) the command runs in: the CPU of every process it starts."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def enter(self) -> None:  # in the child, before exec
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():  # leftovers go to the root group
            (self.path.parent / "cgroup.procs").write_text(pid)
        self.path.rmdir()


def cpu_group() -> CpuGroup | None:
    root = Path("/sys/fs/cgroup/cpuacct")
    try:
        path = root / f"suite-census-{os.getpid()}"
        path.mkdir()
        return CpuGroup(path)
    except OSError:
        return None


def report(rows: list[dict], wall: float, total_cpu: float, how: str) -> None:
    heavy = [r for r in rows if r["imports"]]
    print(f"\ncensus: {wall / 60:.1f} min of wall, {total_cpu / 60:.1f} CPU-minutes in all, by {how} "
          f"({total_cpu / wall:.2f} CPUs busy on average)")
    print(f"census: {len(rows)} Python processes recorded ({len(heavy)} with Keras or a backend imported: "
          f"{sum(not r['forked'] for r in heavy)} imported it themselves, {sum(r['forked'] for r in heavy)} "
          f"forked from a server that had), {sum(r['cpu'] for r in rows) / 60:.1f} CPU-minutes between them")
    by_module: collections.Counter[str] = collections.Counter()
    fresh: collections.Counter[str] = collections.Counter()
    for r in rows:
        module = r["test"].split("::")[0] or " ".join(Path(a).name for a in r["argv"][:2])
        by_module[module] += r["cpu"]
        if r["imports"] and not r["forked"]:
            fresh[module] += 1
    print("census: the processes' CPU by test module (or command), the top 20; fresh: processes that "
          "imported Keras or a backend themselves")
    for module, cpu in by_module.most_common(20):
        print(f"  {cpu:7.0f} s  fresh {fresh[module]:3d}  {module}")


if __name__ == "__main__":
    sys.exit(main())
