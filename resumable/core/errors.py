"""Every error resumable raises, under one root.

Each message is one line that names the path or argument involved and says what to do.
Subclasses also inherit the matching built-in so ``except FileNotFoundError`` keeps working.
"""

from __future__ import annotations


class ResumableError(Exception):
    """Root of every error raised by resumable."""

    def _render_traceback_(self) -> list[str]:
        """What IPython, Jupyter and Colab show instead of a traceback: the one line that says what to do
        (a typo'd bucket, Drive not mounted, a lease held elsewhere), not the frames inside resumable."""
        return [f"{type(self).__name__}: {self}"]


class StorageError(ResumableError, OSError):
    """The run folder could not be read or written (after retries, where retrying made sense)."""


class RunNotFoundError(StorageError, FileNotFoundError):
    """The bucket or folder a URL points at does not exist."""


class DriveNotMountedError(RunNotFoundError):
    """A run folder under ``/content/drive/`` while Google Drive is not mounted there (a new Colab VM)."""


class NotAFolderError(StorageError, NotADirectoryError):
    """The URL points at a file where a run folder was expected."""


class StoragePermissionError(StorageError, PermissionError):
    """The storage answered that this account may not read or write the path."""


class NotAuthenticatedError(StorageError, PermissionError):
    """No usable Google Cloud credentials."""


class NoSpaceError(StorageError):
    """The disk, the Drive quota or the staging folder is full; the message says how much is needed."""


class CheckpointNotFoundError(ResumableError, FileNotFoundError):
    """No (good) checkpoint matches what was asked for."""


class CheckpointExistsError(ResumableError, FileExistsError):
    """A committed checkpoint already has this name; resumable never overwrites one."""


class CorruptCheckpointError(ResumableError):
    """A checkpoint's files disagree with its manifest, or its manifest is unreadable."""


class UnsupportedFormatError(CorruptCheckpointError):
    """The manifest was written by a newer version of resumable."""


class CheckpointMismatchError(ResumableError, ValueError):
    """A checkpoint does not fit the model it is loaded into (architecture or optimizer)."""


class LeaseHeldError(ResumableError):
    """Another process holds the run folder's writer lease; the message names it and how to take over."""


class LeaseLostError(ResumableError):
    """This process's writer lease was taken over (or removed): it stops writing to the run folder."""

    def _render_traceback_(self) -> list[str]:
        """What IPython, Jupyter and Colab show instead of a traceback: the one line that says it all."""
        return [f"{type(self).__name__}: {self}"]


class BarrierTimeoutError(ResumableError, TimeoutError):
    """A process of a multi-host job waited its ``barrier_timeout`` for the others at a save or a
    resume; the message names the processes it waited for."""
