"""CommittedCopy: the local copy of the last committed checkpoint, one at a time, until the next save."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from resumable.manager.committed_copy import CommittedCopy


def staged(root: Path, name: str) -> Path:
    folder = root / "staging" / name
    folder.mkdir(parents=True)
    (folder / "model.keras").write_bytes(name.encode())
    return folder


def test_keeps_the_newest_copy_alone_until_dropped(tmp_path: Path) -> None:
    copy = CommittedCopy(tmp_path / "committed")
    copy.drop()  # nothing yet: nothing to do
    first = staged(tmp_path, "ckpt-000001")
    copy.keep(first, "ckpt-000001")
    assert not first.exists()
    assert (tmp_path / "committed" / "ckpt-000001" / "model.keras").read_bytes() == b"ckpt-000001"
    copy.keep(staged(tmp_path, "ckpt-000002"), "ckpt-000002")
    assert [p.name for p in (tmp_path / "committed").iterdir()] == ["ckpt-000002"]
    copy.drop()
    assert list((tmp_path / "committed").iterdir()) == []


def test_without_a_folder_a_committed_staging_folder_is_deleted(tmp_path: Path) -> None:
    folder = staged(tmp_path, "ckpt-000001")
    CommittedCopy(None).keep(folder, "ckpt-000001")
    CommittedCopy(None).drop()
    assert not folder.exists()


def test_a_copy_that_cannot_be_kept_is_deleted_and_said(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "committed"
    blocker.write_text("a file where the folder would go")
    folder = staged(tmp_path, "ckpt-000001")
    with caplog.at_level(logging.INFO, logger="resumable"):
        CommittedCopy(blocker).keep(folder, "ckpt-000001")
    assert not folder.exists() and blocker.read_text() == "a file where the folder would go"
    assert "not keeping a local copy of ckpt-000001" in caplog.text
