"""Build and test the lanes of requirements/lanes.toml: Colab's runtimes as venvs under .lanes/.

    python3 scripts/lanes.py list                    # lanes, their Python, whether it is here
    python3 scripts/lanes.py build colab-tpu         # build (or reuse) one lane's venv
    python3 scripts/lanes.py run colab-tpu [-- PYTEST ARGS]   # build it, then run its tests
    python3 scripts/lanes.py run --all               # every lane but those the README's command runs
    python3 scripts/lanes.py refresh colab FREEZE    # the lane's pins at a pip-freeze file's versions

A lane is built as a user's Colab is: its pins first (the runtime), then resumable as
``pip install keras-resumable`` installs it (a wheel of this checkout, with its dependencies:
what that adds or changes is printed and kept in ``.lanes/<name>/install-changes.txt``), then the
test tools, constrained to change nothing installed. A venv is reused while its pins, Python and
resumable's requirements are the same; resumable itself is reinstalled from a fresh wheel at
every build. The tests run on the installed package, never on the checkout's sources.

A lane whose Python is not on this machine is skipped with one line. Exit status: 0 when every
lane run passed (skipped ones included), 1 when any failed, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import configparser
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "requirements" / "lanes.toml"
LANES_DIR = ROOT / ".lanes"
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

    @property
    def venv(self) -> Path:
        return LANES_DIR / self.name

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


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


def stamp(lane: Lane, python: Path, tools: list[str]) -> str:
    """What a lane's venv was built from: when it changes, the venv is built again from nothing."""
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    text = json.dumps([lane.pins, lane.backend, version, install_requires(), tools])
    return hashlib.sha256(text.encode()).hexdigest()


def say(message: str) -> None:
    print(f"lanes: {message}", flush=True)


def pip(lane: Lane, *args: str, quiet: bool = True) -> None:
    command = [str(lane.bin / "python"), "-m", "pip", *(("-q",) if quiet else ()),
               "--disable-pip-version-check", *args]
    subprocess.run(command, check=True)


def freeze(lane: Lane) -> dict[str, str]:
    """``pip freeze`` of the lane as {normalized name: version}."""
    out = subprocess.run([str(lane.bin / "python"), "-m", "pip", "list", "--format=json",
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


def build(lane: Lane, wheel: Path, tools: list[str]) -> bool:
    """Build (or reuse) the lane's venv with resumable installed from ``wheel``; False when its
    Python is missing (said in one line)."""
    python = find_python(lane.python)
    if python is None:
        say(f"{lane.name}: skipped: Python {lane.python} is not on this machine "
            f"(`pyenv install {lane.python}` or python{lane.python} on PATH)")
        return False
    wanted = stamp(lane, python, tools)
    stamp_file = lane.venv / "lane-stamp"
    if stamp_file.is_file() and stamp_file.read_text() == wanted:
        say(f"{lane.name}: reusing {lane.venv.relative_to(ROOT)}; reinstalling resumable from {wheel.name}")
        pip(lane, "install", "--no-deps", "--force-reinstall", str(wheel))
        return True
    say(f"{lane.name}: building {lane.venv.relative_to(ROOT)} with {python} ({lane.title})")
    shutil.rmtree(lane.venv, ignore_errors=True)
    subprocess.run([str(python), "-m", "venv", str(lane.venv)], check=True)
    if lane.pins:
        pip(lane, "install", *lane.pins)
    runtime = freeze(lane)
    (lane.venv / "runtime.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(runtime.items())))
    pip(lane, "install", str(wheel))  # as `pip install keras-resumable`: no upgrade of what satisfies
    installed = freeze(lane)
    changed = [line for line in changes(runtime, installed) if not line.startswith("added keras-resumable ")]
    (lane.venv / "install-changes.txt").write_text("".join(f"{line}\n" for line in changed))
    shown = "; ".join(changed) if len(changed) <= 8 else (
        f"{'; '.join(changed[:8])}; ... ({len(changed)} in all: {lane.venv.name}/install-changes.txt)")
    say(f"{lane.name}: `pip install keras-resumable` " + (f"also: {shown}" if changed else "changed nothing"))
    pinned = {_normalized(pin.split("==")[0]) for pin in lane.pins if "==" in pin}
    moved = [line for line in changed if not line.startswith("added ") and line.split()[1] in pinned
             and line.split()[1] not in {_normalized(n) for n in lane.may_change}]
    if moved:
        raise SystemExit(f"lanes: {lane.name}: `pip install keras-resumable` changed the runtime's "
                         f"{'; '.join(moved)} (not in the lane's may_change)")
    constraints = lane.venv / "installed.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(installed.items())
                                   if n != "keras-resumable"))
    pip(lane, "install", "-c", str(constraints), *tools)
    moved = changes(installed, {n: v for n, v in freeze(lane).items() if n in installed})
    if moved:
        raise SystemExit(f"lanes: {lane.name}: the test tools changed {'; '.join(moved)}")
    stamp_file.write_text(wanted)
    return True


def run_tests(lane: Lane, pytest_args: list[str]) -> int:
    """The lane's tests on the installed resumable; pytest's exit status."""
    env = {**os.environ, "KERAS_BACKEND": lane.backend, "RESUMABLE_LANE": lane.name}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    python = str(lane.bin / "python")
    where = subprocess.run([python, "-P", "-c", "import resumable; print(resumable.__file__)"], cwd=ROOT,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not where.startswith(str(lane.venv)):
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
    wheel = build_wheel() if any(lane.tests != "readme" for lane in chosen) else None
    results: list[tuple[str, str, float]] = []
    for lane in chosen:
        started = time.monotonic()
        if lane.tests == "readme":
            if args.command == "build":
                say(f"{lane.name}: built by the README's test command (.venv), not here")
                continue
            outcome = "passed" if run_readme(pytest_args) == 0 else "FAILED"
        else:
            assert wheel is not None
            if not build(lane, wheel, tools):
                results.append((lane.name, "skipped", time.monotonic() - started))
                continue
            if args.command == "build":
                results.append((lane.name, "built", time.monotonic() - started))
                continue
            outcome = "passed" if run_tests(lane, pytest_args) == 0 else "FAILED"
        results.append((lane.name, outcome, time.monotonic() - started))
    for name, outcome, seconds in results:
        say(f"{name:14} {outcome:8} {seconds / 60:5.1f} min")
    return 1 if any(outcome == "FAILED" for _, outcome, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
