"""The writer lease: one process writes a run folder; others get a clear error or take over.

Unit tests run over local, memory:// and gs:// (fake-gcs-server). Another host is played by
changing the host name resumable.storage.this_machine gives leases (``as_host``); other processes on this host
are real ones. The two-process tests at the end train with real Keras in subprocesses.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from forked import ForkedJob, start_job
from paths import JOBS

from resumable import RunStorage
from resumable.core.errors import LeaseHeldError, LeaseLostError
from resumable.storage import lease, lease_info, this_machine
from resumable.storage.lease import LEASE_NAME, Lease, LeaseInfo, read_lease

JOB = JOBS / "lease_job.py"


@pytest.fixture(autouse=True)
def _release_leases() -> Iterator[None]:
    """Leases a test left held stop renewing and go (their storage may be gone after the test)."""
    yield
    for held in list(lease._held):
        held.release()


@pytest.fixture
def as_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """``as_host("b")``: leases taken from now on name host "b", as another machine's would."""

    def switch(name: str) -> None:
        monkeypatch.setattr(this_machine, "HOST", name)

    yield switch


def lease_file(storage: RunStorage) -> dict[str, object] | None:
    found = storage.run_files.read_run_file(LEASE_NAME)
    return json.loads(found[0]) if found else None


# ---------------------------------------------------------------------- RunStorage's small-file primitives


def test_run_file_create_replace_delete_are_conditional(run_url: str) -> None:
    storage = RunStorage(run_url)
    first = storage.run_files.create_run_file("note.json", b"one")
    assert first is not None
    assert storage.run_files.create_run_file("note.json", b"two") is None  # only if absent
    assert storage.run_files.read_run_file("note.json") == (b"one", first)
    second = storage.run_files.replace_run_file("note.json", b"three", first)
    assert second is not None and second != first
    assert storage.run_files.replace_run_file("note.json", b"four", first) is None  # not what we last saw
    assert storage.run_files.delete_run_file("note.json", first) is False  # never deletes what changed
    assert storage.run_files.read_run_file("note.json") == (b"three", second)
    assert storage.run_files.delete_run_file("note.json", second) is True
    assert storage.run_files.read_run_file("note.json") is None
    assert storage.run_files.replace_run_file("note.json", b"five", second) is None  # gone: nothing
    assert storage.run_files.read_run_file("note.json") is None


# ---------------------------------------------------------------------- the lease


def test_acquire_writes_holder_and_is_never_a_checkpoint(run_url: str) -> None:
    storage = RunStorage(run_url)
    held = Lease(storage)
    held.acquire()
    written = lease_file(storage)
    assert written is not None
    assert written["host"] == this_machine.HOST and written["pid"] == os.getpid()
    assert written["timeout"] == lease.DEFAULT_TIMEOUT
    info = read_lease(storage)
    assert info is not None and info.token == held.info.token if held.info else False
    assert storage.list() == [] and storage.list(check_files=False) == []
    assert storage.latest() is None
    held.release()
    assert read_lease(storage) is None


def test_second_writer_gets_one_line_naming_the_holder(run_url: str, as_host, capsys) -> None:  # type: ignore[no-untyped-def]
    """Another machine's live writer: the contender watches its lease, sees it renewed, is refused."""
    storage = RunStorage(run_url)
    as_host("colab-a")
    first = Lease(storage, timeout=2, renew_interval=0.05)  # renewed often, as a live notebook's
    first.acquire()
    first.start_renewing()
    as_host("colab-b")
    with pytest.raises(LeaseHeldError) as caught:
        Lease(storage).acquire()
    message = str(caught.value)
    assert "\n" not in message
    assert "host 'colab-a'" in message and f"process {os.getpid()}" in message
    assert f"since {first.info.started:%Y-%m-%d %H:%M}" in message if first.info else False
    assert "takeover=True" in message and "stale after 2 s" in message
    found = read_lease(storage)
    assert found is not None and first.info is not None and found.token == first.info.token  # untouched
    err = capsys.readouterr().err
    assert "waiting up to 2 s for the writer lease" in err and "host 'colab-a'" in err
    assert "renewed, so its writer is alive" in err
    first.renew()  # and still the holder's


def test_takeover_then_the_old_holder_finds_out_and_release_keeps_the_new_lease(
        run_url: str, as_host) -> None:  # type: ignore[no-untyped-def]
    storage = RunStorage(run_url)
    as_host("colab-a")
    old = Lease(storage)
    old.acquire()
    as_host("colab-b")
    new = Lease(storage)
    new.acquire(takeover=True)
    assert read_lease(storage) == new.info
    with pytest.raises(LeaseLostError, match="lost its writer lease.*host 'colab-b'"):
        old.renew()
    assert not old.held
    with pytest.raises(LeaseLostError):
        old.check()
    old.release()  # must not delete the new holder's lease
    assert read_lease(storage) == new.info
    new.renew()
    new.release()
    assert read_lease(storage) is None


def test_release_never_deletes_another_holders_lease(run_url: str, as_host) -> None:  # type: ignore[no-untyped-def]
    storage = RunStorage(run_url)
    as_host("colab-a")
    old = Lease(storage)
    old.acquire()
    as_host("colab-b")
    Lease(storage).acquire(takeover=True)
    taken = read_lease(storage)
    old.release()
    assert read_lease(storage) == taken and taken is not None and taken.host == "colab-b"


def test_stale_lease_is_taken_over_without_takeover(run_url: str, as_host, caplog) -> None:  # type: ignore[no-untyped-def]
    """Stale by GCS' own clock: taken at once; elsewhere another machine's lease is watched for its
    timeout first (its renewal time is by its own clock, never compared with ours)."""
    storage = RunStorage(run_url)
    as_host("colab-a")
    old = Lease(storage, timeout=0.5)  # its holder's setting decides when it is stale
    old.acquire()
    time.sleep(2.2 if storage.is_gcs else 0.7)  # GCS' Date header counts whole seconds
    as_host("colab-b")
    with caplog.at_level(logging.WARNING, logger="resumable"):
        new = Lease(storage, timeout=600)
        new.acquire()
    assert read_lease(storage) == new.info
    said = " ".join(r.getMessage() for r in caplog.records)
    if storage.is_gcs:
        assert "stale writer lease of host 'colab-a'" in said and "by the storage's clock" in said
    else:
        assert "taking over the writer lease of host 'colab-a'" in said and "unchanged for the" in said
    with pytest.raises(LeaseLostError, match="taken over by host 'colab-b'"):
        old.renew()


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_a_silent_lease_of_another_machine_is_waited_for_then_taken_over(  # type: ignore[no-untyped-def]
        run_url: str, as_host, capsys, caplog) -> None:
    """A writer that died with its VM: fresh when found, never renewed again; no takeover=True."""
    storage = RunStorage(run_url)
    as_host("colab-a")
    dead = Lease(storage, timeout=1.0)  # renews every 0.25 s while alive; here it never does
    dead.acquire()
    as_host("colab-b")
    new = Lease(storage)
    with caplog.at_level(logging.WARNING, logger="resumable"):
        new.acquire()
    assert read_lease(storage) == new.info
    err = capsys.readouterr().err
    waited = [line for line in err.splitlines() if "waiting up to" in line]
    assert len(waited) == 1 and "host 'colab-a'" in waited[0] and "taken over if not renewed" in waited[0]
    assert "not renewed, taking it over" in err
    assert any("taking over the writer lease of host 'colab-a'" in r.getMessage() for r in caplog.records)
    with pytest.raises(LeaseLostError):
        dead.renew()


def test_a_lease_that_would_take_long_to_go_stale_is_refused_at_once(tmp_path: Path, as_host, capsys) -> None:  # type: ignore[no-untyped-def]
    """A long lease_timeout, or a lease of an older version (renewed each minute, stale after 10)."""
    storage = RunStorage(str(tmp_path / "run"))
    now = dt.datetime.now(dt.timezone.utc)
    older = {"format": "resumable.lease", "token": "t", "host": "colab-old", "pid": 7,
             "started": now.isoformat(), "renewed": now.isoformat(), "timeout": 600.0}
    assert storage.run_files.create_run_file(LEASE_NAME, json.dumps(older).encode()) is not None
    info = read_lease(storage)
    assert info is not None and info.renew_interval is None and info.interval == 60.0
    with pytest.raises(LeaseHeldError, match="host 'colab-old'.*stale after 10 min"):
        Lease(storage).acquire()
    assert "waiting" not in capsys.readouterr().err


def test_the_lease_says_how_often_it_is_renewed_and_older_readers_still_read_it(run_url: str) -> None:
    storage = RunStorage(run_url)
    held = Lease(storage, timeout=60)
    held.acquire()
    written = lease_file(storage)
    assert written is not None and written["renew_interval"] == 15.0 and written["timeout"] == 60.0
    older_fields = {"format", "token", "host", "pid", "started", "renewed", "timeout", "process_start",
                    "boot_id"}
    assert older_fields <= set(written) and written["format"] == "resumable.lease"


def test_blocks_means_a_writer_that_renews_on_time(as_host) -> None:  # type: ignore[no-untyped-def]
    now = dt.datetime.now(dt.timezone.utc)
    fresh = LeaseInfo(token="t", host="colab-a", pid=1, started=now, renewed=now, timeout=40,
                      renew_interval=10)
    assert fresh.blocks()
    silent = dataclasses.replace(fresh, renewed=now - dt.timedelta(seconds=20))
    assert not silent.blocks() and not silent.stale()  # a writer would wait for it, then take it over
    old = dataclasses.replace(fresh, renewed=now - dt.timedelta(seconds=41))
    assert not old.stale()  # by another machine's clock alone: never; a writer watches it
    assert old.stale(server_age=41) and not fresh.stale(server_age=39)  # by the storage's clock
    assert not fresh.blocks(server_age=20) and silent.blocks(server_age=1)
    ours = dataclasses.replace(old, host=this_machine.HOST, boot_id=this_machine.BOOT_ID)
    assert ours.stale()  # this machine's clock is ours
    future = dataclasses.replace(ours, renewed=now + dt.timedelta(days=365 * 70))
    assert not future.clock_is_ours() and not future.stale()  # "renewed in 2099": watched, not trusted


def test_renewing_keeps_a_short_lease_fresh(run_url: str, as_host) -> None:  # type: ignore[no-untyped-def]
    storage = RunStorage(run_url)
    as_host("colab-a")
    held = Lease(storage, timeout=1.0, renew_interval=0.1)
    held.acquire()
    held.start_renewing()
    try:
        as_host("colab-b")
        time.sleep(1.5)  # longer than the timeout: only the renewals keep it
        with pytest.raises(LeaseHeldError):
            Lease(storage).acquire()
        info = read_lease(storage)
        assert info is not None and info.age() < 1.0
    finally:
        held.release()
    assert read_lease(storage) is None


def test_renewal_thread_notices_a_takeover(run_url: str, as_host, caplog) -> None:  # type: ignore[no-untyped-def]
    storage = RunStorage(run_url)
    as_host("colab-a")
    held = Lease(storage, timeout=5.0, renew_interval=0.05)
    held.acquire()
    held.start_renewing()
    as_host("colab-b")
    with caplog.at_level(logging.INFO, logger="resumable"):  # said once, at info: training raises it
        Lease(storage).acquire(takeover=True)
        deadline = time.monotonic() + 10
        said = lambda: any("lost its writer lease" in r.getMessage() for r in caplog.records)  # noqa: E731
        # the thread sets `lost` a moment before it logs: wait for both
        while not (held.lost is not None and said()) and time.monotonic() < deadline:
            time.sleep(0.02)
    assert held.lost is not None and "host 'colab-b'" in held.lost
    assert said()
    held.release()
    assert read_lease(storage) is not None


def test_renew_after_a_renewal_that_landed_but_raised(run_url: str) -> None:
    """A renewal whose write landed but reported an error (a lost reply) is still ours."""
    storage = RunStorage(run_url)
    held = Lease(storage)
    held.acquire()
    assert held.info is not None
    found = storage.run_files.read_run_file(LEASE_NAME)
    assert found is not None
    later = LeaseInfo(**{**held.info.__dict__, "renewed": held.info.renewed + dt.timedelta(seconds=5)})
    assert storage.run_files.replace_run_file(LEASE_NAME, later.to_json(), found[1]) is not None
    held.renew()
    info = read_lease(storage)
    assert info is not None and info.token == held.info.token and held.lost is None


def test_a_lease_torn_by_a_failed_write_is_repaired_and_released(run_url: str) -> None:
    """Where writes are not atomic, a renewal cut short (a full disk) leaves half a lease."""
    storage = RunStorage(run_url)
    held = Lease(storage)
    held.acquire()
    found = storage.run_files.read_run_file(LEASE_NAME)
    assert found is not None
    assert storage.run_files.replace_run_file(LEASE_NAME, found[0][:20], found[1]) is not None
    held.renew()
    assert read_lease(storage) == held.info
    found = storage.run_files.read_run_file(LEASE_NAME)
    assert found is not None
    assert storage.run_files.replace_run_file(LEASE_NAME, found[0][:20], found[1]) is not None
    held.release()
    assert storage.run_files.read_run_file(LEASE_NAME) is None


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "run"))
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    now = dt.datetime.now(dt.timezone.utc)
    gone = LeaseInfo(token="x", host=this_machine.HOST, pid=int(child.stdout), started=now, renewed=now,
                     timeout=600, boot_id=this_machine.BOOT_ID)
    assert storage.run_files.create_run_file(LEASE_NAME, gone.to_json()) is not None
    assert gone.process_gone()
    held = Lease(storage)
    held.acquire()  # fresh, but its process is gone: no takeover needed
    assert read_lease(storage) == held.info


def test_a_live_process_on_this_host_keeps_its_lease(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "run"))
    script = ("import sys; from resumable import RunStorage; from resumable.storage.lease import Lease;"
              "Lease(RunStorage(sys.argv[1])).acquire(); print('HELD', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", script, storage.url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        with pytest.raises(LeaseHeldError, match=f"process {holder.pid},"):
            Lease(storage).acquire()
    finally:
        holder.communicate("")  # stdin closed: it exits, releasing the lease at exit
    assert holder.returncode == 0
    assert read_lease(storage) is None


@pytest.mark.parametrize("backend", ["local", "gcs"])
# ---------------------------------------------------------------------- clocks: never another machine's


def skewed_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This process' wall clock, as the lease reads it, ``seconds`` ahead (behind if negative)."""
    real = lease_info.wall_clock
    monkeypatch.setattr(lease_info, "wall_clock", lambda: real() + dt.timedelta(seconds=seconds))


@pytest.mark.parametrize("backend", ["local", "gcs"])
@pytest.mark.parametrize("skew", [60.0, -60.0, 3600.0])
def test_a_contender_whose_clock_is_off_never_takes_a_live_writer_s_lease(  # type: ignore[no-untyped-def]
        run_url: str, as_host, monkeypatch: pytest.MonkeyPatch, skew: float) -> None:
    """The audit's case: a second machine whose clock ran 60 s ahead judged the live writer's lease
    stale by its own clock and took it at once; the writer then stopped. Now it watches the lease,
    sees it renewed, and is refused; the writer keeps writing."""
    storage = RunStorage(run_url)
    as_host("colab-a")
    live = Lease(storage, timeout=1.0, renew_interval=0.2)
    live.acquire()
    live.start_renewing()
    as_host("colab-b")
    skewed_clock(monkeypatch, skew)
    started = time.monotonic()
    with pytest.raises(LeaseHeldError, match="host 'colab-a'"):
        Lease(storage).acquire()
    assert time.monotonic() - started < 5  # refused once it saw a renewal, well within the timeout
    live.fence()  # still ours: no LeaseLostError
    live.renew()
    assert read_lease(storage) == live.info


def test_a_lease_renewed_in_the_future_blocks_for_one_timeout_not_until_then(  # type: ignore[no-untyped-def]
        tmp_path: Path, caplog) -> None:
    """A hostile lease of this host, a live process named, renewed "in 2099": its renewal time tells
    nothing, so it is watched like another machine's and taken over once unchanged for its timeout."""
    storage = RunStorage(str(tmp_path / "run"))
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        far = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)
        hostile = LeaseInfo(token="x", host=this_machine.HOST, pid=alive.pid, started=far, renewed=far,
                            timeout=1.0, boot_id=this_machine.BOOT_ID, renew_interval=0.25)
        assert storage.run_files.create_run_file(LEASE_NAME, hostile.to_json()) is not None
        assert not hostile.process_gone()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="resumable"):
            held = Lease(storage)
            held.acquire()
        waited = time.monotonic() - started
    finally:
        alive.kill()
        alive.wait()
    assert 1.0 <= waited < 5
    assert read_lease(storage) == held.info
    assert "unchanged for the 1 s watched" in caplog.text


def test_a_lost_writer_is_told_its_lease_was_taken_and_by_whom(run_url: str, as_host) -> None:  # type: ignore[no-untyped-def]
    storage = RunStorage(run_url)
    as_host("colab-a")
    first = Lease(storage, timeout=30)
    first.acquire()
    as_host("colab-b")
    second = Lease(storage, timeout=30)
    second.acquire(takeover=True)
    with pytest.raises(LeaseLostError) as caught:
        first.fence()
    text = str(caught.value)
    assert "lost its writer lease (taken over by host 'colab-b', process" in text and "removed" not in text
    second.release()  # later calls repeat the same line
    with pytest.raises(LeaseLostError, match="taken over by host 'colab-b'"):
        first.renew()


def test_a_lease_deleted_by_hand_says_so(run_url: str) -> None:
    storage = RunStorage(run_url)
    held = Lease(storage, timeout=30)
    held.acquire()
    found = storage.run_files.read_run_file(LEASE_NAME)
    assert found is not None and storage.run_files.delete_run_file(LEASE_NAME, found[1])
    with pytest.raises(LeaseLostError, match=r"lease\.json was deleted or made unreadable"):
        held.renew()


def test_a_lease_held_at_exit_is_released(run_url: str) -> None:
    """A script exits holding the lease (a plain model.fit that raised): it is released at exit."""
    script = ("import sys; from resumable import RunStorage; from resumable.storage.lease import Lease;"
              "held = Lease(RunStorage(sys.argv[1])); held.acquire(); held.start_renewing();"
              "print('EXITING', flush=True)")
    done = subprocess.run([sys.executable, "-c", script, run_url], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "EXITING" in done.stdout and "could not release" not in done.stderr, done.stderr
    assert read_lease(RunStorage(run_url)) is None


def test_an_earlier_lease_of_this_process_is_taken_back(run_url: str) -> None:
    storage = RunStorage(run_url)
    earlier = Lease(storage)  # e.g. a fit interrupted in an earlier notebook cell
    earlier.acquire()
    again = Lease(storage)
    again.acquire()
    assert read_lease(storage) == again.info
    earlier.release()
    assert read_lease(storage) == again.info


def test_unreadable_lease_is_replaced(run_url: str) -> None:
    storage = RunStorage(run_url)
    storage.run_files.create_run_file(LEASE_NAME, b'{"format": "resumable.lea')  # a torn write
    if storage.is_local:  # an old one: a young one may still be being written (test_local_faults.py)
        old = time.time() - lease.TORN_GRACE - 1
        os.utime(f"{storage.root}/{LEASE_NAME}", (old, old))
    held = Lease(storage)
    held.acquire()
    assert read_lease(storage) == held.info


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "600", True, None])
def test_bad_timeout_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"Invalid value for argument `lease_timeout`\. Received: "
                                         r"lease_timeout=.*Expected a positive number of seconds"):
        lease.check_timeout(bad)


def test_timedelta_timeout() -> None:
    assert lease.check_timeout(dt.timedelta(minutes=2)) == 120.0
    held = Lease(RunStorage("memory://lease-td"), timeout=120)
    assert held.renew_interval == 30.0
    assert Lease(RunStorage("memory://lease-td")).renew_interval == 10.0
    assert Lease(RunStorage("memory://lease-td"), timeout=6000).renew_interval == 60.0


# ---------------------------------------------------------------------- the callback


@pytest.mark.slow
def test_callback_holds_the_lease_while_training_only(tmp_path: Path, as_host) -> None:  # type: ignore[no-untyped-def]
    import keras
    import numpy as np

    import resumable

    url = str(tmp_path / "run")
    seen: list[LeaseInfo | None] = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            seen.append(read_lease(RunStorage(url)))

    def build() -> keras.Model:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    x, y = np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32")
    as_host("colab-a")
    other = Lease(RunStorage(url), timeout=2, renew_interval=0.1)  # a live notebook on another VM
    other.acquire()
    other.start_renewing()
    as_host("colab-b")
    with pytest.warns(UserWarning, match="being written by another process.*host 'colab-a'.*takeover=True"):
        run = resumable.resume(url, build_model=build, monitor="loss")
    with pytest.raises(LeaseHeldError, match="host 'colab-a'"):
        run.fit(x, y, epochs=1, verbose=0, callbacks=[Probe()])
    assert RunStorage(url).list() == []  # nothing written
    found = read_lease(RunStorage(url))
    assert found is not None and other.info is not None and found.token == other.info.token

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*being written")  # takeover=True: no such warning
        run = resumable.resume(url, build_model=build, monitor="loss", takeover=True, lease_timeout=30)
    run.fit(x, y, epochs=2, verbose=0, callbacks=[Probe()])
    assert [s.host if s else None for s in seen] == ["colab-b", "colab-b"]
    assert all(s is not None and s.timeout == 30 for s in seen)
    assert read_lease(RunStorage(url)) is None  # released at train end
    assert [c.epoch for c in RunStorage(url).list()] == [1, 2]
    with pytest.raises(LeaseLostError):
        other.renew()


def test_after_a_failed_plain_fit_the_lease_goes_back_once_the_upload_lands(
        tmp_path: Path, ctrl_c_as_in_a_notebook: None) -> None:
    """What a notebook's end of cell does (resumable.keras.callback.notebook) after a plain model.fit an error
    stopped: wait for the upload, then give the lease back; interrupted while waiting, keep it."""
    import keras
    import numpy as np
    from gated_fs import GatedFS

    import resumable

    url = str(tmp_path / "run")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    checkpoint = resumable.CheckpointCallback(url, staging_dir=tmp_path / "stage")
    gate = threading.Event()
    checkpoint.storage.fs = GatedFS(checkpoint.storage.fs, gate)  # the upload waits for the test

    class BadData(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            if epoch == 1:  # after the checkpoint saved epoch 1; Keras then skips on_train_end
                raise ValueError("bad data")

    x, y = np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32")
    with pytest.raises(ValueError, match="bad data"):
        model.fit(x, y, epochs=3, verbose=0, callbacks=[checkpoint, BadData()])
    assert checkpoint.manager.pending == ["ckpt-000001"]
    assert read_lease(RunStorage(url)) is not None

    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C while the cell waits
    with pytest.raises(KeyboardInterrupt):
        checkpoint.fit_lease.after_the_cell()
    assert read_lease(RunStorage(url)) is not None  # an upload may still commit: not released

    gate.set()
    checkpoint.fit_lease.after_the_cell()
    assert read_lease(RunStorage(url)) is None
    assert [c.name for c in RunStorage(url).list() if c.ok] == ["ckpt-000001"]


def test_callback_refuses_bad_lease_arguments(tmp_path: Path) -> None:
    import resumable

    with pytest.raises(ValueError, match=r"argument `takeover`\. Received: takeover='yes'"):
        resumable.CheckpointCallback(str(tmp_path / "run"), takeover="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"argument `lease_timeout`\. Received: lease_timeout=-5"):
        resumable.CheckpointCallback(str(tmp_path / "run"), lease_timeout=-5)


# ---------------------------------------------------------------------- two real processes


class Job:
    """tests/jobs/lease_job.py in a process of its own, forked from the job server (its own pid,
    lease, signals and exit), its stdout lines read as they come."""

    def __init__(self, *args: str) -> None:
        self.proc: ForkedJob = start_job(JOB, list(args), merge_stderr=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put("EOF")

    def expect(self, prefix: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.lines.append(line)
            if line.startswith(prefix):
                return line
            if line == "EOF":
                break
        self.proc.kill()
        raise AssertionError(f"no {prefix!r} line; output:\n" + "\n".join(self.lines))

    def exit_code(self, timeout: float = 120) -> int:
        try:
            self.expect("EOF", timeout)
        except AssertionError:
            if self.proc.poll() is None:
                raise
        return self.proc.wait(timeout)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_two_processes_on_one_run_folder(run_url: str) -> None:
    # A: commits epoch 1, then holds the run (its batches wait while its lease is not lost).
    holder = Job(run_url, "--epochs", "3", "--hold", "120", "--lease-timeout", "5")
    holder.expect("TRAINING")
    holder.expect("LOG resumable: saved")
    storage = RunStorage(run_url)
    # B: refused before writing anything; A's run is intact.
    second = Job(run_url, "--epochs", "3")
    refused = second.expect("LEASE_HELD")
    assert second.exit_code() == 3
    assert f"process {holder.proc.pid}," in refused and "takeover=True" in refused
    assert holder.proc.poll() is None
    infos = storage.list()
    assert [(c.name, c.status.value) for c in infos] == [("ckpt-000001", "ok")]
    assert read_lease(storage) is not None and read_lease(storage).pid == holder.proc.pid  # type: ignore[union-attr]
    # C: takes over, continues from A's checkpoint and finishes; A stops without writing.
    taker = Job(run_url, "--epochs", "2", "--takeover")
    assert taker.expect("READY").startswith("READY initial_epoch=1")
    taker.expect("DONE")
    assert taker.exit_code() == 0
    assert holder.expect("LEASE_LOST").count("lost its writer lease") == 1
    assert holder.exit_code() == 4
    infos = storage.list()
    assert [(c.name, c.status.value) for c in infos] == [("ckpt-000001", "ok"), ("ckpt-000002", "ok")]
    assert all(storage.verify(c) == [] for c in infos)
    assert read_lease(storage) is None  # C released it; A's release left it alone


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_a_writer_killed_on_another_machine_blocks_no_new_session(run_url: str) -> None:
    """A recycled Colab VM: the writer SIGKILLed, the next session on another host continues with no
    flag; while the writer lived, a second notebook on a third host was refused with one line."""
    # On GCS the storage's clock counts the silence since the last renewal: the lease must outlast
    # the next session's start (Keras import) for it to wait at all. A local folder's lease is
    # watched for its whole timeout from the first look; a live writer is refused once seen
    # renewing for that long: a shorter one keeps the test short. The sessions are forked: a new
    # VM's start-up (Python and Keras, 5-7 s) only shortens the next session's wait, which the GCS
    # lease's 30 s covers either way; the waits and the takeover are the lease's own clocks.
    timeout = "30" if run_url.startswith("gs://") else "12"
    holder = Job(run_url, "--epochs", "3", "--hold", "300", "--lease-timeout", timeout, "--as-host", "vm-a")
    holder.expect("TRAINING")
    holder.expect("LOG resumable: saved")
    live = Job(run_url, "--epochs", "3", "--as-host", "vm-b")
    refused = live.expect("LEASE_HELD")
    assert live.exit_code() == 3
    assert "host 'vm-a'" in refused and f"process {holder.proc.pid}," in refused
    assert "takeover=True" in refused
    assert any("renewed, so its writer is alive" in line for line in live.lines), live.lines
    assert holder.proc.poll() is None  # untouched by the refused one

    holder.proc.send_signal(signal.SIGKILL)  # the VM goes away: no release, no last renewal
    holder.proc.wait()
    storage = RunStorage(run_url)
    assert read_lease(storage) is not None and read_lease(storage).host == "vm-a"  # type: ignore[union-attr]
    after = Job(run_url, "--epochs", "2", "--as-host", "vm-c")
    assert after.expect("READY").startswith("READY initial_epoch=1")
    waited = after.expect("resumable: waiting up to")
    assert "host 'vm-a'" in waited and "taken over if not renewed" in waited
    after.expect("TRAINING")
    after.expect("DONE")
    assert after.exit_code() == 0
    assert any("not renewed, taking it over" in line for line in after.lines), after.lines
    infos = storage.list()
    assert [(c.name, c.status.value) for c in infos] == [("ckpt-000001", "ok"), ("ckpt-000002", "ok")]
    assert read_lease(storage) is None
