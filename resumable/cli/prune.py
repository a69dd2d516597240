"""`resumable prune`: delete the checkpoints that no retention rule keeps, through `RunManager`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

from resumable.cli import adoptable
from resumable.cli.common import EXIT_OK, Ranking, UsageError, choose_ranking, load_run, metric_names
from resumable.cli.output import metric_text, out, out_json, out_lines, plural, progress
from resumable.core.display import format_table, human_size, printable
from resumable.core.errors import LeaseHeldError
from resumable.core.policy import Decision, Retention
from resumable.manager.run_manager import RunManager
from resumable.storage import CheckpointInfo
from resumable.storage.lease import read_lease


def run_prune(
    url: str, *,
    keep_last: int | None = None, keep_best: int | None = None, keep_every: int | None = None,
    monitor: str | None = None, mode: str | None = None,
    dry_run: bool = False, yes: bool = False, force: bool = False, as_json: bool = False,
) -> int:
    """Show the plan, then (unless ``dry_run``, and once confirmed) delete; return the exit code.

    The newest good checkpoint and the best one by the ranking metric are always kept. With no
    ``keep_*`` only unfinished or corrupt checkpoints older than the newest good one go;
    ``keep_best`` or ``keep_every`` alone keep what they name plus the newest good checkpoint.
    """
    for option, value in (("keep-last", keep_last), ("keep-best", keep_best), ("keep-every", keep_every)):
        if value is not None and value < 1:
            raise UsageError(f"--{option} must be >= 1, got {value}")
    manager = RunManager(url)
    storage, infos = load_run(manager.storage)
    recorded = metric_names(infos)
    ranking = choose_ranking(infos, monitor, mode, recorded)
    if keep_best and ranking.monitor is None:
        raise UsageError("--keep-best needs --monitor METRIC: no checkpoint recorded a metric to rank by")
    retention = Retention(
        # --keep-best or --keep-every alone mean "only those (and the latest)", not "and all the rest"
        keep_last=keep_last or (1 if keep_best or keep_every else None),
        keep_best=keep_best or 0,
        monitor=ranking.monitor,
        mode=ranking.mode,
        keep_every=keep_every,
    )
    steps = adoptable.orbax_steps(infos, storage)  # Keras wrote them: never planned, never deleted
    infos = [i for i in infos if not adoptable.is_orbax_step(i, storage)]
    pruning = manager.plan_pruning(retention, checkpoints=infos)
    decisions, doomed, freed = pruning.decisions, pruning.doomed, pruning.freed
    if doomed and not dry_run:  # refuse before showing a plan that will not be carried out
        if not yes and not sys.stdin.isatty():
            raise UsageError("refusing to delete without confirmation: not a terminal; "
                             "pass --yes to delete, or --dry-run to preview")
        holder = None if force else manager.blocking_writer()
        if holder is not None:
            raise _writer_busy(manager, holder.describe())
    if not as_json and infos:
        _print_plan(infos, decisions, ranking)
    if not as_json and steps:
        out(f"never deleted: {adoptable.steps_line(steps)}")
    if doomed and not dry_run:
        if not _confirmed(yes, f"delete {_count(doomed)} ({human_size(freed)}) from {storage.url}?"):
            out("aborted: nothing deleted")
            return EXIT_OK
        with _writer_lease(manager, force):
            manager.writer.prune(doomed, progress=lambda some: progress(some, len(some), "deleting",
                                                                        unit="ckpt"))
    if as_json:
        out_json({
            "url": storage.url,
            "dry_run": dry_run,
            "monitor": ranking.monitor,
            "deleted": [] if dry_run else [i.name for i in doomed],
            "kept": [d.name for d in decisions if d.keep],
            "adoptable": [{"name": i.name, "kind": adoptable.ORBAX_STEP, "size": i.size} for i in steps],
            "freed_bytes": 0 if dry_run else freed,
            "decisions": [
                {"name": d.name, "keep": d.keep, "reasons": d.reasons, "status": str(i.status),
                 "size": i.size}
                for i, d in zip(infos, decisions, strict=True)
            ],
        })
        return EXIT_OK
    if not doomed:
        out("nothing to delete")
    elif dry_run:
        out(f"dry run: would delete {_count(doomed)} ({human_size(freed)}); nothing was deleted")
    else:
        out(f"deleted {_count(doomed)}, freed {human_size(freed)}")
        if storage.truncate_before_delete:
            out("Google Drive: files were emptied before deletion, so the trash holds 0 bytes of them; "
                "empty it at https://drive.google.com/drive/trash to remove them for good")
    return EXIT_OK


@contextlib.contextmanager
def _writer_lease(manager: RunManager, force: bool) -> Iterator[None]:
    """Hold the run's writer lease while deleting, so no training process commits meanwhile.

    A live writer's own retention prunes its run; deleting under it could remove the checkpoint
    it is about to build on. ``--force`` deletes anyway, without taking its lease away.
    """
    try:
        with manager.writer.writing(force=force) as other_writer:
            if not manager.writer.lease.held:
                who = other_writer.describe() if other_writer else "another process"
                print(printable(f"warning: deleting while {who} writes this run"), file=sys.stderr)
            yield
    except LeaseHeldError:
        holder = read_lease(manager.storage)
        raise _writer_busy(manager, holder.describe() if holder else "another process") from None


def _writer_busy(manager: RunManager, who: str) -> UsageError:
    return UsageError(
        f"{manager.storage.url} is being written by {who}; its callback prunes it. Stop that training "
        "first, or pass --force to delete anyway"
    )


def _print_plan(infos: Sequence[CheckpointInfo], decisions: Sequence[Decision], ranking: Ranking) -> None:
    metric = [ranking.monitor] if ranking.monitor else []
    rows = [
        ["keep" if d.keep else "DELETE", i.name, _num(i.epoch), _num(i.step),
         *(metric_text(i, m) for m in metric), human_size(i.size), str(i.status), "; ".join(d.reasons)]
        for i, d in zip(infos, decisions, strict=True)
    ]
    headers = ["ACTION", "NAME", "EPOCH", "STEP", *metric, "SIZE", "STATUS", "WHY"]
    out_lines(format_table(headers, rows, right={2, 3, *range(4, 5 + len(metric))}))  # numbers and size
    out("")
    if ranking.monitor is None and metric_names(infos):
        out("note: no --monitor given and none recorded: the best checkpoint is not protected")
    elif ranking.monitor:
        out(f"best by {ranking.monitor} ({ranking.mode}, {ranking.source}) is always kept")


def _confirmed(yes: bool, question: str) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError("refusing to delete without confirmation: not a terminal; "
                         "pass --yes to delete, or --dry-run to preview")
    sys.stderr.write(f"{printable(question)} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _count(infos: Sequence[CheckpointInfo]) -> str:
    return plural(len(infos), "checkpoint")


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)
