"""`resumable list`: every checkpoint of a run with its status, the latest good one and the best."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from typing import Any

from resumable.cli import adoptable, tiers
from resumable.cli.common import EXIT_OK, Ranking, choose_ranking, latest_good, load_run, metric_names
from resumable.cli.output import info_json, json_float, out, out_json, out_lines, plural, problem_lines
from resumable.core.display import format_columns, human_size, printable, utc_times
from resumable.core.errors import CheckpointNotFoundError
from resumable.storage import CheckpointInfo, RunStorage, Status


def run_list(
    url: str, *, monitor: str | None = None, mode: str | None = None, deep: bool = False,
    as_json: bool = False, local_tier: str | None = None,
) -> int:
    """Print the run's checkpoints as a table (or JSON); return the exit code.

    Args:
        url: The run folder.
        monitor: Metric to show and to rank the best checkpoint by; None: as recorded, else a default.
        mode: ``"auto"``, ``"min"`` or ``"max"``; None: as recorded, else auto.
        deep: Check every file against its manifest instead of reading the run index.
        as_json: Print JSON for scripts instead of a table.
        local_tier: Where the run's local tier (#55) lives; None: the default place.
    """
    storage, infos = load_run(url, check_files=deep)
    infos = confirm_latest(storage, infos)
    recorded = metric_names(infos)
    ranking = choose_ranking(infos, monitor, mode, recorded)
    latest = latest_good(infos)
    best = ranking.best(infos)
    local, local_infos = tiers.local_checkpoints(storage, local_tier, check_files=deep)
    if as_json:
        out_json({
            "url": storage.url,
            "checkpoints": [{**info_json(i), "tier": tiers.DURABLE} for i in infos]
            + [{**info_json(i), "tier": tiers.LOCAL} for i in local_infos],
            "latest": latest.name if latest else None,
            "best": _best_json(ranking, best),
            "local_tier": local.url if local is not None else None,
        })
        return EXIT_OK
    durable_count = len(infos)
    infos = infos + local_infos  # the durable tier's, then the local tier's (latest and best: durable)
    if not infos:
        out(f"no checkpoints in {storage.url}")
        return EXIT_OK
    metrics = [monitor] if monitor else recorded
    notes = {id(latest): "latest", id(best): "best"}
    if latest is best:
        notes = {id(latest): "latest, best"}
    # Built a column at a time, one plain pass each: a run may hold thousands of checkpoints.
    # Indexed infos answer from their index row without building manifests or file records.
    epochs = [i.epoch for i in infos]
    steps = [i.step for i in infos]
    logged = [i.metrics for i in infos]
    columns = [["NAME", *map(printable, [i.name for i in infos])]]  # names and metrics come from the run
    if local_infos:
        columns += [["TIER", *[tiers.DURABLE] * durable_count, *[tiers.LOCAL] * len(local_infos)]]
    epoch_column = len(columns)
    columns += [
        ["EPOCH", *["-" if e is None else str(e) for e in epochs]],
        ["STEP", *["-" if s is None else str(s) for s in steps]]]
    columns += [[printable(name), *_metric_cells(logged, name)] for name in metrics]
    sizes = [i.size for i in infos]
    shown = {size: human_size(size) for size in set(sizes)}  # checkpoints of one model: few sizes
    columns += [["SIZE", *[shown[size] for size in sizes]],
                ["CREATED", *utc_times([i.created_iso for i in infos])],
                ["STATUS", *map(adoptable.status_text, infos)],
                ["NOTE", *[notes.get(id(i), "") for i in infos]]]
    # numbers and size: EPOCH, STEP, the metrics, SIZE
    right = {epoch_column, epoch_column + 1, *range(epoch_column + 2, epoch_column + 3 + len(metrics))}
    out_lines(format_columns(columns, right=right))
    out("")
    out_lines(problem_lines(infos))
    durable = infos[:durable_count]
    out(_summary(durable))
    out(f"latest good: {_describe(latest)}" if latest else _none_good(durable))
    out(ranking.describe(best))
    if local is not None:
        out(tiers.newer_line(local, local_infos, latest))
    if any(not i.ok for i in infos if not adoptable.is_orbax_step(i)):
        out(f"`resumable prune {storage.url}` removes unfinished or corrupt ones older than the latest good")
    if not all(i.checked for i in infos):
        out("statuses from the run index; --deep checks every file's size, `resumable verify` re-reads them")
    return EXIT_OK


def confirm_latest(storage: RunStorage, infos: list[CheckpointInfo]) -> list[CheckpointInfo]:
    """``infos`` with the checkpoint to be called the latest good checked from its own files.

    A quick listing takes statuses from the run index, written at commit time: a checkpoint
    damaged since would still read "ok" there. So the newest one the index calls good is
    checked afresh (its folder listed, its manifest read: file sizes, and CRC32Cs where the
    listing carries them, as GCS'), and the next older one while it fails: `list` never calls a
    damaged checkpoint the latest good.
    """
    while (latest := latest_good(infos)) is not None and not latest.checked:
        try:
            found = [storage.get(latest.name)]
        except CheckpointNotFoundError:  # deleted since the index was read
            found = []
        at = infos.index(latest)
        infos = [*infos[:at], *found, *infos[at + 1:]]
    return infos


def _none_good(infos: Sequence[CheckpointInfo]) -> str:
    """The latest-good line of a folder without one: Orbax steps are adopted, not a fresh start."""
    if adoptable.orbax_steps(infos):
        return "latest good: none of resumable's; resume() adopts the newest good Keras OrbaxCheckpoint step"
    return "latest good: none; resume() would start afresh"


def _metric_cells(logged: Sequence[dict[str, float]], name: str) -> list[str]:
    values = [row.get(name) for row in logged]
    return ["-" if value is None else f"{value:.4g}" for value in values]  # as `metric_text`, inlined


def _summary(infos: Sequence[CheckpointInfo]) -> str:
    counts = Counter(map(_status_of, infos))  # `map`, not a generator: thousands of checkpoints
    steps = len(adoptable.orbax_steps(infos)) if counts[Status.PARTIAL] else 0
    counts[Status.PARTIAL] -= steps
    detail = ", ".join(f"{counts[status]} {status}" for status in Status if counts[status])
    total = human_size(sum(map(_size_of, infos)))
    own = f"{plural(len(infos) - steps, 'checkpoint')}" + (f" ({detail})" if detail else "")
    return own + (f" and {plural(steps, adoptable.ORBAX_STEP)}" if steps else "") + f", {total}"


_status_of, _size_of = operator.attrgetter("status"), operator.attrgetter("size")


def _describe(info: CheckpointInfo) -> str:
    return f"{info.name} (epoch {info.epoch}, step {info.step})"


def _best_json(ranking: Ranking, best: CheckpointInfo | None) -> dict[str, Any] | None:
    if best is None or ranking.monitor is None:
        return None
    value = best.metrics.get(ranking.monitor)
    return {"name": best.name, "monitor": ranking.monitor, "mode": ranking.mode,
            "value": json_float(value) if value is not None else None}
