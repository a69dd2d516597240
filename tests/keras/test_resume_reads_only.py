"""resume() only reads: the run folder stays byte for byte as it was and no lease is taken until
run.fit writes (the manager builds its writer then); run.fit then takes the lease as before."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import backends
import numpy as np
import pytest
from keras_helpers import small_model
from writer_traces import built, new_threads, run_folder

import resumable
from resumable import RunStorage
from resumable.manager.uploader import Uploader
from resumable.storage.lease import Lease, LeaseInfo, read_lease

keras = pytest.importorskip("keras")

rng = np.random.default_rng(0)
X = rng.normal(size=(96, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
FIT = {"batch_size": 32, "shuffle": False, "verbose": 0}


@pytest.fixture(autouse=True, scope="module")
def deterministic_ops() -> None:
    backends.deterministic_ops()


class LeaseSeen(keras.callbacks.Callback):  # type: ignore[misc]
    """The run folder's lease as each epoch ends, read from the folder itself."""

    def __init__(self, storage: RunStorage) -> None:
        super().__init__()
        self.storage = storage
        self.seen: list[LeaseInfo | None] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.seen.append(read_lease(self.storage))


@pytest.mark.slow
def test_resume_changes_nothing_in_the_run_folder_until_fit_writes(run_url: str) -> None:
    first = resumable.resume(run_url, build_model=small_model, keep_best=0)
    first.fit(X, Y, epochs=2, **FIT)
    storage = RunStorage(run_url)
    assert read_lease(storage) is None
    before, listing = set(threading.enumerate()), run_folder(storage)
    with built(Lease, Uploader) as writers:
        run = resumable.resume(run_url, build_model=small_model, keep_best=0)
    assert run.initial_epoch == 2 and run.checkpoint is not None and run.checkpoint.name == "ckpt-000002"
    assert writers == {}  # no writer built
    assert new_threads(before) == set()
    assert read_lease(storage) is None
    assert run_folder(storage) == listing  # not a file added, removed, rewritten or touched

    lease_seen = LeaseSeen(storage)
    run.fit(X, Y, epochs=3, callbacks=[lease_seen], **FIT)
    held = lease_seen.seen[0]
    assert held is not None and held.mine()  # taken as fit starts, as before
    assert read_lease(storage) is None  # and given back at its end
    latest = storage.latest()
    assert latest is not None and latest.name == "ckpt-000003"


@pytest.mark.slow
def test_resume_from_an_empty_folder_creates_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = resumable.resume(url, build_model=small_model, keep_best=0)
    assert run.initial_epoch == 0 and run.checkpoint is None
    assert not Path(url).exists()  # the folder comes with the first checkpoint
    run.fit(X, Y, epochs=1, **FIT)
    assert [c.name for c in RunStorage(url).list()] == ["ckpt-000001"]
