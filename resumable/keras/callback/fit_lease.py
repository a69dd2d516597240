"""The run folder held for a fit (`CheckpointCallback`): the writer lease taken when a fit
begins, the folder checked to continue the run it holds, and the lease given back when the fit
ends, after an exception (Keras then calls no ``on_train_end``) or when the notebook cell that
ran the fit ends.

A model split across the processes of a multi-host job (#36) is saved by every process: that
is decided here by every process, at the fit's start, and process 0 takes the folder for all.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import keras

from resumable.core import user_warnings
from resumable.keras import topology
from resumable.keras.callback import notebook
from resumable.keras.callback.commit_lines import CommitLines
from resumable.keras.callback.save_options import SaveOptions
from resumable.keras.checkpoint import training_state
from resumable.keras.multihost import split_job
from resumable.manager import CheckpointInfo
from resumable.manager.run_manager import RunManager


class FitLease:
    """The writer's side of one callback's fits, through ``manager``."""

    def __init__(self, options: SaveOptions, manager: RunManager, lines: CommitLines) -> None:
        self.options = options
        self.manager = manager
        self.lines = lines
        self._fit_in_main_thread = False  # where the fit holding the lease began (see after_the_cell)
        self._cell_watched = False  # after_the_cell is registered for the notebook cell running now

    def begin(self, model: keras.Model, strategy: Any, restored: CheckpointInfo | None,
              epochs_done: int) -> int:
        """A fit of ``model`` begins (the run restored from checkpoint ``restored``, None for a
        new run, with ``epochs_done``): take the run folder; the epochs done it holds."""
        name = restored.name if restored is not None else None
        self.every_process_writes(model)  # #36: decided by every process before any save
        if self.manager.job is not None:  # #36: every process learns whether process 0 could take the folder
            def take() -> dict[str, Any]:
                return {"epochs_done": self._take_run_folder(model, name, epochs_done)}
            epochs_done = int(self.manager.job.start(take).get("epochs_done", epochs_done))
        elif topology.is_chief(model, strategy):
            epochs_done = self._take_run_folder(model, name, epochs_done)
        if topology.is_chief(model, strategy):
            self._fit_in_main_thread = threading.current_thread() is threading.main_thread()
            if not self._cell_watched:
                self._cell_watched = notebook.after_this_cell(self.after_the_cell)
        return epochs_done

    def every_process_writes(self, model: keras.Model | None) -> None:
        """#36: a model split across the processes of a multi-host job: every process saves its part
        (`split_job.py`) and process 0 commits. Decided once, by every process, at the fit's start."""
        if self.manager.job is not None or not split_job.split_across_processes(model):
            return
        if self.options.save_trainable_only:
            raise ValueError(
                "Invalid value for argument `save_trainable_only`. Received: save_trainable_only=True for a "
                "model split across processes. Expected False: each process saves the parts it holds.")
        split_job.check_installed()
        self.manager.writer.every_process_writes(split_job.channel(self.manager.storage.url),
                                                 self.options.barrier_timeout)

    def _take_run_folder(self, model: keras.Model, restored: str | None, epochs_done: int) -> int:
        """The writer's start: the lease, then the run folder checked (given back if that fails);
        the epochs done, which the other processes of a split job take from process 0."""
        self.manager.writer.acquire()
        try:
            # Refuse to mix a new training run into a folder that already holds one.
            found = self.manager.check_continues(restored, training_state.iterations(model))
        except BaseException:
            self.manager.release()
            raise
        return epochs_done if found is None else found

    def lease_note(self) -> str | None:
        """For `resume`'s line: what run.fit does with another process' writer lease, in a few
        words ("taking over the writer lease of a process that is gone"), that takeover then
        logged and not warned again; None without one. A live writer that would stop run.fit is
        warned of at once (its loading needs no lease)."""
        found = self.manager.other_writer()
        if found is None:
            return None
        holder, server_age = found
        left = holder.left_behind(server_age)
        if left is None and self.manager.takeover:
            left = f"of {holder.describe()}, as takeover=True asks"
        elif left is None:
            if holder.blocks(server_age):
                user_warnings.warn(
                    f"resumable: {self.options.filepath} is being written by another process "
                    f"({holder.describe()}); run.fit will stop with LeaseHeldError unless that process stops "
                    "or you pass takeover=True")
            return None  # another machine's silent lease: run.fit watches it, saying so
        self.manager.writer.lease.announced = holder.token
        return f"taking over the writer lease {left}"

    def end_after_error(self) -> None:
        """An exception ended the fit (`checkpoint_callback.gives_lease_back_on_error`, `after_the_cell`):
        print the lines held, land the uploads, give the lease back."""
        self.lines.print_lines(fit_ended=True)
        self.manager.finish(quiet=True)

    def after_the_cell(self) -> None:
        """The notebook cell that ran this fit has ended: if an exception ended the fit (Keras
        then calls no on_train_end), land the uploads and give the lease back, as run.fit does."""
        self._cell_watched = False
        if not (self.manager.writer.lease.held and self._fit_in_main_thread):
            return  # on_train_end or run.fit gave it back; or a fit in another thread still runs
        pending = self.manager.pending
        if pending:
            print(f"resumable: model.fit was interrupted; finishing the upload of {', '.join(pending)} to "
                  f"{self.manager.storage.url} ...", file=sys.stderr, flush=True)
        self.end_after_error()


__all__ = ["FitLease"]
