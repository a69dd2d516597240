"""Try hostile run folders against every command; count what must never happen.

    python scripts/hostile_audit.py            # a table, then the totals
    python scripts/hostile_audit.py --json     # one JSON object
    python scripts/hostile_audit.py --only deep-nesting

Each case starts from a real local run of three good checkpoints (ckpt-000001..3), a folder
"outside" the run beside it, then makes the run hostile: a damaged or crafted fourth
checkpoint, a damaged run index or lease, symlinks and hard links that lead outside, names
with terminal escapes. Then it runs what users run: ``list`` (quick, ``--deep``, ``--json``),
``inspect``, ``verify``, ``prune`` (CLI, nothing real to prune), resuming (the Keras-free
manager's ``fetch_newest``, which ``resume()`` uses) and a delete with Drive's
truncate-before-delete. It counts:

- tracebacks: an exception other than a ResumableError, or "Traceback" in any output;
- outside bytes changed: files under "outside" whose content, size or presence changed;
- committed lost: good checkpoints whose files changed or went, other than the one deleted on
  purpose, and resumes that did not load the newest good checkpoint;
- raw control characters: ESC or other C0/C1 characters in what the CLI printed.

A second set of cases (`CLASSES`: files NumPy or Keras refuse, wrong clocks, failing servers,
a checkpoint damaged after its commit) runs what those touch: ``resumable.resume()`` on a real
Keras run, two writers' leases, the CLI against fake-gcs-server behind a fault proxy. It adds:

- live writers taken over, or leases blocking past their timeout;
- storage errors of the wrong class, and seconds before a command's one line on a failing server
  (counted when over 35 s);
- memory beyond the bound while reading a checkpoint (counted per case, over 128 MB);
- damaged checkpoints called good (`verify --latest` exiting 0, `list`'s "latest good").

Exit status: 0 when all counts are 0, 1 otherwise. docs/reliability.md shows the figures.
``--classes`` runs only the second set; ``--no-classes`` only the first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resumable import RunStorage
from resumable.cli.app import main as cli
from resumable.core.checksum import crc32c_of_bytes
from resumable.core.errors import ResumableError
from resumable.core.manifest import Manifest
from resumable.manager.run_manager import RunManager

GOOD = ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
HOSTILE = "ckpt-000004"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but tab and newline

Case = Callable[[Path, Path], None]  # (run folder, outside folder) -> None
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn
    return register


# ------------------------------------------------------------------ building runs


def build_run(run: Path, staging: Path) -> None:
    manager = RunManager(str(run), staging_dir=staging, async_upload=False)
    manager.writer.acquire()
    for epoch, name in enumerate(GOOD, start=1):
        staged = manager.writer.stage(name)
        staged.mkdir(parents=True)
        (staged / "model.keras").write_bytes(bytes([epoch]) * 5000)
        (staged / "state.json").write_text(json.dumps({"epoch": epoch}))
        manager.writer.submit(staged, name, Manifest(epoch=epoch, step=epoch * 10,
                                                     metrics={"loss": 1 / epoch}, versions={"keras": "3"}))
    manager.release()


def newest_manifest(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / GOOD[-1] / "manifest.json").read_bytes())
    return data


def crafted(run: Path, manifest: dict[str, Any] | bytes, files: dict[str, bytes] | None = None) -> None:
    """A fourth checkpoint: the newest one's files, and ``manifest`` as its manifest."""
    folder = run / HOSTILE
    folder.mkdir()
    default = {p.name: p.read_bytes() for p in (run / GOOD[-1]).iterdir() if p.name != "manifest.json"}
    for rel, data in (default if files is None else files).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    blob = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    (folder / "manifest.json").write_bytes(blob)


def edited(run: Path, **changes: Any) -> dict[str, Any]:
    """The newest manifest, as a fourth checkpoint's, with ``changes`` (epoch 4 unless changed)."""
    manifest = newest_manifest(run)
    manifest.update({"epoch": 4, "step": 40})
    manifest.update(changes)
    return manifest


# ------------------------------------------------------------------ hostile JSON in a manifest


@case("deep-nesting")
def _(run: Path, outside: Path) -> None:
    crafted(run, b"[" * 200_000 + b"]" * 200_000)


@case("deep-nesting-in-state")
def _(run: Path, outside: Path) -> None:
    manifest = json.dumps(edited(run)).encode()
    crafted(run, manifest.replace(b'"state": {}', b'"state": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000))


@case("nan-epoch")
def _(run: Path, outside: Path) -> None:
    crafted(run, json.dumps(edited(run, epoch=float("nan"))).encode())


@case("infinite-size")
def _(run: Path, outside: Path) -> None:
    manifest = edited(run)
    manifest["files"]["model.keras"]["size"] = float("inf")
    crafted(run, json.dumps(manifest).encode())


@case("1e400-step")
def _(run: Path, outside: Path) -> None:
    crafted(run, json.dumps(edited(run)).encode().replace(b'"step": 40', b'"step": 1e400'))


@case("400-digit-epoch")
def _(run: Path, outside: Path) -> None:
    crafted(run, json.dumps(edited(run, epoch=10**400)).encode())


@case("5000-digit-size")
def _(run: Path, outside: Path) -> None:
    blob = json.dumps(edited(run)).encode()
    crafted(run, re.sub(rb'"size": \d+', b'"size": ' + b"9" * 5000, blob))


@case("string-epoch")
def _(run: Path, outside: Path) -> None:
    crafted(run, edited(run, epoch="4"))


@case("fractional-epoch")
def _(run: Path, outside: Path) -> None:
    crafted(run, edited(run, epoch=4.5))


@case("boolean-epoch")
def _(run: Path, outside: Path) -> None:
    crafted(run, edited(run, epoch=True))


@case("negative-size")
def _(run: Path, outside: Path) -> None:
    manifest = edited(run)
    manifest["files"]["model.keras"]["size"] = -1
    crafted(run, manifest)


@case("checksum-not-hex")
def _(run: Path, outside: Path) -> None:
    manifest = edited(run)
    manifest["files"]["model.keras"]["crc32c"] = "zzzzzzzz"
    crafted(run, manifest)


@case("checksum-too-long")
def _(run: Path, outside: Path) -> None:
    manifest = edited(run)
    manifest["files"]["model.keras"]["crc32c"] += "0"
    crafted(run, manifest)


@case("utf16-manifest")
def _(run: Path, outside: Path) -> None:
    crafted(run, json.dumps(edited(run)).encode("utf-16"))


@case("duplicate-keys")
def _(run: Path, outside: Path) -> None:
    crafted(run, json.dumps(edited(run)).encode().replace(b'"epoch": 4', b'"epoch": 4, "epoch": 9'))


@case("huge-manifest")
def _(run: Path, outside: Path) -> None:
    manifest = json.dumps(edited(run)).encode()
    crafted(run, manifest[:-1] + b', "pad": "' + b"x" * 80_000_000 + b'"}')


@case("empty-manifest")
def _(run: Path, outside: Path) -> None:
    crafted(run, b"")


@case("manifest-a-list")
def _(run: Path, outside: Path) -> None:
    crafted(run, b"[1, 2, 3]")


@case("files-not-a-dict")
def _(run: Path, outside: Path) -> None:
    crafted(run, edited(run, files=["model.keras"]))


@case("no-files")
def _(run: Path, outside: Path) -> None:
    crafted(run, edited(run, files={}), files={"unrelated.txt": b"x"})


@case("no-model-file")
def _(run: Path, outside: Path) -> None:
    state = b'{"epoch": 4}'
    crafted(run, edited(run, files={"state.json": {"size": len(state), "crc32c": crc32c_of_bytes(state)}}),
            files={"state.json": state})


@case("file-name-leads-outside")
def _(run: Path, outside: Path) -> None:
    target = os.path.relpath(outside / "precious.bin", run / HOSTILE)
    data = (outside / "precious.bin").read_bytes()
    crafted(run, edited(run, files={target: {"size": len(data), "crc32c": crc32c_of_bytes(data)}}), files={})


@case("metrics-not-numbers")
def _(run: Path, outside: Path) -> None:
    crafted(run, edited(run, metrics={"loss": {"nested": [1, 2]}}))


@case("terminal-escapes-in-metrics-and-versions")
def _(run: Path, outside: Path) -> None:
    # A well-formed manifest: the checkpoint is good, only its strings are hostile.
    crafted(run, edited(run, metrics={"\x1b[2J\x1b]0;pwned\x07loss": 0.1}, versions={"keras": "3\x1b[31m"}))


# ------------------------------------------------------------------ the run index and the lease


@case("index-deep-nesting")
def _(run: Path, outside: Path) -> None:
    (run / "index.json").write_bytes(b"{" * 0 + b"[" * 200_000)


@case("index-huge")
def _(run: Path, outside: Path) -> None:
    (run / "index.json").write_bytes(b'{"pad": "' + b"x" * 80_000_000 + b'"}')


@case("index-nan-and-wrong-columns")
def _(run: Path, outside: Path) -> None:
    index = json.loads((run / "index.json").read_bytes())
    for key, column in index.items():
        if isinstance(column, list) and column:
            column[-1] = float("nan") if key != "names" else "../../outside"
    (run / "index.json").write_text(json.dumps(index))


@case("index-utf16")
def _(run: Path, outside: Path) -> None:
    (run / "index.json").write_bytes((run / "index.json").read_text().encode("utf-16"))


@case("lease-deep-nesting")
def _(run: Path, outside: Path) -> None:
    (run / "lease.json").write_bytes(b"[" * 200_000)


@case("lease-huge")
def _(run: Path, outside: Path) -> None:
    (run / "lease.json").write_bytes(b'{"pad": "' + b"x" * 80_000_000 + b'"}')


@case("lease-nan-timeout")
def _(run: Path, outside: Path) -> None:
    when = "2026-01-01T00:00:00+00:00"
    (run / "lease.json").write_text('{"format": "resumable.lease", "token": "t", "host": "h", "pid": 1, '
                                    f'"started": "{when}", "renewed": "{when}", "timeout": NaN}}')


# ------------------------------------------------------------------ links and names


@case("checkpoint-folder-symlinked-outside")
def _(run: Path, outside: Path) -> None:
    (run / HOSTILE).symlink_to(outside, target_is_directory=True)


@case("file-symlinked-outside")
def _(run: Path, outside: Path) -> None:
    data = (outside / "precious.bin").read_bytes()
    crafted(run, edited(run, files={"model.keras": {"size": len(data), "crc32c": crc32c_of_bytes(data)}}),
            files={})
    (run / HOSTILE / "model.keras").symlink_to(outside / "precious.bin")


@case("file-hard-linked-outside")
def _(run: Path, outside: Path) -> None:
    data = (outside / "precious.bin").read_bytes()
    crafted(run, edited(run, files={"model.keras": {"size": len(data), "crc32c": crc32c_of_bytes(data)}}),
            files={})
    os.link(outside / "precious.bin", run / HOSTILE / "model.keras")


@case("run-backed-up-with-cp-al")
def _(run: Path, outside: Path) -> None:
    shutil.rmtree(outside)
    shutil.copytree(run, outside, copy_function=os.link)  # `cp -al run outside`: every file hard-linked


@case("folder-name-with-terminal-escapes")
def _(run: Path, outside: Path) -> None:
    shutil.copytree(run / GOOD[0], run / "ckpt-000009\x1b[2J\x1b]0;pwned\x07")


# ------------------------------------------------------------------ running a case


@dataclass
class Outcome:
    name: str
    tracebacks: list[str] = field(default_factory=list)
    outside_changed: list[str] = field(default_factory=list)
    committed_lost: list[str] = field(default_factory=list)
    control_chars: list[str] = field(default_factory=list)
    resumed: str | None = None
    writers_stopped: list[str] = field(default_factory=list)  # live writers taken over; leases blocking on
    wrong_errors: list[str] = field(default_factory=list)  # a storage error of the wrong class or too slow
    memory: list[str] = field(default_factory=list)  # reading a checkpoint beyond the bound
    called_good: list[str] = field(default_factory=list)  # a damaged checkpoint called good

    @property
    def problems(self) -> list[str]:
        return (self.tracebacks + self.outside_changed + self.committed_lost + self.control_chars
                + self.writers_stopped + self.wrong_errors + self.memory + self.called_good)

    @property
    def clean(self) -> bool:
        return not self.problems


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under ``root`` (links not followed) with its size and content."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            found[rel] = (0, b"<link>") if path.is_symlink() else (path.stat().st_size, path.read_bytes())
    return found


def run_case(name: str, base: Path, template: Path) -> Outcome:
    outcome = Outcome(name)
    run, outside = base / "run", base / "outside"
    shutil.copytree(template, run)
    outside.mkdir()
    (outside / "precious.bin").write_bytes(os.urandom(3000))
    (outside / "notes.txt").write_text("keep me")
    good_files = {n: tree(run / n) for n in GOOD}
    CASES[name](run, outside)
    outside_before = tree(outside)

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        out, err = io.StringIO(), io.StringIO()
        result = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            handler = logging.StreamHandler(sys.stderr)  # warnings users see, in this output
            logging.getLogger("resumable").addHandler(handler)
            try:
                result = fn()
            except ResumableError as e:
                print(f"error: {e}", file=sys.stderr)
            except Exception:
                outcome.tracebacks.append(f"{what}: {traceback.format_exc(limit=3)}")
            finally:
                logging.getLogger("resumable").removeHandler(handler)
        text = out.getvalue() + err.getvalue()
        if "Traceback" in text:
            outcome.tracebacks.append(f"{what}: printed a traceback")
        if CONTROL.search(text) and what.startswith("resumable"):
            outcome.control_chars.append(f"{what}: {CONTROL.findall(text)[:3]}")
        return result

    url = str(run)
    for argv in (["list"], ["list", "--deep"], ["list", "--json"], ["inspect"], ["verify"],
                 ["prune", "--keep-last", "3", "--yes"]):
        attempt(f"resumable {' '.join(argv)}", lambda argv=argv: cli([argv[0], url, *argv[1:]]))
    found = attempt("resume", lambda: RunManager(url, staging_dir=base / "cache").fetch_newest(warn=print))
    outcome.resumed = found[0].name if found else None
    # Well-formed checkpoints whose only oddity is harmless to read: they are the newest good ones.
    legit = ("terminal-escapes-in-metrics-and-versions", "file-hard-linked-outside")
    newest_good = HOSTILE if name in legit else GOOD[-1]
    if outcome.resumed != newest_good:
        outcome.committed_lost.append(f"resume loaded {outcome.resumed}, not {newest_good}")
    drive = RunStorage(url, truncate_before_delete=True)  # deletes as on Google Drive
    for doomed in (HOSTILE, GOOD[0]):
        if os.path.lexists(run / doomed):
            attempt(f"delete {doomed}", lambda doomed=doomed: drive.delete(doomed))
    for n in GOOD[1:]:
        if tree(run / n) != good_files[n]:
            outcome.committed_lost.append(n)
    after = tree(outside)
    outcome.outside_changed = sorted(rel for rel in set(outside_before) | set(after)
                                     if outside_before.get(rel) != after.get(rel))
    return outcome


def audit(only: list[str] | None = None, *, folders: bool = True, classes: bool = True) -> list[Outcome]:
    names = [n for n in only or list(CASES) if n in CASES] if folders else []
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="resumable-audit-") as tmp:
        if names:
            template = Path(tmp) / "template"
            build_run(template, Path(tmp) / "staging")
            for lease in template.glob("lease.json"):
                lease.unlink()
            for i, name in enumerate(names):
                outcomes.append(run_case(name, Path(tmp) / f"case-{i}", template))
        if classes:
            import audit_classes  # beside this script

            chosen = [n for n in only or list(audit_classes.CLASSES) if n in audit_classes.CLASSES]
            outcomes += audit_classes.run_classes(chosen, Path(tmp) / "classes", Outcome)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import audit_classes

    parser.add_argument("--only", action="append", choices=sorted([*CASES, *audit_classes.CLASSES]),
                        help="run only this case")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--classes", action="store_true", help="only the second set: files, clocks, servers")
    which.add_argument("--no-classes", action="store_true", help="only the hostile run folders")
    args = parser.parse_args(argv)
    outcomes = audit(args.only, folders=not args.classes, classes=not args.no_classes)
    totals = {
        "hostile inputs tried": len(outcomes),
        "raw tracebacks": sum(len(o.tracebacks) for o in outcomes),
        "bytes changed outside the run (files)": sum(len(o.outside_changed) for o in outcomes),
        "committed checkpoints lost": sum(len(o.committed_lost) for o in outcomes),
        "raw control characters printed": sum(len(o.control_chars) for o in outcomes),
        "live writers stopped or blocked past their lease": sum(len(o.writers_stopped) for o in outcomes),
        "storage errors of the wrong class or over 35 s": sum(len(o.wrong_errors) for o in outcomes),
        "checkpoint reads beyond the memory bound": sum(len(o.memory) for o in outcomes),
        "damaged checkpoints called good": sum(len(o.called_good) for o in outcomes),
    }
    if args.json:
        print(json.dumps({"totals": totals, "cases": [o.__dict__ for o in outcomes]}, indent=1))
    else:
        for o in outcomes:
            print(f"{'ok  ' if o.clean else 'FAIL'}  {o.name:<42} resumed {o.resumed}")
            for problem in o.problems:
                print(f"      {problem}")
        print()
        for key, value in totals.items():
            print(f"{key}: {value}")
    return 0 if all(o.clean for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
