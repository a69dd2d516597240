"""Commits to GCS through a server that fails mid-run: resets, 500s, 429s, an upload stalled
mid-body, a reply lost after the write landed, a token the server stops taking.

The real fake-gcs-server behind `fault_proxy.FaultProxy`; the commits are `RunStorage.commit`,
the path every training save takes (storage/commit.py). What must hold each time: every commit
either lands whole or raises, none is lost or committed twice (each manifest is created once,
create-only, and reads back as ours), and the run verifies afterwards.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_proxy import FaultProxy, Rule, Tokens

from resumable import Manifest, RunStorage
from resumable.core.errors import NotAuthenticatedError
from resumable.storage import gcs_upload, transfers

BIG = 3 * 2**20  # streamed (STREAM_MIN_BYTES lowered below): one resumable-upload PUT


@pytest.fixture
def proxy(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server) as running:
        yield running


@pytest.fixture(autouse=True)
def streamed_and_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files from 1 MiB on go up as one streamed request; a stalled body times out in seconds."""
    monkeypatch.setattr(transfers, "STREAM_MIN_BYTES", 2**20)
    monkeypatch.setattr(gcs_upload, "BODY_TIMEOUT", (5.0, 2.0))


def through(proxy: FaultProxy, bucket: str, credentials: Any = "anon") -> RunStorage:
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    options = {"token": credentials, "endpoint_url": proxy.url}
    return RunStorage(f"{bucket}/runs/exp1", storage_options=options)


def staged(tmp_path: Path, epoch: int) -> Path:
    folder = tmp_path / f"stage-{epoch}"
    (folder / "assets").mkdir(parents=True, exist_ok=True)
    (folder / "model.keras").write_bytes(random.Random(epoch).randbytes(BIG))
    (folder / "state.json").write_bytes(b'{"epoch": %d}' % epoch)
    (folder / "assets" / "vocab.txt").write_bytes(b"a\nb\n")
    return folder


def commit_three(storage: RunStorage, tmp_path: Path) -> None:
    for epoch in (1, 2, 3):
        storage.commit(staged(tmp_path, epoch), f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 10))


def assert_three_whole(bucket: str, tmp_path: Path) -> None:
    """Read straight from the server: three checkpoints, each file as staged, each verifying."""
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    storage = RunStorage(f"{bucket}/runs/exp1")
    infos = storage.list()
    assert [(i.name, i.status.value) for i in infos] == [(f"ckpt-{e:06d}", "ok") for e in (1, 2, 3)]
    for info in infos:
        assert storage.verify(info) == []
        assert storage.fs.cat_file(f"{storage.root}/{info.name}/model.keras") == \
            (tmp_path / f"stage-{info.epoch}" / "model.keras").read_bytes()


FAULTS = {
    "reset-mid-upload": [Rule("reset", match="upload_id=", method="PUT", nth=2, times=1)],
    "500-on-upload": [Rule(500, match="upload_id=", method="PUT", nth=1, times=2)],
    "503-starting-sessions": [Rule(503, match="uploadType=resumable", nth=2, times=2)],
    "429-on-listings": [Rule(429, match="/o?", method="GET", nth=2, times=3)],
    "500-on-manifest-create": [Rule(500, match="uploadType=multipart", nth=1, times=2)],
    "stall-mid-upload": [Rule("stall", match="upload_id=", method="PUT", nth=2, times=1, after=256 * 1024,
                              seconds=10)],
    "lost-answer-of-a-manifest": [Rule("lost-answer", match="uploadType=multipart", nth=2, times=1)],
    "lost-answer-of-an-upload": [Rule("lost-answer", match="upload_id=", method="PUT", nth=1, times=1)],
}


@pytest.mark.parametrize("rules", FAULTS.values(), ids=FAULTS.keys())
def test_commits_through_a_failing_server_land_once_and_whole(proxy: FaultProxy, gcs_bucket: str,
                                                              tmp_path: Path, rules: list[Rule]) -> None:
    proxy.add(*rules)
    commit_three(through(proxy, gcs_bucket), tmp_path)
    injected = [s for s in proxy.seen if s[2] != "forwarded"]
    assert injected, "the fault never happened: the test would prove nothing"
    assert_three_whole(gcs_bucket, tmp_path)


def test_an_outage_longer_than_the_budget_fails_the_commit_and_leaves_the_rest(
        proxy: FaultProxy, gcs_bucket: str, tmp_path: Path) -> None:
    storage = through(proxy, gcs_bucket)
    storage.commit(staged(tmp_path, 1), "ckpt-000001", Manifest(epoch=1, step=10))
    from resumable.storage.retry import RetryPolicy

    storage.retry = RetryPolicy(attempts=2, initial_delay=0.1, budget=5)
    proxy.add(Rule(503, match="upload", times=None))
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        storage.commit(staged(tmp_path, 2), "ckpt-000002", Manifest(epoch=2, step=20))
    assert time.monotonic() - started < 20
    assert "503" in str(caught.value) and "\n" not in str(caught.value)
    proxy.clear()
    infos = {i.name: i.status.value for i in storage.list()}
    assert infos["ckpt-000001"] == "ok" and infos.get("ckpt-000002") != "ok"  # never half committed
    storage.commit(staged(tmp_path, 2), "ckpt-000002", Manifest(epoch=2, step=20))  # the next save lands
    assert storage.verify("ckpt-000002") == []


# ----------------------------------------------------------------------------- tokens


def credentials_of(tokens: Tokens, lifetime: float) -> Any:
    """google-auth credentials whose tokens the proxy issues, believed valid for ``lifetime`` s."""
    from google.auth import credentials as ga

    class Issued(ga.Credentials):  # type: ignore[misc]
        def refresh(self, request: Any) -> None:
            self.token = tokens.issue()
            now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # google-auth: naive UTC
            self.expiry = now + dt.timedelta(seconds=lifetime)

    return Issued()


def test_tokens_that_expire_mid_run_are_refreshed(proxy: FaultProxy, gcs_bucket: str, tmp_path: Path) -> None:
    """Tokens live 2 s and the client knows it: each is refreshed before it runs out."""
    proxy.tokens.ttl = 2.0
    storage = through(proxy, gcs_bucket, credentials_of(proxy.tokens, lifetime=2.0))
    for epoch in (1, 2, 3):
        storage.commit(staged(tmp_path, epoch), f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 10))
        time.sleep(1.0)
    assert len(proxy.tokens.issued) >= 2 and not proxy.outcomes("401")
    assert_three_whole(gcs_bucket, tmp_path)


def test_a_token_the_server_stops_taking_early_is_refreshed_on_its_401(
        proxy: FaultProxy, gcs_bucket: str, tmp_path: Path) -> None:
    """The server expires tokens after 1 s while the client believes them good for an hour (a revoked
    token, a server clock ahead): the 401 makes resumable refresh the token and try again."""
    proxy.tokens.ttl = 1.0
    storage = through(proxy, gcs_bucket, credentials_of(proxy.tokens, lifetime=3600))
    storage.retry = type(storage.retry)(budget=20)  # gcsfs' own 6 tries of a 401 would take 30 s each
    for epoch in (1, 2, 3):
        storage.commit(staged(tmp_path, epoch), f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch * 10))
        time.sleep(1.2)
    assert proxy.outcomes("401")  # it did happen
    assert_three_whole(gcs_bucket, tmp_path)


def test_no_credentials_at_all_is_one_line(proxy: FaultProxy, gcs_bucket: str, tmp_path: Path) -> None:
    proxy.tokens.ttl = 0.0  # no token is taken
    storage = through(proxy, gcs_bucket, credentials_of(proxy.tokens, lifetime=3600))
    storage.retry = type(storage.retry)(budget=5)
    with pytest.raises(NotAuthenticatedError) as caught:
        storage.commit(staged(tmp_path, 1), "ckpt-000001", Manifest(epoch=1, step=10))
    assert "\n" not in str(caught.value) and "ya29." + "test" not in str(caught.value)
    assert os.environ.get("STORAGE_EMULATOR_HOST") != proxy.url  # the other tests' clients untouched
