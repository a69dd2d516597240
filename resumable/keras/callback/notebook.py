"""Notebook cells (IPython, Jupyter, Colab): run something once the cell running now has ended.

Keras calls no ``on_train_end`` when an exception leaves ``model.fit`` (Ctrl-C, Colab's stop
button, an error in the data), so the callback cannot tell that training is over; in a
notebook, the end of the cell that ran ``fit`` can. Outside IPython nothing is registered.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("resumable")


def after_this_cell(action: Callable[[], None]) -> bool:
    """Call ``action`` once, after the IPython cell now running ends; False if there is none.

    Only from IPython's main thread: a ``fit`` in a thread of its own may outlive its cell.
    ``action`` runs in IPython's ``post_run_cell`` event, before the next cell; an error in it
    is logged, never raised into the notebook.
    """
    shell = _running_shell()
    if shell is None or threading.current_thread() is not threading.main_thread():
        return False

    def once(*_: Any) -> None:
        shell.events.unregister("post_run_cell", once)
        try:
            action()
        except (Exception, KeyboardInterrupt) as e:  # the cell is over: a traceback would only confuse
            logger.warning("resumable: after the cell: %s", e or type(e).__name__)

    shell.events.register("post_run_cell", once)
    return True


def _running_shell() -> Any:
    ipython = sys.modules.get("IPython")  # never imported: not a notebook, and no import cost
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    return shell if hasattr(shell, "events") else None
