"""The local tier's Keras-free parts (resumable/manager/tiers.py, #55): its option, where it lives,
the run id a run folder records, and which of two checkpoints is newer."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

import resumable
from resumable import RunStorage
from resumable.core.manifest import Manifest
from resumable.manager import tiers


def test_local_tier_is_exported_and_its_defaults_save_every_minute_keeping_one() -> None:
    tier = resumable.LocalTier()
    assert tier is not None and isinstance(tier, tiers.LocalTier)
    assert (tier.every_seconds, tier.every_steps, tier.keep) == (60.0, None, 1)
    with pytest.raises(AttributeError):
        tier.keep = 2  # type: ignore[misc]  # frozen: validated once


@pytest.mark.parametrize(("arguments", "named"), [
    ({"every_seconds": 0}, "every_seconds"), ({"every_seconds": float("nan")}, "every_seconds"),
    ({"every_seconds": True}, "every_seconds"), ({"every_steps": 0}, "every_steps"),
    ({"every_steps": 2.5}, "every_steps"), ({"keep": 0}, "keep"), ({"keep": "1"}, "keep"),
    ({"every_seconds": None}, "every_seconds` and `every_steps"), ({"folder": "gs://bucket/x"}, "folder"),
    ({"folder": ""}, "folder"),
])
def test_a_bad_local_tier_argument_is_one_line_naming_it(arguments: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=f"`{named}`") as raised:
        tiers.LocalTier(**arguments)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value) and "Expected" in str(raised.value)


@pytest.mark.parametrize(("value", "expected"), [
    (False, None), (None, None), (True, tiers.LocalTier()),
    (tiers.LocalTier(every_steps=5, every_seconds=None), tiers.LocalTier(every_steps=5, every_seconds=None)),
])
def test_the_switch_takes_false_true_or_a_local_tier(value: object, expected: tiers.LocalTier | None) -> None:
    assert tiers.check_local_tier(value) == expected


@pytest.mark.parametrize("value", ["yes", 1, {"every_seconds": 5}, "/content/local"])
def test_the_switch_refuses_anything_else_in_one_line(value: object) -> None:
    with pytest.raises(ValueError, match="local_tier") as raised:
        tiers.check_local_tier(value)
    assert "resumable.LocalTier" in str(raised.value)


def test_the_default_folder_is_on_the_vms_own_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delenv("COLAB_GPU", raising=False)
    assert tiers.LocalTier().root == Path(tempfile.gettempdir()) / "resumable-local"
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20261101")
    assert tiers.LocalTier().root == Path("/content/resumable-local")  # not under /content/drive
    assert tiers.LocalTier(folder=tmp_path).run_folder("ab" * 16) == tmp_path / ("ab" * 16)


def test_a_run_folder_records_its_run_id_once(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "run"))
    assert tiers.read_run_id(storage) is None
    first = tiers.record_run_id(storage)
    assert len(first) == 32
    assert tiers.record_run_id(storage) == first  # recorded once: later calls read it
    assert tiers.record_run_id(storage, "f" * 32) == first
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record == {"format": "resumable.run", "version": 1, "run_id": first}
    assert storage.list() == []  # never taken for a checkpoint


@pytest.mark.parametrize("content", [b"not json", b'{"format": "other", "run_id": "' + b"a" * 32 + b'"}',
                                     b'{"format": "resumable.run", "run_id": "../../etc"}', b"[]"])
def test_a_run_id_file_resumable_did_not_write_names_no_run(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_bytes(content)
    assert tiers.read_run_id(RunStorage(str(tmp_path / "run"))) is None


def test_a_run_id_is_recorded_in_a_bucket_too(gcs_bucket: str) -> None:
    storage = RunStorage(gcs_bucket + "/runs/ids")
    recorded = tiers.record_run_id(storage)
    assert tiers.read_run_id(RunStorage(gcs_bucket + "/runs/ids")) == recorded


def info(tmp_path: Path, name: str, epoch: int, step: int, batch: int = 0) -> resumable.CheckpointInfo:
    storage = RunStorage(str(tmp_path / name))
    folder = tmp_path / "staged" / name
    folder.mkdir(parents=True)
    (folder / "model.keras").write_bytes(b"x")
    storage.commit(folder, name, Manifest(epoch=epoch, step=step, batch=batch, payload="model.keras"))
    (found,) = storage.list()
    return found


def test_newer_compares_the_optimizer_step_then_the_epoch(tmp_path: Path) -> None:
    durable = info(tmp_path, "ckpt-000006", 6, 72)
    mid = info(tmp_path, "ckpt-000006-step-000000075", 6, 75, batch=3)
    assert tiers.newer(mid, durable) and not tiers.newer(durable, mid)
    assert not tiers.newer(durable, durable)
    assert tiers.newer(durable, None)
    assert tiers.where(mid) == "ckpt-000006-step-000000075 (epoch 7, batch 3)"
    assert tiers.where(durable) == "ckpt-000006 (end of epoch 6)"
