"""Files used as they land while the rest come down (resumable/manager/arrival.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from resumable import CorruptCheckpointError
from resumable.manager.arrival import Arrival

FILES = ["state.json", "shard-0", "shard-1", "shard-2"]
STREAMED = ["shard-0", "shard-1", "shard-2"]


class Steps:
    """A fetch that lands one file each time the test says so, or fails when told to."""

    def __init__(self, fail_at: str | None = None) -> None:
        self.go = threading.Semaphore(0)
        self.fail_at = fail_at
        self.fetched: list[str] = []

    def fetch(self, folder: Path) -> Callable[[Callable[[str], None]], Path]:
        def run(landed: Callable[[str], None]) -> Path:
            for rel in FILES:
                assert self.go.acquire(timeout=10)
                if rel == self.fail_at:
                    raise CorruptCheckpointError(f"{rel}: crc32c differs; the checkpoint is damaged")
                self.fetched.append(rel)
                landed(rel)
            return folder
        return run


def landed_within(wait: Callable[[], object], seconds: float = 0.2) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (wait(), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_each_file_is_handed_out_once_it_has_landed(tmp_path: Path) -> None:
    steps = Steps()
    with Arrival(tmp_path, steps.fetch(tmp_path), FILES, STREAMED) as arrival:
        assert not landed_within(arrival.wait_first)
        steps.go.release()  # state.json
        assert arrival.wait_first() == tmp_path  # the streamed files are still to come
        assert not landed_within(lambda: arrival.wait_for("shard-0"))
        steps.go.release()
        assert arrival.wait_for("shard-0") == tmp_path / "shard-0"
        assert not landed_within(arrival.result)
        steps.go.release()
        steps.go.release()
        assert arrival.result() == tmp_path
        assert arrival.wait_for("not-in-the-checkpoint") == tmp_path / "not-in-the-checkpoint"


def test_a_failed_file_is_raised_to_whoever_waits_for_it_not_for_those_landed(tmp_path: Path) -> None:
    steps = Steps(fail_at="shard-1")
    for _ in FILES:
        steps.go.release()
    with Arrival(tmp_path, steps.fetch(tmp_path), FILES, STREAMED) as arrival:
        with pytest.raises(CorruptCheckpointError, match="shard-1: crc32c differs"):
            arrival.wait_for("shard-2")
        assert arrival.wait_for("shard-0") == tmp_path / "shard-0"
        with pytest.raises(CorruptCheckpointError):
            arrival.result()
    assert steps.fetched == ["state.json", "shard-0"]


def test_closing_early_stops_after_the_file_being_fetched(tmp_path: Path) -> None:
    steps = Steps()
    arrival = Arrival(tmp_path, steps.fetch(tmp_path), FILES, STREAMED)
    steps.go.release()
    arrival.wait_first()
    steps.go.release()  # shard-0 may land; nothing after it
    closer = threading.Thread(target=arrival.close)
    closer.start()
    for _ in FILES:
        steps.go.release()
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert steps.fetched in (["state.json"], ["state.json", "shard-0"], ["state.json", "shard-0", "shard-1"])
    with pytest.raises(RuntimeError, match="closed before all files came down"):
        arrival.result()


def test_a_folder_already_here_is_ready_at_once(tmp_path: Path) -> None:
    with Arrival.already_here(tmp_path) as arrival:
        assert arrival.wait_first() == tmp_path and arrival.wait_for("x") == tmp_path / "x"
        assert arrival.result() == tmp_path
