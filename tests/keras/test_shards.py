"""resumable.keras.checkpoint.shards: Keras' sharded weights merged into one .weights.h5, and what it
refuses."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from resumable.keras.checkpoint import shards

pytestmark = pytest.mark.lanes

LIMIT = 2**20


def write_shards(folder: Path, groups: dict[str, list[tuple[str, np.ndarray]]]) -> Path:
    """A map and one shard per group value, as Keras 3.11+ spreads a group over shards."""
    weight_map: dict[str, list[str]] = {}
    index = 0
    for group, values in groups.items():
        for key, value in values:
            name = f"model_{index:05}.weights.h5"
            index += 1
            with h5py.File(folder / name, "a") as shard:
                vars_group = shard.require_group(group)
                vars_group.attrs["name"] = group.split("/")[1]
                vars_group[key] = value
            weight_map.setdefault(group, []).append(name)
    (folder / "model.weights.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder / "model.weights.json"


def test_a_group_spread_over_shards_is_whole_again(tmp_path: Path) -> None:
    kernel, bias = np.arange(6, dtype="float32").reshape(2, 3), np.ones(3, dtype="float32")
    weights = write_shards(tmp_path, {"/layers/dense/vars": [("0", kernel), ("1", bias)],
                                      "/optimizer/vars": [("0", np.array(7, dtype="int64"))]})
    landed: list[str] = []
    shards.merge(weights, tmp_path / "merged.weights.h5", landed.append, LIMIT)
    assert landed == ["model_00000.weights.h5", "model_00001.weights.h5", "model_00002.weights.h5"]
    with h5py.File(tmp_path / "merged.weights.h5", "r") as merged:
        np.testing.assert_array_equal(merged["/layers/dense/vars/0"][()], kernel)
        np.testing.assert_array_equal(merged["/layers/dense/vars/1"][()], bias)
        assert merged["/optimizer/vars/0"][()] == 7
        assert merged["/layers/dense/vars"].attrs["name"] == "layers"


def test_a_missing_shard_is_file_not_found(tmp_path: Path) -> None:
    weights = write_shards(tmp_path, {"/vars": [("0", np.zeros(2)), ("1", np.zeros(2))]})
    (tmp_path / "model_00001.weights.h5").unlink()
    with pytest.raises(FileNotFoundError):
        shards.merge(weights, tmp_path / "merged.weights.h5", lambda name: None, LIMIT)


@pytest.mark.parametrize("link", ["soft", "external"])
def test_a_link_is_refused_never_followed(tmp_path: Path, link: str) -> None:
    (tmp_path / "outside").mkdir()
    with h5py.File(tmp_path / "outside" / "secret.h5", "w") as secret:
        secret["data"] = np.arange(3)
    weights = write_shards(tmp_path, {"/vars": [("0", np.zeros(2))]})
    with h5py.File(tmp_path / "model_00000.weights.h5", "a") as shard:
        shard["/vars"]["1"] = (h5py.SoftLink("/vars/0") if link == "soft"
                               else h5py.ExternalLink(str(tmp_path / "outside" / "secret.h5"), "/data"))
    with pytest.raises(OSError, match="Link, not data"):
        shards.merge(weights, tmp_path / "merged.weights.h5", lambda name: None, LIMIT)


def test_a_value_in_two_shards_is_refused(tmp_path: Path) -> None:
    weights = write_shards(tmp_path, {"/vars": [("0", np.zeros(2)), ("0", np.ones(2))]})
    with pytest.raises(OSError, match="in two shards"):
        shards.merge(weights, tmp_path / "merged.weights.h5", lambda name: None, LIMIT)
