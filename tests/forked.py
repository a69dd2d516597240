"""Run a job script in a process forked from a server that imported Keras already (tests/jobs/fork_server.py).

    done = run_job(JOBS / "train_job.py", [url, "--epochs", "3"])        # like subprocess.run
    job = start_job(JOBS / "train_job.py", [url], stderr=log)            # like subprocess.Popen
    for line in job.stdout: ...; job.send_signal(signal.SIGKILL); job.wait(30)

A job started this way is a process of its own (its pid, its signals, its exit status, its atexit
hooks), but skips the 5-7 s that importing TensorFlow and Keras takes. One server per Keras
backend (the job's KERAS_BACKEND) and preload list lives as long as the test session. A job
may set what JAX reads when its backend starts (XLA_FLAGS, jax.distributed): the server
imports JAX but never starts it. Use a real fresh process instead for what a fork would hide:
what importing does, variables read at import or at a process' start (TensorFlow's,
MALLOC_*), the command line itself (``python -m``, IPython).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paths import JOBS

SERVER = JOBS / "fork_server.py"


class _Server:
    """One fork server process and the thread that reads its CHILD and EXIT lines."""

    def __init__(self, env: Mapping[str, str], preload: tuple[str, ...]) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen([sys.executable, str(SERVER), *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
                                     env=dict(env))
        self._started: dict[int, queue.Queue[int]] = {}
        self._exits: dict[int, int] = {}
        self._exited = threading.Condition()
        self._ids = itertools.count()
        self._send = threading.Lock()
        ready: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()
        line = ready.get(timeout=300)
        if line != "SERVER READY":
            self._log.seek(0)
            raise RuntimeError("the fork server did not start:\n" + self._log.read().decode()[-4000:])

    def _read(self, ready: queue.Queue[str]) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            word, *rest = text.split()
            if word == "SERVER":
                ready.put(text.strip())
            elif word == "CHILD":
                pid = int(rest[1])
                with self._exited:  # the pid of a job that ended before: its status is not this one's
                    self._exits.pop(pid, None)
                self._started[int(rest[0])].put(pid)
            elif word == "EXIT":
                with self._exited:
                    self._exits[int(rest[0])] = int(rest[1])
                    self._exited.notify_all()
        ready.put("EOF")
        with self._exited:
            self._exits[-1] = -1  # the server is gone: nobody waits forever
            self._exited.notify_all()

    def start(self, request: dict[str, Any]) -> int:
        with self._send:
            request["id"] = next(self._ids)
            started: queue.Queue[int] = queue.Queue()
            self._started[request["id"]] = started
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        try:
            return started.get(timeout=60)
        finally:
            del self._started[request["id"]]

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """The job's return code once it ended, None if it still runs after ``timeout`` s."""
        with self._exited:
            self._exited.wait_for(lambda: pid in self._exits or -1 in self._exits, timeout)
            if pid not in self._exits and -1 in self._exits:
                raise RuntimeError("the fork server died")
            return self._exits.get(pid)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()  # the server kills what still runs, reaps it and exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


_servers: dict[tuple[str, tuple[str, ...]], _Server] = {}
_lock = threading.Lock()
# XLA compiling the same small models again and again is most of a JAX job's CPU time (the
# input matrix's JAX half alone: 110 s, 42 s with this cache). JAX reads its cache's settings
# when it is imported, so they are the server's; a program read from the cache is the one
# compiled before, and the jobs' bit-for-bit comparisons mix read and compiled ones.
_jax_cache = tempfile.TemporaryDirectory(prefix="resumable-jax-cache-")
JAX_CACHE = {"JAX_COMPILATION_CACHE_DIR": _jax_cache.name, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _server(env: Mapping[str, str], preload: tuple[str, ...]) -> _Server:
    backend = env.get("KERAS_BACKEND", "tensorflow")
    key = (backend, preload)
    with _lock:
        if key not in _servers:
            # JAX reads JAX_PLATFORMS and its cache's settings when it is imported; XLA_FLAGS
            # is each job's own
            fixed = {"JAX_PLATFORMS": "cpu", **JAX_CACHE} if backend == "jax" else {}
            server_env = {**{k: v for k, v in env.items() if k != "XLA_FLAGS"}, **fixed}
            _servers[key] = _Server(server_env, preload)
        return _servers[key]


@atexit.register
def _close_servers() -> None:
    for server in _servers.values():
        server.close()
    _jax_cache.cleanup()


def job_env(backend: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a job: quiet TensorFlow, no gcsfs probe, Keras on ``backend``
    (this process's KERAS_BACKEND by default), no XLA_FLAGS from outside, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "3", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"})
    if backend:
        env["KERAS_BACKEND"] = backend
    return {**env, **extra}


class ForkedJob:
    """A running job, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, script: Path, argv: list[str], env: Mapping[str, str] | None = None,
                 stderr: Path | None = None, merge_stderr: bool = False, cwd: Path | None = None,
                 output: Path | None = None, preload: tuple[str, ...] = ()) -> None:
        env = dict(job_env() if env is None else env)
        self._folder = tempfile.TemporaryDirectory(prefix="job-")
        self._stderr_path = Path(stderr) if stderr else Path(self._folder.name) / "stderr"
        self._server = _server(env, tuple(preload))
        request = {"script": str(script), "argv": [str(a) for a in argv], "env": env,
                   "cwd": str(cwd or os.getcwd())}
        if output is not None:  # both streams into one file, as ``> output 2>&1``
            self.pid = self._server.start({**request, "stdout": str(output), "stderr": None})
            self.stdout = open(os.devnull, encoding="utf-8")  # noqa: SIM115
        else:
            fifo = Path(self._folder.name) / "stdout"
            os.mkfifo(fifo)
            # open the reading end first (without blocking), so the server's open for writing returns
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            self.pid = self._server.start({**request, "fifo": True, "stdout": str(fifo),
                                           "stderr": None if merge_stderr else str(self._stderr_path)})
            os.set_blocking(reader, True)  # the child holds the writing end now: EOF means it ended
            self.stdout = open(reader, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.returncode: int | None = None
        self.args = [str(script), *argv]
        self._lines: queue.Queue[str | None] | None = None
        self.output_ended = False

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.wait(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def next_line(self, timeout: float) -> str | None:
        """The next line of stdout (read on a thread from then on: do not also iterate ``stdout``);
        None once ``timeout`` s pass first, or at the end of the output (then ``output_ended``)."""
        if self._lines is None:
            self._lines = queue.Queue()
            threading.Thread(target=self._read_lines, args=(self._lines,), daemon=True).start()
        if self.output_ended:
            return None
        try:
            text = self._lines.get(timeout=max(timeout, 0))
        except queue.Empty:
            return None
        self.output_ended = text is None
        return text

    def _read_lines(self, lines: queue.Queue[str | None]) -> None:
        for text in self.stdout:
            lines.put(text.rstrip("\n"))
        lines.put(None)

    def stderr_text(self) -> str:
        return self._stderr_path.read_text(errors="replace") if self._stderr_path.exists() else ""

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Everything the job prints on stdout until it ends, and its stderr; kill it on timeout."""
        timer = threading.Timer(timeout, self.kill) if timeout else None
        if timer:
            timer.start()
        try:
            out = self.stdout.read()
        finally:
            if timer:
                timer.cancel()
        self.wait(timeout=30)
        self.stdout.close()
        return out, self.stderr_text()

    def __del__(self) -> None:
        if not self.stdout.closed:
            self.stdout.close()


class WatchedJob:
    """A forked job whose stdout lines a test waits for and keeps (``lines``), its stderr in
    the file ``log``: to kill at a chosen line, or to read what it said once it ended."""

    def __init__(self, script: Path, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.log = log
        self.job = start_job(script, argv, env=env, stderr=log)
        self.lines: list[str] = []

    def next(self, timeout: float) -> str | None:
        """The next line, None at the end of the output or when ``timeout`` s pass first."""
        text = self.job.next_line(timeout)
        if text is not None:
            self.lines.append(text)
        return text

    def wait_for(self, prefix: str, timeout: float) -> str:
        """The first line from now on that starts with ``prefix``; AssertionError, with the
        output, if the job ends or ``timeout`` s pass first."""
        deadline = time.monotonic() + timeout
        while (text := self.next(deadline - time.monotonic())) is not None:
            if text.startswith(prefix):
                return text
        why = "ended without" if self.job.output_ended else f"within {timeout} s, no"
        raise AssertionError(f"{why} a {prefix!r} line:\n{self.output}")

    def line(self, prefix: str) -> str:
        """The first line kept that starts with ``prefix``."""
        return next(text for text in self.lines if text.startswith(prefix))

    def kill(self) -> None:
        self.job.kill()

    def finish(self, timeout: float = 300) -> int:
        """Its return code once it ended, every line it printed kept."""
        code = self.job.wait(timeout=timeout)
        while self.next(10) is not None:
            pass
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines) + "\n--- stderr ---\n" + self.log.read_text(errors="replace")[-4000:]


def start_job(script: Path, argv: list[str], env: Mapping[str, str] | None = None,
              stderr: Path | None = None, merge_stderr: bool = False, cwd: Path | None = None,
              output: Path | None = None, preload: tuple[str, ...] = ()) -> ForkedJob:
    """Start ``python script *argv`` as a child of the fork server: its stdout read line by line from
    ``job.stdout``, its stderr in the file ``stderr`` (or in stdout with ``merge_stderr``); or
    both written to the file ``output``. ``preload``: more modules the job's server imports once
    (a server of their own per backend, so that jobs without them never find them imported)."""
    return ForkedJob(script, argv, env=env, stderr=stderr, merge_stderr=merge_stderr, cwd=cwd, output=output,
                     preload=preload)


def run_job(script: Path, argv: list[str], env: Mapping[str, str] | None = None, timeout: float = 300,
            cwd: Path | None = None, preload: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, script, *argv], capture_output=True, text=True)``, forked."""
    job = start_job(script, argv, env=env, cwd=cwd, preload=preload)
    out, err = job.communicate(timeout=timeout)
    return subprocess.CompletedProcess(job.args, job.wait(), out, err)
