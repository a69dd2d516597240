"""`list`, `inspect` and `verify` of a folder of model files (resumable.ModelCheckpoint, save_model).

A folder such as ``ckpt/`` holding ``weights-03-0.41.hdf5`` and its hidden checksum record
``.weights-03-0.41.hdf5.resumable.json`` is no run folder: `common.load_run` finds no
checkpoint in it and raises `common.FilesFolder`, and the command runs here instead, on the files.
Same exit codes, same table and JSON conventions as for a run's checkpoints.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from resumable.cli import adoptable
from resumable.cli.common import EXIT_OK, EXIT_VERIFY_FAILED, UsageError
from resumable.cli.output import (
    fmt_float,
    json_float,
    out,
    out_json,
    out_lines,
    out_section,
    plural,
    progress,
)
from resumable.core.display import format_columns, format_table, human_size, printable, utc_time, utc_times
from resumable.core.errors import CheckpointNotFoundError
from resumable.core.policy import best_one, resolve_mode
from resumable.storage.file_folder import OK, UNRECORDED, FileFolder, ModelFile

KIND = "model files"


# ------------------------------------------------------------------ list


def list_files(folder: FileFolder, *, monitor: str | None = None, mode: str | None = None,
               as_json: bool = False) -> int:
    """`resumable list` of a folder of model files."""
    files = folder.files
    adopted = adoptable.file_epochs(folder)  # Keras' files (no record): the epoch resume() reads
    asked = monitor
    monitor, mode, source = _ranking(files, monitor, mode)
    latest = _latest(files)
    best = _best(files, monitor, mode)
    if as_json:
        out_json({"url": folder.url, "kind": KIND, "files": [_file_json(f, adopted) for f in files],
                  "latest": latest.name if latest else None,
                  "best": None if best is None or monitor is None else {
                      "name": best.name, "monitor": monitor, "mode": mode,
                      "value": json_float(best.metrics[monitor])},
                  "leftovers": folder.leftovers})
        return EXIT_OK
    if not files:
        out(f"no model files in {folder.url}")
        out_lines(_leftover_lines(folder))
        return EXIT_OK
    metrics = [asked] if asked else _metric_names(files)
    notes = {id(latest): "latest", id(best): "best"}
    if latest is best:
        notes = {id(latest): "latest, best"}
    columns = [["NAME", *[f.name for f in files]],
               ["EPOCH", *["-" if (e := _epoch(f, adopted)) is None else str(e) for f in files]],
               ["BATCH", *[str(f.batch) if f.batch else "-" for f in files]],
               ["STEP", *["-" if f.step is None else str(f.step) for f in files]]]
    columns += [[name, *["-" if name not in f.metrics else fmt_float(f.metrics[name]) for f in files]]
                for name in metrics]
    columns += [["SIZE", *[human_size(f.size) for f in files]],
                ["SAVED", *utc_times([f.created_iso for f in files])],
                ["STATUS", *[f.status for f in files]],
                ["NOTE", *[notes.get(id(f), "") for f in files]]]
    out_lines(format_columns(columns, right={1, 2, 3, *range(4, 5 + len(metrics))}))
    out("")
    out_lines(f"{f.name}: {f.status}: {_problem(f, adopted)}" for f in files if not f.ok)
    out_lines(_leftover_lines(folder))
    counts = Counter(f.status for f in files)
    detail = ", ".join(f"{counts[s]} {s}" for s in (OK, UNRECORDED, "corrupt") if counts[s])
    out(f"{plural(len(files), 'model file')} ({detail}), {human_size(sum(f.size for f in files))}")
    out(f"latest: {_describe(latest)}" if latest else "latest: none with a good checksum record")
    newest = adoptable.newest_adoptable(folder, adopted)
    if newest is not None:
        out(f"resume() on this folder adopts the newest that loads of the files Keras wrote: {newest}")
    if monitor is None:
        out("best: no metric recorded; pass --monitor METRIC")
    elif best is None:
        out(f"best {monitor}: none; no good file saved at an epoch's end recorded it")
    else:
        better = "lower" if mode == "min" else "higher"
        out(f"best {monitor}: {best.name} (epoch {best.epoch}, {monitor}={fmt_float(best.metrics[monitor])}; "
            f"{better} is better, {source})")
    out(f"load one with resumable.load_model(\"{folder.url}/NAME\"), which checks it against its record")
    return EXIT_OK


# ------------------------------------------------------------------ inspect


def inspect_file(folder: FileFolder, *, epoch: int | None = None, name: str | None = None,
                 as_json: bool = False) -> int:
    """`resumable inspect` of one model file: its record, metrics and what the listing says."""
    file = _select(folder, epoch, name)
    if as_json:
        body = file.record.to_json().decode() if file.record is not None else None
        adopted = adoptable.file_epochs(folder)
        out_json({**_file_json(file, adopted), "record": json.loads(body) if body else None})
        return EXIT_OK
    details = file.details
    problem = _problem(file, adoptable.file_epochs(folder)) if file.status == UNRECORDED else file.problem
    fields = [("file", file.name), ("url", file.url),
              ("status", f"{file.status}: {problem}" if problem else file.status)]
    if file.record is not None:
        batch = details.get("batch")
        fields += [
            ("epoch", str(file.epoch)),
            ("batch", f"{batch} (mid-epoch save)" if batch else "- (end of epoch)"),
            ("step", str(file.step)),
            ("saved", utc_time(file.created_iso)),
            ("size", f"{human_size(file.record.size)} ({file.record.size} bytes)"),
            ("crc32c", file.record.crc32c),
            ("content", "weights" if details.get("weights_only") else "the whole model"),
            ("monitor", str(details.get("monitor", "-")) + _best_so_far(details.get("best"))),
            ("keras", str(details.get("keras", "-"))),
        ]
    out_lines(format_table(["", ""], fields, header=False))
    if file.metrics:
        out_section("metrics", format_table(["", ""], [(k, fmt_float(v)) for k, v in file.metrics.items()],
                                            header=False))
    return EXIT_OK


# ------------------------------------------------------------------ verify


def verify_files(folder: FileFolder, *, epoch: int | None = None, name: str | None = None,
                 latest: bool = False, as_json: bool = False) -> int:
    """`resumable verify` of model files: re-read each and compare it with its record.

    Exit 1 when one is corrupt, or when no file has a good record; files without a record are
    reported, not counted as failures (Keras wrote them; nothing to check them against).
    """
    if epoch is not None or name is not None:
        targets = [_select(folder, epoch, name)]
    elif latest:
        newest = _latest(folder.files)
        targets = [newest] if newest is not None else []
    else:
        targets = list(folder.files)
    results: dict[str, tuple[str, list[str]]] = {}
    adopted = adoptable.file_epochs(folder)
    for file in progress(targets, len(targets), "verifying", unit="file"):
        if file.status == UNRECORDED:
            results[file.name] = (UNRECORDED, [f"not verified: {_problem(file, adopted)}"])
        elif file.record is None:  # the record itself is damaged
            results[file.name] = ("corrupt", [file.problem])
        else:
            problems = file.verify()
            results[file.name] = ("corrupt" if problems else OK, problems)
    failed = [n for n, (status, _) in results.items() if status == "corrupt"]
    good = [n for n, (status, _) in results.items() if status == OK]
    # Files Keras wrote have nothing to check against: not a failure when resume() adopts one
    keras_newest = adoptable.newest_adoptable(folder, adopted)
    bad = bool(failed) or (not good and keras_newest is None)
    if as_json:
        out_json({"url": folder.url, "kind": KIND, "ok": not bad,
                  "files": [{"name": n, "status": s, "problems": p} for n, (s, p) in results.items()]})
        return EXIT_VERIFY_FAILED if bad else EXIT_OK
    for file in targets:
        status, problems = results[file.name]
        shown = status.upper() if status == "corrupt" else status
        out(f"{shown:10} {file.name}  {human_size(file.size)}")
        out_lines(f"  {problem}" for problem in problems)
    if failed:
        out(f"verification failed: {len(failed)} of {plural(len(results), 'file')} corrupt")
        return EXIT_VERIFY_FAILED
    if not good and keras_newest is None:
        out(f"verification failed: no file in {folder.url} has a checksum record to check it against")
        return EXIT_VERIFY_FAILED
    if not good:
        out(f"nothing to verify: no file in {folder.url} has a checksum record (Keras wrote them); "
            f"resume() adopts the newest that loads: {keras_newest}")
        return EXIT_OK
    out(f"verified {plural(len(good), 'file')}: all match their checksum records")
    return EXIT_OK


# ------------------------------------------------------------------ shared


def _select(folder: FileFolder, epoch: int | None, name: str | None) -> ModelFile:
    see = f"`resumable list {folder.url}` shows what is there"
    files = folder.files
    if name is not None:
        found = [f for f in files if f.name == name]
        if not found:
            raise CheckpointNotFoundError(f"{folder.url}: no model file named {name!r}; {see}")
        return found[0]
    if epoch is not None:
        if epoch < 0:
            raise UsageError(f"--epoch must be >= 0, got {epoch}")
        of_epoch = [f for f in files if f.epoch == epoch]
        if not of_epoch:
            raise CheckpointNotFoundError(f"{folder.url}: no model file of epoch {epoch}; {see}")
        return ([f for f in of_epoch if f.ok] or of_epoch)[-1]
    newest = _latest(files)
    if newest is None:
        raise CheckpointNotFoundError(f"{folder.url}: no model file with a good checksum record; {see}")
    return newest


def _latest(files: Sequence[ModelFile]) -> ModelFile | None:
    return next((f for f in reversed(files) if f.ok), None)


def _metric_names(files: Sequence[ModelFile]) -> list[str]:
    return list(dict.fromkeys(name for f in files for name in f.metrics))


def _ranking(files: Sequence[ModelFile], monitor: str | None, mode: str | None
             ) -> tuple[str | None, str, str]:
    """(monitor, 'min' or 'max', where that came from): asked, else as the newest record says."""
    recorded = _latest(files)
    details = recorded.details if recorded is not None else {}
    if monitor is not None:
        names = _metric_names(files)
        if files and monitor not in names:
            raise UsageError(f"--monitor {monitor}: no model file recorded this metric; recorded: "
                             f"{', '.join(names) or 'none'}")
        source = "--monitor"
    elif isinstance(details.get("monitor"), str):
        monitor, source = details["monitor"], "recorded by the callback"
        if mode is None and details.get("mode") in ("min", "max"):
            mode = details["mode"]
    else:
        return None, "min", ""
    return monitor, resolve_mode(monitor, mode or "auto"), source


def _best(files: Sequence[ModelFile], monitor: str | None, mode: str) -> ModelFile | None:
    if monitor is None:
        return None
    found = best_one(files, monitor, mode)
    return found if isinstance(found, ModelFile) else None


def _best_so_far(best: Any) -> str:
    return f" (best so far {fmt_float(best)})" if isinstance(best, (int, float)) else ""


def _describe(file: ModelFile) -> str:
    where = f"epoch {file.epoch}" + (f", batch {file.batch}" if file.batch else "")
    return f"{file.name} ({where}, step {file.step})"


def _leftover_lines(folder: FileFolder) -> list[str]:
    if not folder.leftovers:
        return []
    count = len(folder.leftovers)
    shown = ", ".join(printable(n) for n in folder.leftovers[:5]) + (", ..." if count > 5 else "")
    what = "a temporary copy left by an interrupted write" if count == 1 else (
        f"{count} temporary copies left by interrupted writes")
    return [f"note: {what} ({shown}): never loaded; the next save of that file removes it"]


def _epoch(file: ModelFile, adopted: dict[str, int | None]) -> int | None:
    """The record's epoch; for a file Keras wrote, the one resume() reads (name or backup metadata)."""
    return adopted.get(file.name) if file.status == UNRECORDED else file.epoch


def _problem(file: ModelFile, adopted: dict[str, int | None]) -> str:
    return adoptable.file_problem(file, adopted.get(file.name)) if file.status == UNRECORDED else file.problem


def _file_json(file: ModelFile, adopted: dict[str, int | None]) -> dict[str, Any]:
    return {"name": file.name, "url": file.url, "status": file.status, "kind": adoptable.file_kind(file),
            "problem": _problem(file, adopted), "epoch": _epoch(file, adopted), "batch": file.batch or None,
            "step": file.step,
            "metrics": {k: json_float(v) for k, v in file.metrics.items()}, "size": file.size,
            "created": file.created_iso,
            "crc32c": file.record.crc32c if file.record is not None else None}
