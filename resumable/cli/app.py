"""The ``resumable`` command: list, inspect, verify and prune the checkpoints of a run folder.

Works the same on a local folder, a Google Drive mount and ``gs://bucket/prefix``. Imports
neither TensorFlow nor Keras (``demo`` does, when it runs). See docs/cli.md.

Example:

```
resumable list gs://my-bucket/runs/exp1
resumable verify /content/drive/MyDrive/runs/exp1
resumable prune ./runs/exp1 --keep-last 3 --keep-best 1 --monitor val_loss --dry-run
```

This module is the front door: the parser, and the one place that turns an error into an
``error: ...`` line and an exit code. Each command lives in its own module (`listing`,
`inspection`, `verify`, `prune`, `demo`) as a plain function of typed arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from resumable.cli import budget, model_files
from resumable.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERIFY_FAILED,
    FilesFolder,
    UsageError,
)
from resumable.cli.inspection import run_inspect
from resumable.cli.listing import run_list
from resumable.cli.prune import run_prune
from resumable.cli.verify import run_verify
from resumable.core.display import printable
from resumable.core.errors import ResumableError

__all__ = [
    "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "EXIT_VERIFY_FAILED", "UsageError", "build_parser", "main",
]

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  verification failed (a checkpoint is corrupt, or none is good)
  2  bad usage or bad input: one "error: ..." line on stderr, nothing deleted
"""


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
        budget.set_budget(getattr(args, "timeout", None))
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


def _error(message: str) -> None:
    # One line, always: a multi-line message from a library would read as several errors.
    print(f"error: {printable(' '.join(message.split()))}", file=sys.stderr)


# ------------------------------------------------------------------ the commands, from parsed arguments


def _list(args: argparse.Namespace) -> int:
    try:
        return run_list(args.url, monitor=args.monitor, mode=args.mode, deep=args.deep, as_json=args.json,
                        local_tier=args.local_tier)
    except FilesFolder as e:  # resumable.ModelCheckpoint's files, not a run
        return model_files.list_files(e.folder, monitor=args.monitor, mode=args.mode, as_json=args.json)


def _inspect(args: argparse.Namespace) -> int:
    try:
        return run_inspect(args.url, epoch=args.epoch, name=args.name, as_json=args.json,
                           local_tier=args.local_tier)
    except FilesFolder as e:
        return model_files.inspect_file(e.folder, epoch=args.epoch, name=args.name, as_json=args.json)


def _verify(args: argparse.Namespace) -> int:
    try:
        return run_verify(args.url, epoch=args.epoch, name=args.name, latest=args.latest, as_json=args.json)
    except FilesFolder as e:
        return model_files.verify_files(e.folder, epoch=args.epoch, name=args.name, latest=args.latest,
                                        as_json=args.json)


def _prune(args: argparse.Namespace) -> int:
    return run_prune(
        args.url, keep_last=args.keep_last, keep_best=args.keep_best, keep_every=args.keep_every,
        monitor=args.monitor, mode=args.mode, dry_run=args.dry_run, yes=args.yes, force=args.force,
        as_json=args.json,
    )


def _demo(args: argparse.Namespace) -> int:
    from resumable.cli.demo import main as demo_main  # imports Keras: only when asked for

    return demo_main(args.folder)


# ------------------------------------------------------------------ the parser


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
    _add_local_tier(list_)
    _add_json(list_)


def _inspect_arguments(inspect: argparse.ArgumentParser) -> None:
    _add_url(inspect)
    _add_selection(inspect)
    _add_local_tier(inspect)
    _add_json(inspect)


def _verify_arguments(verify: argparse.ArgumentParser) -> None:
    _add_url(verify)
    selection = _add_selection(verify)
    selection.add_argument("--latest", action="store_true", help="verify only the latest good checkpoint")
    selection.add_argument("--all", action="store_true", help="verify every checkpoint (the default)")
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


# name, aliases, handler, one-line summary, arguments (in `resumable --help` order)
_SUBCOMMANDS: tuple[tuple[str, tuple[str, ...], Callable[[argparse.Namespace], int], str,
                          Callable[[argparse.ArgumentParser], None]], ...] = (
    ("list", ("ls",), _list, "show every checkpoint with its status", _list_arguments),
    ("inspect", (), _inspect, "show one checkpoint's manifest", _inspect_arguments),
    ("verify", (), _verify, "re-read every file and check its size and CRC32C", _verify_arguments),
    ("prune", (), _prune, "delete checkpoints that no retention rule keeps", _prune_arguments),
    ("demo", (), _demo, "train a tiny model, interrupt it and resume it", _demo_arguments),
)


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


def _add_local_tier(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--local-tier", metavar="FOLDER",
                        help="where the run's local tier lives (LocalTier(folder=...)); default: "
                        "/content/resumable-local on Colab, <tempdir>/resumable-local elsewhere")


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
    _add_timeout(parser)  # every command with --json reads a run folder


def _add_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout", type=float, metavar="SECONDS",
        help=f"give up on a failing or silent storage after this long per operation, retries included "
        f"(default: ${budget.VARIABLE}, else {budget.DEFAULT:.0f})",
    )


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
