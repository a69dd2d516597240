"""Progress that reads well everywhere: a bar where one is drawn, plain lines where it is not.

On a terminal (stderr is a TTY) a transfer shows a tqdm bar, cleared when done. In a notebook
(an IPython kernel: Colab, Jupyter) it shows the bar too, then one summary line that stays, so
the saved notebook and nbconvert's output say what was moved. Anywhere else (a log file, a
pipe, a job scheduler) a bar would be one line stuck at 0 %: instead a plain line at most every
`REPORT_EVERY` seconds and one summary line at the end::

    resumable: upload model.keras: 120.0 MB of 288.0 MB (42%), 35.0 MB/s
    resumable: upload model.keras: 288.0 MB in 8.2 s (35.1 MB/s)

`WaitLine` does the same for a wait: a countdown where a line can be rewritten, else the line
once and its outcome. The stream and the clock are arguments, for tests.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from resumable.core.display import human_size

REPORT_EVERY = 10.0  # seconds between plain progress lines

Clock = Callable[[], float]


def in_notebook() -> bool:
    """True inside an IPython kernel (Colab, Jupyter, nbconvert's execution), not IPython in a terminal."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def interactive(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default stderr) shows a rewritten line as one line: a terminal or a notebook."""
    stream = sys.stderr if stream is None else stream
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
    return in_notebook()


class Progress:
    """Bytes moved of one transfer, shown as the stream allows (see the module docstring).

    Use `byte_progress` to make one; `update` adds bytes, `to` sets the total moved, `close`
    ends it (a context manager does too). Several threads may move one (files sent together).
    """

    def __init__(self, size: int, what: str, *, stream: TextIO | None = None, bar: bool | None = None,
                 summary: bool | None = None, every: float = REPORT_EVERY,
                 clock: Clock = time.monotonic) -> None:
        self.size = size
        self.what = what
        self.done = 0
        self._stream = sys.stderr if stream is None else stream
        kernel = in_notebook()
        self._bar: Any = None
        if bar if bar is not None else interactive(self._stream):
            from tqdm import tqdm

            self._bar = tqdm(total=size, desc=f"resumable: {what}", unit="B", unit_scale=True,
                             unit_divisor=1024, leave=False, mininterval=0.5, file=self._stream)
        self._summary = summary if summary is not None else (self._bar is None or kernel)
        self._every = every
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self._closed = False
        self._lock = threading.Lock()

    def update(self, n: int) -> None:
        with self._lock:
            self._to(self.done + n)

    def to(self, done: int) -> None:
        with self._lock:
            self._to(done)

    def _to(self, done: int) -> None:
        step = done - self.done
        self.done = done
        if self._bar is not None:
            if step:
                self._bar.update(step)
            return
        now = self._clock()
        if now - self._last_line >= self._every and self.done < self.size:
            self._last_line = now
            percent = f" ({100 * self.done // self.size}%)" if self.size else ""
            self._print(f"{human_size(self.done)} of {human_size(self.size)}{percent}, "
                        f"{_rate(self.done, now - self._started)}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if not self._summary:
            return
        seconds = self._clock() - self._started
        if self.done >= self.size:
            self._print(f"{human_size(self.done)} in {seconds:.1f} s ({_rate(self.done, seconds)})")
        else:
            self._print(f"stopped after {human_size(self.done)} of {human_size(self.size)}")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _print(self, text: str) -> None:
        print(f"resumable: {self.what}: {text}", file=self._stream, flush=True)


def byte_progress(size: int, what: str, **options: Any) -> Progress:
    """A `Progress` of ``size`` bytes described as ``what`` ("upload model.keras"); see `Progress`."""
    return Progress(size, what, **options)


def fsspec_callback(progress: Progress, *, relative: bool = False) -> Any:
    """An fsspec ``Callback`` that moves ``progress`` (for ``fs.get_file(..., callback=)``).

    ``relative``: the file's bytes add to ``progress``, which counts several files.
    """
    from fsspec.callbacks import Callback

    class _Moved(Callback):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.counted = 0

        def call(self, *args: Any, **kwargs: Any) -> None:
            if not relative:
                progress.to(int(self.value))
                return
            step, self.counted = int(self.value) - self.counted, int(self.value)
            progress.update(step)

    return _Moved(size=None if relative else progress.size)


class WaitLine:
    """One line for a wait: rewritten with a countdown where that shows as one line, else said twice.

    ``with WaitLine("resumable: waiting up to 40 s for ...") as wait:`` then `left` with the
    seconds left, and `end` with what happened.
    """

    def __init__(self, text: str, *, stream: TextIO | None = None, clock: Clock = time.monotonic) -> None:
        self.text = text
        self._stream = sys.stderr if stream is None else stream
        self._live = interactive(self._stream)
        self._clock = clock
        self._started = clock()
        self._shown = ""
        self._seconds: int | None = None
        self._ended = False

    def __enter__(self) -> WaitLine:
        if self._live:
            self._rewrite(self.text)
        else:
            self._write(self.text + "\n")
        return self

    def left(self, seconds: float) -> None:
        """The countdown: ``... (12 s left)``, rewritten once a second where a line can be."""
        whole = int(seconds + 0.999)
        if self._live and whole != self._seconds:
            self._seconds = whole
            self._rewrite(f"{self.text} ({whole} s left)")

    def end(self, outcome: str) -> None:
        """What the wait came to, with how long it took."""
        self._ended = True
        text = f"{outcome} ({self._clock() - self._started:.0f} s)"
        if self._live:
            self._rewrite(f"{self.text}: {text}")
            self._write("\n")
        else:
            self._write(f"resumable: {text}\n")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live and not self._ended:
            self._write("\n")

    def _rewrite(self, line: str) -> None:
        pad = " " * max(0, len(self._shown) - len(line))
        self._shown = line
        self._write(f"\r{line}{pad}")

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


def _rate(done: int, seconds: float) -> str:
    return f"{human_size(int(done / seconds))}/s" if seconds > 0 else "-"


__all__ = ["REPORT_EVERY", "Progress", "WaitLine", "byte_progress", "fsspec_callback", "in_notebook",
           "interactive"]
