"""Runtime deaths on a Drive-like folder (tests/drive_death.py), 240 random trials.

Each trial resumes, with the real code, from a run folder in which the files changed since
the last flush ended up in random states. Resuming must load the newest checkpoint whose
files all survived, byte for byte: never a damaged one, never an older one than that.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
from drive_death import MANIFEST, Tree, die, files_of, intact, snapshot, write_tree

from resumable import RunStorage
from resumable.cli.app import main
from resumable.core.manifest import Manifest
from resumable.core.policy import Retention
from resumable.manager.run_manager import RunManager

COMMITS = 8
TRIALS = 240


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Tree], dict[str, Tree]]:
    """Snapshots of a real run folder after each commit (keep_last=3), and each checkpoint's files."""
    base = tmp_path_factory.mktemp("drive")
    root = base / "run"
    manager = RunManager(str(root), staging_dir=base / "staging", async_upload=False,
                         retention=Retention(keep_last=3))
    manager.writer.acquire()
    rng = random.Random(2026)
    snapshots: list[Tree] = [{}]
    committed: dict[str, Tree] = {}
    for epoch in range(1, COMMITS + 1):
        name = f"ckpt-{epoch:06d}"
        staged = manager.writer.stage(name)
        (staged / "assets").mkdir(parents=True)
        (staged / "model.keras").write_bytes(rng.randbytes(rng.randrange(2_000, 20_000)))
        (staged / "state.json").write_bytes(b'{"epoch": %d}' % epoch)
        (staged / "assets" / "vocab.txt").write_bytes(rng.randbytes(100))
        manifest = Manifest(epoch=epoch, step=epoch * 10, metrics={"loss": 1 / epoch})
        manager.writer.submit(staged, name, manifest)
        snapshots.append(snapshot(root))
        committed[name] = files_of(snapshots[-1], name)
        assert MANIFEST in committed[name]
    manager.release()
    return snapshots, committed


@pytest.mark.parametrize("batch", range(8))
def test_resume_after_a_death_loads_the_newest_intact_checkpoint(
        history: tuple[list[Tree], dict[str, Tree]], tmp_path: Path, batch: int,
        caplog: pytest.LogCaptureFixture) -> None:
    snapshots, committed = history
    for trial in range(batch * TRIALS // 8, (batch + 1) * TRIALS // 8):
        rng = random.Random(trial)
        died_in = rng.randint(1, COMMITS)  # the commit the runtime died in
        flushed = rng.randint(max(0, died_in - 3), died_in - 1)  # the last commit flushed before
        tree, fates = die(snapshots[flushed], snapshots[died_in], rng)
        root = tmp_path / f"trial-{trial}"
        write_tree(root / "run", tree)
        expected = intact(tree, committed)
        context = f"trial {trial}: died in commit {died_in}, flushed after {flushed}; {fates}"

        reader = RunManager(str(root / "run"), staging_dir=root / "cache")
        with caplog.at_level(logging.WARNING, logger="resumable"):
            found = reader.fetch_newest(warn=lambda message: None)
        if not expected:
            assert found is None, context
            continue
        assert found is not None, context
        info, local = found
        assert info.name == expected[-1], context
        assert snapshot(local) == committed[info.name], context  # what it loads is what was committed

        listed = {c.name: c.ok for c in RunStorage(str(root / "run")).list()}
        assert all(listed.get(name) for name in expected), context  # every intact one is good
        assert not any(ok for name, ok in listed.items() if name not in expected), context


def test_prune_after_a_death_keeps_the_newest_intact_checkpoint(
        history: tuple[list[Tree], dict[str, Tree]], tmp_path: Path) -> None:
    """Retention after a death never counts a damaged checkpoint as the latest good one."""
    snapshots, committed = history
    tried = 0
    for trial in range(TRIALS):
        rng = random.Random(10_000 + trial)
        died_in = rng.randint(2, COMMITS)
        tree, fates = die(snapshots[died_in - 1], snapshots[died_in], rng)
        expected = intact(tree, committed)
        if not expected or expected[-1] == f"ckpt-{died_in:06d}":
            continue  # only deaths that damaged the newest checkpoint
        root = tmp_path / f"trial-{trial}"
        write_tree(root, tree)
        assert main(["prune", str(root), "--keep-last", "1", "--yes"]) == 0
        assert expected[-1] in [c.name for c in RunStorage(str(root)).list() if c.ok], fates
        tried += 1
        if tried == 20:
            break
    assert tried == 20


def test_the_trials_do_damage_the_newest_checkpoints(history: tuple[list[Tree], dict[str, Tree]]) -> None:
    """The trials above are worth something only if many deaths leave the newest commit damaged."""
    snapshots, committed = history
    fell_back = 0
    for trial in range(TRIALS):
        rng = random.Random(trial)
        died_in = rng.randint(1, COMMITS)
        flushed = rng.randint(max(0, died_in - 3), died_in - 1)
        tree, _ = die(snapshots[flushed], snapshots[died_in], rng)
        expected = intact(tree, committed)
        fell_back += not expected or expected[-1] != f"ckpt-{died_in:06d}"
    assert TRIALS * 0.3 < fell_back < TRIALS * 0.95
