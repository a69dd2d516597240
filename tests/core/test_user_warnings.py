"""Warnings point at the user's line; from resumable's own background threads, at the thread."""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from resumable.core import user_warnings
from resumable.manager import background


def test_a_warning_raised_for_a_users_call_points_at_the_users_line() -> None:
    with pytest.warns(UserWarning, match="resumable: look") as caught:
        user_warnings.warn("resumable: look")  # this line
    assert caught[0].filename == __file__


def test_a_thread_the_user_started_still_points_at_the_users_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=lambda: user_warnings.warn("resumable: from my thread"))
        thread.start()
        thread.join()
    assert [w.filename for w in caught] == [__file__]


def test_a_warning_from_resumables_own_worker_thread_names_the_thread_in_one_line() -> None:
    worker = background.Worker("resumable-test-worker", user_warnings.warn)  # no frame of the user's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker.enqueue("resumable: upload failed")
        assert worker.join(timeout=30)
    [w] = caught
    assert (w.filename, w.lineno, str(w.message)) == ("resumable-test-worker", 0, "resumable: upload failed")
    shown = warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
    assert shown == "resumable-test-worker:0: UserWarning: resumable: upload failed\n"


def test_a_warning_from_a_pool_thread_with_no_user_frame_names_the_thread() -> None:
    with warnings.catch_warnings(record=True) as caught, ThreadPoolExecutor(1, "resumable-pool") as pool:
        warnings.simplefilter("always")
        pool.submit(user_warnings.warn, "resumable: from the pool").result()
    assert [w.filename for w in caught] == ["resumable-pool_0"]


def test_a_filter_on_module_resumable_silences_background_warnings() -> None:
    worker = background.Worker("resumable-test-worker", user_warnings.warn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module="resumable")
        worker.enqueue("resumable: upload failed")
        assert worker.join(timeout=30)
    assert caught == []
