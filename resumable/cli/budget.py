"""How long one storage operation of a command may retry and wait before the command gives up.

Training retries a failing storage for minutes (see `resumable.storage.retry`); a command
someone waits for at a terminal should say what is wrong sooner. Each storage operation of a
command (a listing, a read, a delete) gets ``--timeout`` seconds in all, its retries and its
waits for answers included; else ``RESUMABLE_CLI_TIMEOUT``; else `DEFAULT` (30 s). A healthy
command may take longer: the budget bounds each operation, not the whole command.
"""

from __future__ import annotations

import math
import os

from resumable.core.errors import ResumableError
from resumable.storage import RunStorage
from resumable.storage.retry import RetryPolicy

DEFAULT = 30.0
VARIABLE = "RESUMABLE_CLI_TIMEOUT"

_policy = RetryPolicy(budget=DEFAULT)


def set_budget(seconds: float | None) -> None:
    """This command's budget: ``seconds`` (``--timeout``), else `VARIABLE`, else `DEFAULT`.

    Raises ResumableError (bad input: exit code 2) for a value that is not a positive number.
    """
    global _policy
    source = "--timeout"
    if seconds is None:
        text = os.environ.get(VARIABLE, "").strip()
        source = f"{VARIABLE}={text!r}"
        try:
            seconds = float(text) if text else DEFAULT
        except ValueError:
            seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ResumableError(f"{source}: expected a positive number of seconds, e.g. 30")
    _policy = RetryPolicy(budget=float(seconds))


def bounded(storage: RunStorage) -> RunStorage:
    """``storage``, its operations within this command's budget."""
    storage.retry = _policy
    return storage
