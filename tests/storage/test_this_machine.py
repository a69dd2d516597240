"""this_machine: the host, boot and process facts a writer lease records and judges by."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest

from resumable.storage import lease_info, this_machine
from resumable.storage.lease_info import LeaseInfo

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux, as on Colab)")


@needs_proc
def test_a_process_start_tells_a_live_process_from_a_gone_one() -> None:
    assert this_machine.own_process_start() == this_machine.process_start(os.getpid()) is not None
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    assert this_machine.process_start(int(child.stdout)) == -1  # exited and reaped


def test_now_is_utc_to_the_millisecond_as_lease_json_stores_it() -> None:
    moment = lease_info.wall_clock()
    assert moment.tzinfo == dt.timezone.utc and moment.microsecond % 1000 == 0


def test_a_lease_judges_by_this_machine_s_host(monkeypatch: pytest.MonkeyPatch) -> None:
    now = lease_info.wall_clock()
    ours = LeaseInfo(token="t", host=this_machine.HOST, pid=os.getpid(), started=now, renewed=now, timeout=40,
                     process_start=this_machine.own_process_start(), boot_id=this_machine.BOOT_ID)
    assert ours.mine() and ours.on_this_machine()
    monkeypatch.setattr(this_machine, "HOST", "another-host")  # as the tests play another machine
    assert not ours.mine() and not ours.on_this_machine() and not ours.process_gone()
