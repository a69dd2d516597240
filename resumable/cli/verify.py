"""`resumable verify`: re-read checkpoints' files and check their sizes and CRC32C against the manifest."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

from resumable.cli import adoptable
from resumable.cli.common import EXIT_OK, EXIT_VERIFY_FAILED, latest_good, load_run, select_checkpoint
from resumable.cli.output import out, out_json, out_lines, plural, problem_lines, progress
from resumable.core.display import human_size
from resumable.core.errors import CheckpointNotFoundError
from resumable.storage import CheckpointInfo, RunStorage, Status

VERIFY_WORKERS = 8  # checkpoints re-read at once; reads are I/O bound on GCS and Drive


def run_verify(
    url: str, *, epoch: int | None = None, name: str | None = None, latest: bool = False,
    as_json: bool = False,
) -> int:
    """Verify every checkpoint (the default), or the one picked by ``name`` or ``epoch``, or
    with ``latest`` only the newest committed one, damaged or not (the one `resume()` tries first).

    Returns:
        0 when every checked checkpoint matches its manifest, 1 when one is corrupt or none is good.
    """
    storage, infos = load_run(url)
    narrowed = latest or epoch is not None or name is not None
    if epoch is not None or name is not None:
        targets = [select_checkpoint(storage, infos, epoch, name)]
    elif latest_good(infos) is None:
        return _no_good_checkpoint(storage, infos, as_json)
    elif latest:
        targets = [newest_committed(infos)]  # type: ignore[list-item]  # one exists: a good one does
    else:
        targets = list(infos)
    results = _verify_all(storage, targets)
    failed = [n for n, (status, _) in results.items() if status == "corrupt"]
    if as_json:
        out_json({
            "url": storage.url,
            "ok": not failed,
            "checkpoints": [{"name": n, "status": s, "problems": p} for n, (s, p) in results.items()],
        })
        return EXIT_VERIFY_FAILED if failed else EXIT_OK
    for info in targets:
        status, problems = results[info.name]
        files = plural(len(info.manifest.files), "file") if info.manifest else ""
        detail = f"{files}, {human_size(info.size)}" if files else ""
        out(f"{status.upper() if status == 'corrupt' else status:8} {info.name}  {detail}".rstrip())
        out_lines(f"  {problem}" for problem in problems)
    checked = len(results) - sum(1 for s, _ in results.values() if s in ("partial", adoptable.ADOPTABLE))
    if narrowed:
        out_lines(_unchecked_leftovers(storage.url, infos, targets))
    if failed:
        out(f"verification failed: {len(failed)} of {checked} checkpoints corrupt")
        if narrowed:
            out(_instead(storage.url, infos, failed))
        return EXIT_VERIFY_FAILED
    out(f"verified {plural(checked, 'checkpoint')}: all files match their manifests")
    return EXIT_OK


def newest_committed(infos: Sequence[CheckpointInfo]) -> CheckpointInfo | None:
    """The newest checkpoint with a manifest, good or damaged: the one resume() tries first.
    Partial folders (no manifest: a save under way or interrupted) are never tried."""
    return next((i for i in reversed(infos) if i.status is not Status.PARTIAL), None)


def _instead(url: str, infos: Sequence[CheckpointInfo], failed: Sequence[str]) -> str:
    """What resume() does about the damaged checkpoints just found."""
    older = next((i for i in reversed(infos) if i.ok and i.name not in failed), None)
    fallback = (f"resume() skips it and uses {older.name} (epoch {older.epoch}), the newest one listed good"
                if older else "resume() skips it; no other checkpoint is listed good")
    return f"{fallback}; `resumable verify {url}` checks all"


def _unchecked_leftovers(url: str, infos: Sequence[CheckpointInfo],
                         targets: Sequence[CheckpointInfo]) -> list[str]:
    """A note on partial folders the narrowed check left out: interrupted saves, never restored."""
    shown = {info.name for info in targets}
    partial = [i.name for i in infos if i.status is Status.PARTIAL and i.name not in shown
               and not adoptable.is_orbax_step(i)]
    if not partial:
        return []
    return [f"note: {plural(len(partial), 'partial folder')} ({', '.join(partial[:5])}"
            f"{', ...' if len(partial) > 5 else ''}): interrupted saves, never restored; "
            f"`resumable prune {url}` removes those older than the latest good"]


def _verify_all(storage: RunStorage, targets: Sequence[CheckpointInfo]) -> dict[str, tuple[str, list[str]]]:
    """``{name: (status, problems)}`` in the order of ``targets``; partial ones are not read."""

    def check(info: CheckpointInfo) -> tuple[str, list[str]]:
        if info.status is Status.PARTIAL:
            return adoptable.status_text(info), [f"not verified: {adoptable.problem_text(info)}"]
        problems = storage.verify(info)
        return ("corrupt" if problems else "ok"), problems

    results: dict[str, tuple[str, list[str]]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=VERIFY_WORKERS) as pool:
        futures = {pool.submit(check, info): info.name for info in targets}
        done = concurrent.futures.as_completed(futures)
        for future in progress(done, len(futures), "verifying", unit="ckpt"):
            results[futures[future]] = future.result()
    return {info.name: results[info.name] for info in targets}


def _no_good_checkpoint(storage: RunStorage, infos: Sequence[CheckpointInfo], as_json: bool) -> int:
    """A folder without a good checkpoint of resumable's: failed, unless it holds only Keras
    OrbaxCheckpoint steps (nothing damaged), which resume() adopts: nothing to verify then."""
    if not infos:
        raise CheckpointNotFoundError(f"{storage.url}: no checkpoints to verify")
    steps = adoptable.orbax_steps(infos, storage)
    adopted = bool(steps) and all(i.status is Status.PARTIAL for i in infos)  # no corrupt one of ours
    if as_json:
        out_json({
            "url": storage.url,
            "ok": adopted,
            "checkpoints": [
                {"name": i.name, "status": adoptable.status_text(i), "problems": [adoptable.problem_text(i)]}
                for i in infos
            ],
        })
    else:
        out_lines(problem_lines(infos))
        if adopted:
            out(f"nothing to verify: {storage.url} holds no checkpoint of resumable's, only "
                f"{adoptable.steps_line(steps)}")
        elif steps:
            out(f"verification failed: no good checkpoint of resumable's in {storage.url}; "
                f"{adoptable.steps_line(steps)}")
        else:
            out(f"verification failed: no good checkpoint in {storage.url}; resume() would start afresh")
    return EXIT_OK if adopted else EXIT_VERIFY_FAILED
