"""The ``resumable`` command: list, inspect, verify and prune the checkpoints of a run folder.

Works the same on a local folder, a Google Drive mount and ``gs://bucket/prefix``. Imports
neither TensorFlow nor Keras (``demo`` does, when it runs). See docs/cli.md.

Example:

```
resumable list gs://my-bucket/runs/exp1
resumable verify /content/drive/MyDrive/runs/exp1 --all
resumable prune ./runs/exp1 --keep-last 3 --keep-best 1 --monitor val_loss --dry-run
```
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import itertools
import json
import math
import operator
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from resumable.core.display import format_columns, format_table, human_size, utc_time, utc_times
from resumable.core.errors import CheckpointNotFoundError, LeaseHeldError, ResumableError, RunNotFoundError
from resumable.core.manifest import MANIFEST_NAME
from resumable.core.policy import Decision, Retention, best_one, resolve_mode
from resumable.manager.run_manager import RunManager
from resumable.storage import CheckpointInfo, RunStorage, Status
from resumable.storage.lease import read_lease

EXIT_OK = 0
EXIT_VERIFY_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

PROGRESS_MIN_ITEMS = 5  # fewer than this finish before a bar is worth drawing
VERIFY_WORKERS = 8  # checkpoints re-read at once; reads are I/O bound on GCS and Drive

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  verification failed (a checkpoint is corrupt, or none is good)
  2  bad usage or bad input: one "error: ..." line on stderr, nothing deleted
"""

T = TypeVar("T")


class UsageError(ResumableError):
    """Bad command-line arguments; reported like any other error, with exit code 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become one ``error:`` line instead of usage text."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see `{self.prog} --help`")


# ------------------------------------------------------------------ entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``resumable`` command line and return its exit code.

    Args:
        argv: Arguments without the program name. Defaults to ``sys.argv[1:]``.

    Returns:
        0 on success, 1 when verification failed, 2 on bad usage or bad input.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help and --version
            return e.code if isinstance(e.code, int) else EXIT_OK
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except ResumableError as e:
        _error(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `resumable list ... | head`
        sys.stderr.close()
        return EXIT_OK


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand (exposed for docs and tests).

    Args:
        command: Build only this subcommand (a name or an alias); every one when None or
            unknown. `main` builds only the one it runs: argparse spends about half a
            millisecond on each (translation lookups, terminal-size probes), as much as
            `list` spends on a few hundred checkpoints.
    """
    from resumable._version import __version__

    parser = _Parser(
        prog="resumable",
        description="List, inspect, verify and prune the checkpoints of a resumable run folder:\n"
        "a local folder, a Google Drive folder or gs://bucket/prefix.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"resumable {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True, parser_class=_Parser)
    known = any(command in (name, *aliases) for name, aliases, *_ in _SUBCOMMANDS)
    for name, aliases, handler, summary, add_arguments in _SUBCOMMANDS:
        if not known or command in (name, *aliases):
            add_arguments(_command(commands, name, handler, summary, aliases))
    return parser


def _list_arguments(list_: argparse.ArgumentParser) -> None:
    _add_url(list_)
    _add_monitor(list_, "metric to show and to rank the best checkpoint by")
    list_.add_argument("--deep", action="store_true",
                       help="check every file's size (and CRC32C on GCS) against its manifest: one "
                       "recursive listing instead of the run index")
    _add_json(list_)


def _inspect_arguments(inspect: argparse.ArgumentParser) -> None:
    _add_url(inspect)
    _add_selection(inspect)
    _add_json(inspect)


def _verify_arguments(verify: argparse.ArgumentParser) -> None:
    _add_url(verify)
    _add_selection(verify).add_argument("--all", action="store_true", help="verify every checkpoint")
    _add_json(verify)


def _prune_arguments(prune: argparse.ArgumentParser) -> None:
    prune.description = (
        "Delete checkpoints that no retention rule keeps. The newest good checkpoint and the best one\n"
        "are never deleted; unfinished or corrupt checkpoints older than the newest good one are.\n"
        "With no --keep-* option only those leftovers go; --keep-best or --keep-every alone keep\n"
        "what they name plus the newest good checkpoint. Asks on a terminal unless --yes."
    )
    _add_url(prune)
    prune.add_argument("--keep-last", type=int, metavar="N", help="keep the newest N good checkpoints")
    prune.add_argument("--keep-best", type=int, metavar="N", help="keep the best N by --monitor")
    _add_monitor(prune, "metric for --keep-best; the best checkpoint by it is always kept")
    prune.add_argument("--keep-every", type=int, metavar="N", help="keep checkpoints of every N-th epoch")
    prune.add_argument("--dry-run", action="store_true", help="show what would be deleted; delete nothing")
    prune.add_argument("-y", "--yes", action="store_true", help="delete without asking for confirmation")
    prune.add_argument("--force", action="store_true",
                       help="delete even while a training process holds the run's writer lease")
    _add_json(prune)


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("folder", nargs="?", metavar="FOLDER", help="run folder (default: ./resumable-demo)")


def _command(
    commands: Any, name: str, handler: Callable[[argparse.Namespace], int], summary: str,
    aliases: Sequence[str] = (),
) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = commands.add_parser(
        name, aliases=list(aliases), help=summary, description=summary[0].upper() + summary[1:] + ".",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.set_defaults(handler=handler)
    return sub


def _add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="run folder: a path, /content/drive/..., gs://bucket/prefix")


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")


def _add_monitor(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--monitor", metavar="METRIC",
        help=f"{what} (default: the one the callback recorded, else val_loss, else loss)",
    )
    parser.add_argument(
        "--mode", choices=("auto", "min", "max"), default=None,
        help="whether lower or higher is better (default: recorded, else auto: max for accuracy-like names)",
    )


def _add_selection(parser: argparse.ArgumentParser) -> argparse._MutuallyExclusiveGroup:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--epoch", type=int, metavar="N", help="the newest good checkpoint of epoch N")
    group.add_argument("--name", metavar="NAME", help="the checkpoint folder NAME, e.g. ckpt-000003")
    return group


# ------------------------------------------------------------------ list


def _cmd_list(args: argparse.Namespace) -> int:
    storage, infos = _load(args.url, check_files=args.deep)
    recorded = _metric_names(infos)
    ranking = _ranking(infos, args.monitor, args.mode, recorded)
    latest = _latest_good(infos)
    best_one = ranking.best(infos)
    if args.json:
        _print_json({
            "url": storage.url,
            "checkpoints": [_info_json(i) for i in infos],
            "latest": latest.name if latest else None,
            "best": _best_json(ranking, best_one),
        })
        return EXIT_OK
    if not infos:
        _out(f"no checkpoints in {storage.url}")
        return EXIT_OK
    metrics = [args.monitor] if args.monitor else recorded
    notes = {id(latest): "latest", id(best_one): "best"}
    if latest is best_one:
        notes = {id(latest): "latest, best"}
    # Built a column at a time, one plain pass each: a run may hold thousands of checkpoints.
    # Indexed infos answer from their index row without building manifests or file records.
    epochs = [i.epoch for i in infos]
    steps = [i.step for i in infos]
    logged = [i.metrics for i in infos]
    columns = [["NAME", *[i.name for i in infos]],
               ["EPOCH", *["-" if e is None else str(e) for e in epochs]],
               ["STEP", *["-" if s is None else str(s) for s in steps]]]
    columns += [[name, *_metric_cells(logged, name)] for name in metrics]
    sizes = [i.size for i in infos]
    shown = {size: human_size(size) for size in set(sizes)}  # checkpoints of one model: few sizes
    columns += [["SIZE", *[shown[size] for size in sizes]],
                ["CREATED", *utc_times([i.created_iso for i in infos])],
                ["STATUS", *[i.status._value_ for i in infos]],  # not `.value`, a property: 10x as slow
                ["NOTE", *[notes.get(id(i), "") for i in infos]]]
    _lines(format_columns(columns, right={1, 2, *range(3, 4 + len(metrics))}))  # numbers and size
    _out("")
    _lines(_problem_lines(infos))
    _out(_summary(infos))
    _out(f"latest good: {_describe(latest)}" if latest else "latest good: none; resume() would start afresh")
    _out(ranking.describe(best_one))
    if any(not i.ok for i in infos):
        _out(f"`resumable prune {storage.url}` removes unfinished or corrupt ones older than the latest good")
    if not all(i.checked for i in infos):
        _out("statuses from the run index; --deep checks every file's size, `resumable verify` re-reads them")
    return EXIT_OK


def _metric_cells(logged: Sequence[dict[str, float]], name: str) -> list[str]:
    values = [row.get(name) for row in logged]
    return ["-" if value is None else f"{value:.4g}" for value in values]  # as `_value`, inlined


def _summary(infos: Sequence[CheckpointInfo]) -> str:
    counts = Counter(map(_status_of, infos))  # `map`, not a generator: thousands of checkpoints
    detail = ", ".join(f"{counts[status]} {status}" for status in Status if counts[status])
    total = human_size(sum(map(_size_of, infos)))
    return f"{_plural(len(infos), 'checkpoint')} ({detail}), {total}"


def _problem_lines(infos: Sequence[CheckpointInfo]) -> list[str]:
    return [f"{i.name}: {i.status}: {i.problem}" for i in infos if not i.ok]


# ------------------------------------------------------------------ inspect


def _cmd_inspect(args: argparse.Namespace) -> int:
    storage, infos = _load(args.url)
    info = _select(storage, infos, args.epoch, args.name)
    if args.json:
        _print_json({**_info_json(info), "manifest": _manifest_json(info)})
        return EXIT_OK
    fields: list[tuple[str, str]] = [
        ("checkpoint", info.name), ("url", info.url), ("status", _status_text(info)),
    ]
    manifest = info.manifest
    if manifest is not None:
        fields += [
            ("epoch", str(manifest.epoch)),
            ("step", str(manifest.step)),
            ("batch", f"{manifest.batch} (mid-epoch save)" if manifest.batch else "0 (end of epoch)"),
            ("created", utc_time(info.created_iso)),
            ("size", f"{human_size(manifest.total_size)} in {_plural(len(manifest.files), 'file')}"),
            ("versions", ", ".join(f"{k} {v}" for k, v in manifest.versions.items()) or "-"),
            ("format", str(manifest.format_version)),
        ]
    _lines(format_table(["", ""], fields, header=False))
    if manifest is not None and manifest.metrics:
        _section("metrics", format_table(["", ""], [(k, _fmt_float(v)) for k, v in manifest.metrics.items()],
                                         header=False))
    _section("files", _file_table(info))
    if manifest is not None and manifest.state:
        _section("state", _state_lines(manifest.state))
        _out("")
        _out(f"full manifest: resumable inspect {storage.url} --name {info.name} --json")
    return EXIT_OK


def _file_table(info: CheckpointInfo) -> list[str]:
    expected = info.manifest.files if info.manifest else {}
    rows = []
    for rel, entry in expected.items():
        listed = info.listed.get(rel)
        if listed is None:
            check = "missing"
        elif listed.size != entry.size:
            check = f"stored size {human_size(listed.size)}"
        elif listed.crc32c is not None and listed.crc32c != entry.crc32c:
            check = f"stored crc32c {listed.crc32c}"
        else:
            check = "ok" if listed.crc32c else "ok (size)"
        rows.append([rel, human_size(entry.size), entry.crc32c, check])
    for rel, listed in sorted(info.listed.items()):
        if rel not in expected and rel != MANIFEST_NAME:
            rows.append([rel, human_size(listed.size), "-", "not in the manifest"])
    return format_table(["PATH", "SIZE", "CRC32C", "LISTING"], rows, right={1})


def _state_lines(state: dict[str, Any], width: int = 100) -> list[str]:
    """Top-level state keys, and one level below them, as compact JSON cut to ``width``."""
    rows: list[tuple[str, str]] = []
    for key, value in state.items():
        if isinstance(value, dict) and value:
            rows.append((key, ""))
            rows += [(f"  {sub}", _short_json(v, width)) for sub, v in value.items()]
        else:
            rows.append((key, _short_json(value, width)))
    return format_table(["", ""], rows, header=False)


# ------------------------------------------------------------------ verify


def _cmd_verify(args: argparse.Namespace) -> int:
    storage, infos = _load(args.url)
    if args.all:
        targets = list(infos)
    elif args.epoch is not None or args.name is not None:
        targets = [_select(storage, infos, args.epoch, args.name)]
    else:
        latest = _latest_good(infos)
        if latest is None:
            return _no_good_checkpoint(storage, infos, args.json)
        targets = [latest]
    results = _verify_all(storage, targets)
    failed = [name for name, (status, problems) in results.items() if status == "corrupt"]
    if args.json:
        _print_json({
            "url": storage.url,
            "ok": not failed,
            "checkpoints": [{"name": n, "status": s, "problems": p} for n, (s, p) in results.items()],
        })
        return EXIT_VERIFY_FAILED if failed else EXIT_OK
    for info in targets:
        status, problems = results[info.name]
        files = _plural(len(info.manifest.files), "file") if info.manifest else ""
        detail = f"{files}, {human_size(info.size)}" if files else ""
        _out(f"{status.upper() if status == 'corrupt' else status:8} {info.name}  {detail}".rstrip())
        _lines(f"  {problem}" for problem in problems)
    checked = len(results) - sum(1 for s, _ in results.values() if s == "partial")
    if failed:
        _out(f"verification failed: {len(failed)} of {checked} checkpoints corrupt")
        if not args.all:
            _out(f"resume() skips a corrupt checkpoint; `resumable verify {storage.url} --all` checks all")
        return EXIT_VERIFY_FAILED
    _out(f"verified {_plural(checked, 'checkpoint')}: all files match their manifests")
    return EXIT_OK


def _verify_all(storage: RunStorage, targets: Sequence[CheckpointInfo]) -> dict[str, tuple[str, list[str]]]:
    """``{name: (status, problems)}`` in the order of ``targets``; partial ones are not read."""

    def check(info: CheckpointInfo) -> tuple[str, list[str]]:
        if info.status is Status.PARTIAL:
            return "partial", [f"not verified: {info.problem}"]
        problems = storage.verify(info)
        return ("corrupt" if problems else "ok"), problems

    results: dict[str, tuple[str, list[str]]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=VERIFY_WORKERS) as pool:
        futures = {pool.submit(check, info): info.name for info in targets}
        done = concurrent.futures.as_completed(futures)
        for future in _progress(done, len(futures), "verifying", unit="ckpt"):
            results[futures[future]] = future.result()
    return {info.name: results[info.name] for info in targets}


def _no_good_checkpoint(storage: RunStorage, infos: Sequence[CheckpointInfo], as_json: bool) -> int:
    if not infos:
        raise CheckpointNotFoundError(f"{storage.url}: no checkpoints to verify")
    if as_json:
        _print_json({
            "url": storage.url,
            "ok": False,
            "checkpoints": [
                {"name": i.name, "status": str(i.status), "problems": [i.problem]} for i in infos
            ],
        })
    else:
        _lines(_problem_lines(infos))
        _out(f"verification failed: no good checkpoint in {storage.url}; resume() would start from scratch")
    return EXIT_VERIFY_FAILED


# ------------------------------------------------------------------ prune


def _cmd_prune(args: argparse.Namespace) -> int:
    for option in ("keep_last", "keep_best", "keep_every"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise UsageError(f"--{option.replace('_', '-')} must be >= 1, got {value}")
    manager = RunManager(args.url)
    storage, infos = _load(manager.storage)
    recorded = _metric_names(infos)
    ranking = _ranking(infos, args.monitor, args.mode, recorded)
    if args.keep_best and ranking.monitor is None:
        raise UsageError("--keep-best needs --monitor METRIC: no checkpoint recorded a metric to rank by")
    retention = Retention(
        # --keep-best or --keep-every alone mean "only those (and the latest)", not "and all the rest"
        keep_last=args.keep_last or (1 if args.keep_best or args.keep_every else None),
        keep_best=args.keep_best or 0,
        monitor=ranking.monitor,
        mode=ranking.mode,
        keep_every=args.keep_every,
    )
    pruning = manager.plan_pruning(retention, checkpoints=infos)
    decisions, doomed, freed = pruning.decisions, pruning.doomed, pruning.freed
    if not args.json:
        _print_plan(infos, decisions, ranking)
    if doomed and not args.dry_run:
        if not _confirmed(args.yes, f"delete {_count(doomed)} ({human_size(freed)}) from {storage.url}?"):
            _out("aborted: nothing deleted")
            return EXIT_OK
        with _writer_lease(manager, args.force):
            manager.prune(doomed, progress=lambda some: _progress(some, len(some), "deleting", unit="ckpt"))
    if args.json:
        _print_json({
            "url": storage.url,
            "dry_run": args.dry_run,
            "monitor": ranking.monitor,
            "deleted": [] if args.dry_run else [i.name for i in doomed],
            "kept": [d.name for d in decisions if d.keep],
            "freed_bytes": 0 if args.dry_run else freed,
            "decisions": [
                {"name": d.name, "keep": d.keep, "reasons": d.reasons, "status": str(i.status),
                 "size": i.size}
                for i, d in zip(infos, decisions, strict=True)
            ],
        })
        return EXIT_OK
    if not doomed:
        _out("nothing to delete")
    elif args.dry_run:
        _out(f"dry run: would delete {_count(doomed)} ({human_size(freed)}); nothing was deleted")
    else:
        _out(f"deleted {_count(doomed)}, freed {human_size(freed)}")
        if storage.truncate_before_delete:
            _out("Google Drive: files were emptied before deletion, so the trash holds 0 bytes of them; "
                 "empty it at https://drive.google.com/drive/trash to remove them for good")
    return EXIT_OK


@contextlib.contextmanager
def _writer_lease(manager: RunManager, force: bool) -> Iterator[None]:
    """Hold the run's writer lease while deleting, so no training process commits meanwhile.

    A live writer's own retention prunes its run; deleting under it could remove the checkpoint
    it is about to build on. ``--force`` deletes anyway, without taking its lease away.
    """
    try:
        with manager.writing(force=force) as other_writer:
            if not manager.lease.held:
                who = other_writer.describe() if other_writer else "another process"
                print(f"warning: deleting while {who} writes this run", file=sys.stderr)
            yield
    except LeaseHeldError:
        holder = read_lease(manager.storage)
        who = holder.describe() if holder else "another process"
        raise UsageError(
            f"{manager.url} is being written by {who}; its callback prunes it. Stop that training "
            "first, or pass --force to delete anyway"
        ) from None


def _print_plan(infos: Sequence[CheckpointInfo], decisions: Sequence[Decision], ranking: _Ranking) -> None:
    metric = [ranking.monitor] if ranking.monitor else []
    rows = [
        ["keep" if d.keep else "DELETE", i.name, _num(i.epoch), _num(i.step),
         *(_metric(i, m) for m in metric), human_size(i.size), str(i.status), "; ".join(d.reasons)]
        for i, d in zip(infos, decisions, strict=True)
    ]
    headers = ["ACTION", "NAME", "EPOCH", "STEP", *metric, "SIZE", "STATUS", "WHY"]
    _lines(format_table(headers, rows, right={2, 3, *range(4, 5 + len(metric))}))  # numbers and size
    _out("")
    if ranking.monitor is None and _metric_names(infos):
        _out("note: no --monitor given and none recorded: the best checkpoint is not protected")
    elif ranking.monitor:
        _out(f"best by {ranking.monitor} ({ranking.mode}, {ranking.source}) is always kept")


def _confirmed(yes: bool, question: str) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError("refusing to delete without confirmation: not a terminal; "
                         "pass --yes to delete, or --dry-run to preview")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


# ------------------------------------------------------------------ demo


def _cmd_demo(args: argparse.Namespace) -> int:
    from resumable.cli.demo import main as demo_main  # imports Keras: only when asked for

    return demo_main(args.folder)


# ------------------------------------------------------------------ subcommands

# name, aliases, handler, one-line summary, arguments (in `resumable --help` order)
_SUBCOMMANDS: tuple[tuple[str, tuple[str, ...], Callable[[argparse.Namespace], int], str,
                          Callable[[argparse.ArgumentParser], None]], ...] = (
    ("list", ("ls",), _cmd_list, "show every checkpoint with its status", _list_arguments),
    ("inspect", (), _cmd_inspect, "show one checkpoint's manifest", _inspect_arguments),
    ("verify", (), _cmd_verify, "re-read files and check sizes and CRC32C", _verify_arguments),
    ("prune", (), _cmd_prune, "delete checkpoints that no retention rule keeps", _prune_arguments),
    ("demo", (), _cmd_demo, "train a tiny model, interrupt it and resume it", _demo_arguments),
)


# ------------------------------------------------------------------ shared


def _load(url: str | RunStorage, check_files: bool = True) -> tuple[RunStorage, list[CheckpointInfo]]:
    """Open a run folder and list it; a folder that does not exist is an error, an empty one is not."""
    storage = url if isinstance(url, RunStorage) else RunStorage(url)
    infos = storage.list(check_files=check_files)
    if not infos and not storage.exists():  # only an empty listing pays for the second look
        raise RunNotFoundError(f"{storage.url}: not found; check the path and that the folder exists")
    if not infos and _is_one_checkpoint(storage):
        raise UsageError(f"{storage.url} is one checkpoint, not a run folder; pass the folder that holds it")
    return storage, infos


def _is_one_checkpoint(storage: RunStorage) -> bool:
    try:
        return bool(storage.fs.exists(f"{storage.root}/{MANIFEST_NAME}"))
    except Exception:  # a hint only: never fail because of it
        return False


def _select(
    storage: RunStorage, infos: Sequence[CheckpointInfo], epoch: int | None, name: str | None
) -> CheckpointInfo:
    """By name; or the newest good one of an epoch (else its newest of any status); or the latest good."""
    if epoch is not None and epoch < 0:
        raise UsageError(f"--epoch must be >= 0, got {epoch}")
    see = f"`resumable list {storage.url}` shows what is there"
    if name is not None:
        found = [i for i in infos if i.name == name]
        if not found:
            raise CheckpointNotFoundError(f"{storage.url}: no checkpoint named {name!r}; {see}")
        return found[0]
    if epoch is not None:
        of_epoch = [i for i in infos if _epoch_of(storage, i) == epoch]
        good = [i for i in of_epoch if i.ok]
        if not of_epoch:
            raise CheckpointNotFoundError(f"{storage.url}: no checkpoint of epoch {epoch}; {see}")
        return (good or of_epoch)[-1]
    latest = _latest_good(infos)
    if latest is None:
        raise CheckpointNotFoundError(f"{storage.url}: no good checkpoint; {see}")
    return latest


def _epoch_of(storage: RunStorage, info: CheckpointInfo) -> int | None:
    if info.epoch is not None:
        return info.epoch
    parsed = storage.template.parse(info.name)  # a partial checkpoint has only its name
    return parsed[0] if parsed else None


def _latest_good(infos: Sequence[CheckpointInfo]) -> CheckpointInfo | None:
    return next((i for i in reversed(infos) if i.ok), None)


@dataclass(frozen=True)
class _Ranking:
    """Which metric ranks checkpoints, which way, and where that choice came from."""

    monitor: str | None
    mode: str
    source: str

    def best(self, infos: Sequence[CheckpointInfo]) -> CheckpointInfo | None:
        if self.monitor is None:
            return None
        return best_one(infos, self.monitor, self.mode)  # type: ignore[return-value]

    def describe(self, best_one: CheckpointInfo | None) -> str:
        if self.monitor is None:
            return "best: no metric recorded; pass --monitor METRIC"
        if best_one is None:
            return f"best {self.monitor}: none; no good checkpoint recorded it"
        better = "lower" if self.mode == "min" else "higher"
        value = _metric(best_one, self.monitor)
        return (f"best {self.monitor}: {best_one.name} (epoch {best_one.epoch}, {self.monitor}={value}; "
                f"{better} is better, {self.source})")


def _ranking(
    infos: Sequence[CheckpointInfo], monitor: str | None, mode: str | None, recorded: Sequence[str]
) -> _Ranking:
    """The metric to rank by: as asked, else as the callback recorded, else Keras' default val_loss.

    ``recorded``: the metrics the checkpoints logged (`_metric_names`).
    """
    state = _recorded_state(infos)
    if monitor is not None:
        if infos and monitor not in recorded:
            known = ", ".join(recorded) or "none"
            raise UsageError(f"--monitor {monitor}: no checkpoint recorded this metric; recorded: {known}")
        source = "--monitor"
    elif isinstance(state.get("monitor"), str):
        monitor, source = state["monitor"], "recorded by the callback"
        if mode is None and state.get("mode") in ("auto", "min", "max"):
            mode = state["mode"]
    else:
        monitor = next((m for m in ("val_loss", "loss") if m in recorded), None)
        source = "default"
    return _Ranking(monitor, resolve_mode(monitor, mode or "auto"), source)


def _recorded_state(infos: Sequence[CheckpointInfo]) -> dict[str, Any]:
    latest = _latest_good(infos)
    return latest.manifest.state if latest is not None and latest.manifest is not None else {}


def _metric_names(infos: Iterable[CheckpointInfo]) -> list[str]:
    """Every metric any checkpoint recorded, in the order Keras logged them."""
    return list(dict.fromkeys(itertools.chain.from_iterable(map(_metrics_of, infos))))


_metrics_of, _status_of, _size_of = (operator.attrgetter(a) for a in ("metrics", "status", "size"))


def _describe(info: CheckpointInfo) -> str:
    return f"{info.name} (epoch {info.epoch}, step {info.step})"


def _status_text(info: CheckpointInfo) -> str:
    return f"{info.status}: {info.problem}" if info.problem else str(info.status)


def _count(infos: Sequence[CheckpointInfo]) -> str:
    return _plural(len(infos), "checkpoint")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _progress(items: Iterable[T], total: int, what: str, unit: str) -> Iterator[T]:
    """Items with a progress bar on stderr, when it is a terminal and the job is not tiny."""
    if total <= PROGRESS_MIN_ITEMS or not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, total=total, desc=what, unit=unit, file=sys.stderr, leave=False)


# ------------------------------------------------------------------ JSON


def _info_json(info: CheckpointInfo) -> dict[str, Any]:
    manifest = info.manifest
    return {
        "name": info.name,
        "url": info.url,
        "status": str(info.status),
        "problem": info.problem,
        "epoch": info.epoch,
        "step": info.step,
        "batch": manifest.batch if manifest else None,
        "metrics": {k: _json_float(v) for k, v in info.metrics.items()},
        "size": info.size,
        "created": info.created.isoformat() if info.created else None,
        "files_checked": info.checked,
    }


def _manifest_json(info: CheckpointInfo) -> dict[str, Any] | None:
    if info.manifest is None:
        return None
    parsed: dict[str, Any] = json.loads(info.manifest.to_json())
    return parsed


def _best_json(ranking: _Ranking, best_one: CheckpointInfo | None) -> dict[str, Any] | None:
    if best_one is None or ranking.monitor is None:
        return None
    value = best_one.metrics.get(ranking.monitor)
    return {"name": best_one.name, "monitor": ranking.monitor, "mode": ranking.mode,
            "value": _json_float(value) if value is not None else None}


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def _print_json(data: Any) -> None:
    _out(json.dumps(data, indent=2, allow_nan=False))


def _short_json(value: Any, width: int) -> str:
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


# ------------------------------------------------------------------ formatting


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _metric(info: CheckpointInfo, name: str) -> str:
    return _value(info.metrics.get(name))


def _value(value: float | None) -> str:
    return "-" if value is None else _fmt_float(value)


def _fmt_float(value: float) -> str:
    return f"{value:.4g}"


def _out(line: str) -> None:
    print(line, file=sys.stdout)


def _lines(lines: Iterable[str]) -> None:
    lines = list(lines)
    if lines:
        _out("\n".join(lines))  # one write: a listing may be thousands of lines


def _section(title: str, lines: Sequence[str]) -> None:
    _out("")
    _out(title)
    _lines(f"  {line}" for line in lines)


def _error(message: str) -> None:
    # One line, always: a multi-line message from a library would read as several errors.
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
