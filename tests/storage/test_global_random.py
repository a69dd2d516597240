"""resumable's storage never changes a random state the user's training reads.

``keras.utils.set_random_seed`` seeds Python's ``random`` and NumPy's global generator, and Keras
draws unseeded initializers' seeds from them: `resume` takes the writer lease before it calls
``build_model()``, so one retried request drawing its jitter there would give a seeded run other
initial weights. Through the real fake-gcs-server behind `fault_proxy.FaultProxy` (429s and
resets, retried by resumable, gcsfs, google-api-core and google-cloud-storage), both states are
the same after the lease and a save as before.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fault_proxy import FaultProxy, Rule
from storage_helpers import stage

from resumable import Manifest, RunStorage
from resumable.storage import library_random
from resumable.storage.lease import Lease


@pytest.fixture
def proxy(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server) as running:
        yield running


def global_states() -> tuple[Any, Any]:
    numpy_state = np.random.get_state()
    return random.getstate(), (numpy_state[0], numpy_state[1].tobytes(), *numpy_state[2:])


def faults(proxy: FaultProxy) -> int:
    return sum(outcome != "forwarded" for _, _, outcome in proxy.seen)


def test_retried_requests_leave_the_global_random_states_as_seeded(proxy: FaultProxy, gcs_bucket: str,
                                                                    tmp_path: Path) -> None:
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    # (a rule counts the matching requests no rule before it took)
    proxy.add(Rule(429, match="uploadType=multipart", times=1),  # the lease's create, twice
              Rule("reset", match="uploadType=multipart", times=1),
              Rule(429, match="uploadType=multipart", nth=2, times=1),  # a file of the save
              Rule(429, match="/o?", method="GET", times=1),  # gcsfs' own retry of a listing
              Rule(429, match="lease.json", times=1), Rule("reset", match="lease.json", nth=2, times=1))
    random.seed(7)
    np.random.seed(7)
    seeded = global_states()
    options = {"token": "anon", "endpoint_url": proxy.url}
    storage = RunStorage(f"{gcs_bucket}/runs/seeded", storage_options=options)
    lease = Lease(storage)
    lease.acquire()  # what resume() does before build_model()
    try:
        assert faults(proxy) == 2 and global_states() == seeded
        storage.list()
        storage.commit(stage(tmp_path / "stage", {"model.keras": b"weights" * 1000}), "ckpt-000001",
                       Manifest(epoch=1, step=10))
    finally:
        lease.release()
    assert faults(proxy) == 6, proxy.seen  # each fault happened: else the test would prove nothing
    assert global_states() == seeded
    assert [info.name for info in storage.list() if info.ok] == ["ckpt-000001"]


def test_the_storage_libraries_draw_from_generators_of_their_own() -> None:
    library_random.isolate()
    import gcsfs.retry
    from google.api_core.retry import retry_base

    random.seed(1)
    seeded = random.getstate()
    assert list(itertools.islice(retry_base.exponential_sleep_generator(1.0, 60.0), 5))
    assert 0 <= gcsfs.retry.random.random() < 1
    assert isinstance(gcsfs.retry.random.SystemRandom(), random.SystemRandom)  # other names: the module's
    assert random.getstate() == seeded
