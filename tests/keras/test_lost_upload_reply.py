"""A fit whose last save loses the reply to its final upload request goes on and commits.

The real fake-gcs-server behind `fault_proxy.FaultProxy`: the request that finishes the upload
of the last checkpoint's state.json reaches the server, then its reply is lost. gcsfs sends
the last chunk again to the finished session and meets a 404; resumable asks the bucket,
finds the object it sent and commits (storage/landed.py). Before #51 the wait at the end of
fit raised "state.json: not found" and fit stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fault_proxy import FaultProxy, Rule
from keras_helpers import small_model

import resumable
from resumable import RunStorage


@pytest.fixture
def proxy(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server) as running:
        yield running


@pytest.mark.slow
def test_a_lost_final_reply_does_not_stop_fit(proxy: FaultProxy, gcs_bucket: str, tmp_path: Path) -> None:
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    proxy.add(Rule("lost-answer", match="ckpt-000002/state.json&upload_id=", final_chunk=True, times=1))
    url = f"{gcs_bucket}/runs/lost"
    options = {"token": "anon", "endpoint_url": proxy.url}
    x, y = np.ones((16, 8), "float32"), np.ones((16, 1), "float32")
    run = resumable.resume(url, build_model=small_model, storage_options=options,
                           staging_dir=str(tmp_path / "staging"))
    run.fit(x, y, epochs=2, batch_size=8, verbose=0)  # raised RunNotFoundError before #51
    assert proxy.outcomes("lost-answer"), "the fault never happened"
    gcsfs.GCSFileSystem.clear_instance_cache()
    storage = RunStorage(url)
    assert [(c.name, c.status.value) for c in storage.list()] == [(f"ckpt-00000{e}", "ok") for e in (1, 2)]
    assert storage.verify("ckpt-000002") == []
