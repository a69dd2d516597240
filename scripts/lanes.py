"""Build and test the lanes of requirements/lanes.toml: Colab's runtimes as venvs under .lanes/.

    python3 scripts/lanes.py list                    # lanes, their Python, whether it is here
    python3 scripts/lanes.py build colab-tpu         # build (or reuse) one lane's venv
    python3 scripts/lanes.py run colab-tpu [-- PYTEST ARGS]   # build it, then run its tests
    python3 scripts/lanes.py run --all               # every lane but those the README's command runs
    python3 scripts/lanes.py run --all --jobs 1      # one lane at a time (default: two at once)
    python3 scripts/lanes.py refresh colab FREEZE    # the lane's pins at a pip-freeze file's versions

A lane is built as a user's Colab is: its pins first (the runtime), then resumable as
``pip install keras-resumable`` installs it (a wheel of this checkout, with its dependencies:
what that adds or changes is printed and kept in the venv's ``install-changes.txt``), then the
test tools, constrained to change nothing installed. The tests run on the installed package,
never on the checkout's sources.

The venvs live outside the checkout, as pip's wheel cache does (``$RESUMABLE_LANES_CACHE``, else
``~/.cache/resumable-lanes``), one folder per lane and key: the key is a hash of the lane's pins
(an unpinned one at the version PyPI gives it today), its Python, resumable's requirements and the
test tools. A fresh clone reuses the venv a previous run on this machine built; a changed key
builds a new one. resumable itself is always reinstalled from a wheel of the checkout under test.
A venv is trusted only if its build finished (the stamp is written last) and its files are those
the build left (names and sizes of every installed file, less bytecode caches); anything else is
removed and built again.

Several lanes run at once (``--jobs``, default 2), each in a process of its own with its output
in ``.lanes/logs/<lane>.log``, printed whole when the lane ends: a lane's tests run in one pytest
process that keeps about one CPU busy, so two lanes fill a 2-CPU machine. The longest lanes (by
their last run's minutes, kept beside the venvs) start first.

A lane whose Python is not on this machine is skipped with one line. Exit status: 0 when every
lane run passed (skipped ones included), 1 when any failed, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "requirements" / "lanes.toml"
LANES_DIR = ROOT / ".lanes"  # the checkout's own: the wheel of this run
CACHE = Path(os.environ.get("RESUMABLE_LANES_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resumable-lanes")
KEEP_PER_LANE = 2  # venvs of one lane kept with other keys (two branches of other pins)
MARKER = "lanes"  # pytest marker of the tests every lane runs (pyproject.toml)
SHOW_VERSIONS = """import importlib.metadata as m
for name in ('keras', 'tensorflow', 'tensorflow-cpu', 'jax', 'torch', 'numpy', 'h5py'):
    try:
        print(f'{name} {m.version(name)}', end='; ')
    except m.PackageNotFoundError:
        pass"""


@dataclass(frozen=True)
class Lane:
    name: str
    title: str
    python: str  # major.minor
    source: str
    backend: str
    tests: str  # "readme" or "lanes"
    pins: tuple[str, ...]
    may_change: tuple[str, ...] = ()  # pinned packages resumable's install is known to upgrade


@dataclass(frozen=True)
class Venv:
    """A lane's venv in the cache, for one key."""

    lane: Lane
    path: Path
    reused: bool = False

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def stamp_file(self) -> Path:
        return self.path / "lane-stamp.json"


def read_lanes(path: Path = PINS) -> tuple[dict[str, Lane], list[str]]:
    """The lanes of the pins file, in its order, and the test tools every lane adds."""
    data = tomllib.loads(path.read_text())
    lanes = {name: Lane(name, table["title"], str(table["python"]), table["source"], table["backend"],
                        table["tests"], tuple(table["pins"]), tuple(table.get("may_change", ())))
             for name, table in data["lanes"].items()}
    return lanes, list(data["test_tools"])


def find_python(version: str) -> Path | None:
    """A Python ``version`` (major.minor) on this machine: pyenv's newest patch, else pythonX.Y on PATH."""
    roots = [os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")]
    if shutil.which("pyenv"):
        found = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip():
            roots.insert(0, found.stdout.strip())
    for root in roots:
        candidates = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"), key=_patch_level)
        if candidates:
            return Path(candidates[-1])
    on_path = shutil.which(f"python{version}")
    if on_path and "shims" not in on_path:  # a pyenv shim of a version pyenv lacks only fails later
        return Path(on_path)
    return None


def _patch_level(python: str) -> list[int]:
    """3.13.10 after 3.13.9: the version folder's numbers after major.minor."""
    return [int(x) for x in Path(python).parent.parent.name.split(".")[2:] if x.isdigit()]


def install_requires() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return [line.strip() for line in parser["options"]["install_requires"].splitlines() if line.strip()]


def resolved_pins(lane: Lane, python: Path) -> tuple[str, ...]:
    """The lane's pins with each unpinned one at the version pip would install today, so that
    a new release changes the key and the lane tests the newest (``keras`` -> ``keras==3.15.1``)."""
    if all("==" in pin for pin in lane.pins):
        return lane.pins
    report = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                             "--disable-pip-version-check", "--report", "-", *lane.pins],
                            capture_output=True, text=True, check=True).stdout
    chosen = {_normalized(item["metadata"]["name"]): item["metadata"]["version"]
              for item in json.loads(report)["install"]}
    pinned = []
    for pin in lane.pins:
        if "==" in pin:
            pinned.append(pin)
        else:
            name = pin.split("[")[0].strip()
            pinned.append(f"{pin}=={chosen[_normalized(name)]}")
    return tuple(pinned)


def lane_key(lane: Lane, pins: tuple[str, ...], python: Path, tools: list[str]) -> str:
    """What a lane's venv is built from: when it changes, another venv is built from nothing."""
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    text = json.dumps([pins, lane.backend, version, str(python), install_requires(), tools])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def installed_files(venv: Venv) -> str:
    """A digest of the name and size of every file the venv's packages installed, less bytecode
    caches and resumable's own (reinstalled at every run): a file lost, added or cut short
    since the build changes it."""
    lib = venv.path / "lib"
    entries = []
    for folder, dirs, files in os.walk(lib):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not _is_resumable(d))
        for name in sorted(files):
            if _is_resumable(name):
                continue
            path = Path(folder) / name
            entries.append(f"{path.relative_to(lib)}\t{path.lstat().st_size}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def _is_resumable(name: str) -> bool:
    return name == "resumable" or name.startswith("keras_resumable")


def say(message: str) -> None:
    print(f"lanes: {message}", flush=True)


def pip(venv: Venv, *args: str, quiet: bool = True) -> None:
    command = [str(venv.bin / "python"), "-m", "pip", *(("-q",) if quiet else ()),
               "--disable-pip-version-check", *args]
    subprocess.run(command, check=True)


def freeze(venv: Venv) -> dict[str, str]:
    """``pip freeze`` of the venv as {normalized name: version}."""
    out = subprocess.run([str(venv.bin / "python"), "-m", "pip", "list", "--format=json",
                          "--disable-pip-version-check"], capture_output=True, text=True, check=True).stdout
    return {_normalized(p["name"]): p["version"] for p in json.loads(out)}


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What an install added, upgraded, downgraded or removed, a line each, sorted by name."""
    lines = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None:
            lines.append(f"added {name} {new}")
        elif new is None:
            lines.append(f"removed {name} {old}")
        else:
            lines.append(f"changed {name} {old} -> {new}")
    return lines


def build_wheel() -> Path:
    """A wheel of this checkout, as PyPI would serve keras-resumable (built once per invocation)."""
    dist = LANES_DIR / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "wheel", "--no-deps",
                    "-w", str(dist), str(ROOT)], check=True)
    (wheel,) = dist.glob("keras_resumable-*.whl")
    return wheel


@contextlib.contextmanager
def locked(lane: Lane) -> Iterator[None]:
    """One run at a time builds or tests a lane's venvs on this machine (two CI runs at once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{lane.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def trusted(venv: Venv, key: str) -> str | None:
    """None when the cached venv is whole and built for ``key``, else why it is not."""
    if not venv.path.exists():
        return "none built yet"
    if not venv.stamp_file.is_file():
        return "its build never finished"
    try:
        recorded = json.loads(venv.stamp_file.read_text())
    except (OSError, ValueError):
        return "its stamp is unreadable"
    if recorded.get("key") != key:
        return "it was built for another key"
    if not (venv.bin / "python").exists():
        return "its Python is gone"
    if recorded.get("files") != installed_files(venv):
        return "its installed files changed since it was built"
    return None


def build(lane: Lane, wheel: Path, tools: list[str]) -> Venv | None:
    """The lane's venv with resumable installed from ``wheel``: reused from the cache when it is
    whole and built for the same key, else built anew; None when its Python is missing (said in
    one line)."""
    python = find_python(lane.python)
    if python is None:
        say(f"{lane.name}: skipped: Python {lane.python} is not on this machine "
            f"(`pyenv install {lane.python}` or python{lane.python} on PATH)")
        return None
    pins = resolved_pins(lane, python)
    key = lane_key(lane, pins, python, tools)
    venv = Venv(lane, CACHE / f"{lane.name}-{key}")
    why = trusted(venv, key)
    if why is None:
        say(f"{lane.name}: reusing {venv.path}; reinstalling resumable from {wheel.name}")
        pip(venv, "install", "--no-deps", "--force-reinstall", str(wheel))
        return Venv(lane, venv.path, reused=True)
    say(f"{lane.name}: building {venv.path} ({why}) with {python} ({lane.title})")
    shutil.rmtree(venv.path, ignore_errors=True)
    subprocess.run([str(python), "-m", "venv", str(venv.path)], check=True)
    if pins:
        pip(venv, "install", *pins)
    runtime = freeze(venv)
    (venv.path / "runtime.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(runtime.items())))
    pip(venv, "install", str(wheel))  # as `pip install keras-resumable`: no upgrade of what satisfies
    installed = freeze(venv)
    changed = [line for line in changes(runtime, installed) if not line.startswith("added keras-resumable ")]
    (venv.path / "install-changes.txt").write_text("".join(f"{line}\n" for line in changed))
    shown = "; ".join(changed) if len(changed) <= 8 else (
        f"{'; '.join(changed[:8])}; ... ({len(changed)} in all: {venv.path}/install-changes.txt)")
    say(f"{lane.name}: `pip install keras-resumable` " + (f"also: {shown}" if changed else "changed nothing"))
    pinned = {_normalized(pin.split("==")[0].split("[")[0]) for pin in pins if "==" in pin}
    moved = [line for line in changed if not line.startswith("added ") and line.split()[1] in pinned
             and line.split()[1] not in {_normalized(n) for n in lane.may_change}]
    if moved:
        raise SystemExit(f"lanes: {lane.name}: `pip install keras-resumable` changed the runtime's "
                         f"{'; '.join(moved)} (not in the lane's may_change)")
    constraints = venv.path / "installed.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(installed.items())
                                   if n != "keras-resumable"))
    pip(venv, "install", "-c", str(constraints), *tools)
    moved = changes(installed, {n: v for n, v in freeze(venv).items() if n in installed})
    if moved:
        raise SystemExit(f"lanes: {lane.name}: the test tools changed {'; '.join(moved)}")
    # Written last: a venv without it is a build that never finished.
    venv.stamp_file.write_text(json.dumps({"key": key, "pins": pins, "files": installed_files(venv)}))
    prune(lane, keep=venv.path)
    return venv


def prune(lane: Lane, keep: Path) -> None:
    """Remove the lane's older venvs, all but the newest KEEP_PER_LANE (``keep`` among them)."""
    pattern = re.compile(re.escape(lane.name) + r"-[0-9a-f]{16}")
    others = sorted((p for p in CACHE.iterdir() if pattern.fullmatch(p.name) and p != keep),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[KEEP_PER_LANE - 1:]:
        say(f"{lane.name}: removing the older venv {old}")
        shutil.rmtree(old, ignore_errors=True)


def run_tests(venv: Venv, pytest_args: list[str]) -> int:
    """The lane's tests on the installed resumable; pytest's exit status."""
    lane = venv.lane
    env = {**os.environ, "KERAS_BACKEND": lane.backend, "RESUMABLE_LANE": lane.name}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    python = str(venv.bin / "python")
    where = subprocess.run([python, "-P", "-c", "import resumable; print(resumable.__file__)"], cwd=ROOT,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not where.startswith(str(venv.path)):
        raise SystemExit(f"lanes: {lane.name}: resumable imports from {where}, not the lane's install")
    versions = subprocess.run([python, "-P", "-c", SHOW_VERSIONS], env=env, capture_output=True,
                              text=True).stdout
    say(f"{lane.name}: Python {lane.python}, KERAS_BACKEND={lane.backend}; {versions.strip(' ;')}")
    # -P: the checkout's folder is not on sys.path, so `import resumable` finds the lane's install.
    command = [python, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-m", MARKER, *pytest_args]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def run_readme(pytest_args: list[str]) -> int:
    """The README's test command, as .ci/run runs it (the `newest` lane)."""
    command = ('python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" && .venv/bin/pip install -q '
               '--no-deps -r requirements/keras-hub.txt && .venv/bin/python -m pytest -n auto '
               '--dist loadscope')
    return subprocess.run(f"{command} {' '.join(pytest_args)}", shell=True, cwd=ROOT).returncode


def refreshed(lane: Lane, freeze_file: Path) -> str:
    """The lane's ``pins`` at the versions of a pip-freeze file, as lanes.toml writes them; a pin
    the freeze lacks is kept and named in a comment."""
    found = {}
    for line in freeze_file.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            found[_normalized(name.strip())] = (name.strip(), version.strip())
    pins, kept = [], []
    for pin in lane.pins:
        name = pin.split("==")[0]
        if _normalized(name) in found:
            pins.append('"{}=={}"'.format(*found[_normalized(name)]))
        else:
            pins.append(f'"{pin}"')
            kept.append(name)
    lines, line = [], "   "
    for item in pins:
        if len(line) + len(item) + 2 > 104:
            lines.append(line)
            line = "   "
        line += f" {item},"
    lines.append(line)
    note = f"# not in {freeze_file.name}, kept: {', '.join(kept)}\n" if kept else ""
    return note + "pins = [\n" + "\n".join(lines) + "\n]"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["list", "build", "run", "refresh"])
    parser.add_argument("lanes", nargs="*", help="lane names (requirements/lanes.toml)")
    parser.add_argument("--all", action="store_true", help="every lane but those the README's command runs")
    parser.add_argument("--phases", metavar="FILE", help="append the lanes' phases to FILE (.ci/run)")
    parser.add_argument("--jobs", type=int, default=2, help="lanes run at once (default: 2)")
    parser.add_argument("--wheel", type=Path, help=argparse.SUPPRESS)  # the wheel of the lanes' parent
    args = parser.parse_args(argv)
    lanes, tools = read_lanes()
    if args.command == "refresh":
        if len(args.lanes) != 2 or args.lanes[0] not in lanes:
            parser.error("refresh takes a lane and a pip-freeze file")
        print(refreshed(lanes[args.lanes[0]], Path(args.lanes[1])))
        return 0
    if args.command == "list":
        for lane in lanes.values():
            python = find_python(lane.python)
            print(f"{lane.name:14} Python {lane.python} ({python or 'missing'}), "
                  f"KERAS_BACKEND={lane.backend}, tests: {lane.tests}: {lane.title}")
        return 0
    unknown = [name for name in args.lanes if name not in lanes]
    if unknown or (args.all == bool(args.lanes)):
        parser.error(f"unknown lane {unknown[0]!r}; see `lanes.py list`" if unknown
                     else "name lanes, or --all")
    chosen = [lane for lane in lanes.values() if lane.tests != "readme"] if args.all else [
        lanes[name] for name in args.lanes]
    needs_wheel = any(lane.tests != "readme" for lane in chosen)
    wheel = args.wheel or (build_wheel() if needs_wheel else None)
    if args.command == "run" and args.jobs > 1 and len(chosen) > 1:
        assert wheel is not None
        return run_at_once(chosen, wheel, pytest_args, args.jobs, args.phases)
    results: list[Result] = []
    for lane in chosen:
        if lane.tests == "readme":
            if args.command == "build":
                say(f"{lane.name}: built by the README's test command (.venv), not here")
                continue
            started = time.monotonic()
            outcome = "passed" if run_readme(pytest_args) == 0 else "FAILED"
            results.append(Result(lane.name, outcome, "the README's .venv", 0.0, time.monotonic() - started))
            continue
        assert wheel is not None
        with locked(lane):
            started = time.monotonic()
            venv = build(lane, wheel, tools)
            built = time.monotonic() - started
            if venv is None:
                results.append(Result(lane.name, "skipped", "-", built, 0.0))
                continue
            state = "reused" if venv.reused else "built"
            if args.command == "build":
                results.append(Result(lane.name, "built", state, built, 0.0))
                continue
            started = time.monotonic()
            outcome = "passed" if run_tests(venv, pytest_args) == 0 else "FAILED"
            results.append(Result(lane.name, outcome, state, built, time.monotonic() - started))
            remember_minutes(lane.name, (built + time.monotonic() - started) / 60)
    for result in results:
        say(result.line())
    if args.phases:
        with open(args.phases, "a") as table:
            for result in results:
                table.write(result.phase_rows())
    return 1 if any(result.outcome == "FAILED" for result in results) else 0


def run_at_once(chosen: list[Lane], wheel: Path, pytest_args: list[str], jobs: int,
                phases: str | None) -> int:
    """Run each lane in a process of its own (this script, one lane), ``jobs`` at a time, the
    longest first; each lane's output is printed whole when it ends. 1 if any lane failed."""
    logs = LANES_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    waiting = sorted(chosen, key=lambda lane: -last_minutes().get(lane.name, 0.0))
    running: dict[subprocess.Popen[bytes], tuple[Lane, Path]] = {}
    failed, rows = False, {}
    while waiting or running:
        while waiting and len(running) < jobs:
            lane = waiting.pop(0)
            log, table = logs / f"{lane.name}.log", logs / f"{lane.name}.phases"
            table.unlink(missing_ok=True)
            command = [sys.executable, str(Path(__file__).resolve()), "run", lane.name, "--jobs", "1",
                       "--wheel", str(wheel), "--phases", str(table), "--", *pytest_args]
            with open(log, "wb") as out:
                running[subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)] = (lane, table)
            say(f"{lane.name}: started (its output: {log.relative_to(ROOT)}, shown when it ends)")
        finished = [proc for proc in running if proc.poll() is not None]
        if not finished:
            time.sleep(1)
            continue
        for proc in finished:
            lane, table = running.pop(proc)
            print(f"\n===== lane {lane.name} =====", flush=True)
            sys.stdout.write((logs / f"{lane.name}.log").read_text(errors="replace"))
            sys.stdout.flush()
            failed |= proc.returncode != 0
            rows[lane.name] = table.read_text() if table.exists() else (
                f"lane {lane.name}\t-\t-\tFAILED (exit {proc.returncode})\n")
    if phases:
        with open(phases, "a") as out:
            out.writelines(rows[lane.name] for lane in chosen)
    return 1 if failed else 0


def last_minutes() -> dict[str, float]:
    """Each lane's minutes in its last run on this machine (to start the longest first)."""
    try:
        found = json.loads((CACHE / "minutes.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def remember_minutes(name: str, minutes: float) -> None:
    with contextlib.suppress(OSError):
        CACHE.mkdir(parents=True, exist_ok=True)
        path = CACHE / f"minutes.json.{os.getpid()}.tmp"
        path.write_text(json.dumps({**last_minutes(), name: round(minutes, 2)}))
        path.replace(CACHE / "minutes.json")


@dataclass(frozen=True)
class Result:
    """One lane's run: its outcome, whether its venv was reused, and the minutes of each phase."""

    lane: str
    outcome: str
    venv: str  # "reused", "built", or where it is
    build_s: float
    tests_s: float

    def line(self) -> str:
        return (f"{self.lane:14} {self.outcome:8} venv {self.venv:8} build {self.build_s / 60:5.1f} min, "
                f"tests {self.tests_s / 60:5.1f} min")

    def phase_rows(self) -> str:
        """Rows of .ci/run's closing table: phase, minutes, venv, outcome (tab-separated)."""
        return (f"lane {self.lane}: build\t{self.build_s / 60:.1f}\t{self.venv}\t-\n"
                f"lane {self.lane}: tests\t{self.tests_s / 60:.1f}\t-\t{self.outcome}\n")

if __name__ == "__main__":
    sys.exit(main())
