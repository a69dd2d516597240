"""A job server: imports Keras once, then forks one process per job script it is asked to run.

    python tests/jobs/fork_server.py [MODULE ...]     (started by tests/forked.py, never by hand)

Importing TensorFlow and Keras takes 5-7 s here, most of a small training job's time. This
process pays it once on the backend KERAS_BACKEND names (and imports the MODULEs named, such
as keras_hub, which imports TensorFlow even on JAX: a server of its own), then reads one JSON request per line
on stdin::

    {"id": 3, "script": "tests/jobs/train_job.py", "argv": [...], "env": {...}, "cwd": "...",
     "stdout": "path or FIFO", "stderr": "path (appended to), or null to share stdout's"}

and forks: the child takes the request's environment, working folder, ``sys.argv`` and
``sys.path[0]``, sends its output to the given files and runs the script as ``__main__``; it then
exits as a fresh process would (atexit hooks and non-daemon threads included), with the script's
exit code. The server prints ``CHILD <id> <pid>`` once the child holds its output files and
``EXIT <pid> <returncode>`` (``-N`` for signal N, as subprocess reports it) when it ends.
Each job is a process of its own: signals reach only it, SIGKILL ends it, its lease names its pid.
What a job cannot change is what the server fixed at import: the Keras backend and the variables
TensorFlow reads when it is imported.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def preload(modules: list[str]) -> None:
    """The expensive imports every job shares."""
    import importlib

    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow  # noqa: F401
    import numpy  # noqa: F401

    import resumable.keras.run  # noqa: F401

    for name in modules:
        importlib.import_module(name)


def open_output(request: dict) -> tuple[int, int]:
    """The child's stdout and stderr, opened before the fork so that CHILD means they are held."""
    flags = os.O_WRONLY if request.get("fifo") else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    out = os.open(request["stdout"], flags)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND) if request.get("stderr") else out
    return out, err


def run_child(request: dict, out: int, err: int) -> int:
    """In the forked child: become the job's process and run its script; return its exit code."""
    import runpy
    import tempfile

    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {null, out, err}:
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # from the job's TMPDIR
    os.chdir(request["cwd"])
    script = request["script"]
    sys.argv = [script, *request["argv"]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # as the interpreter reports an uncaught exception
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def serve() -> int:
    """Fork a job per request; report each child's pid and exit status. Returns in each child."""
    preload(sys.argv[1:])
    print("SERVER READY", flush=True)
    pending = b""
    children: set[int] = set()
    open_stdin = True
    while open_stdin or children:
        readable, _, _ = select.select([0] if open_stdin else [], [], [], 0.02)
        if readable:
            chunk = os.read(0, 1 << 16)
            open_stdin = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                out, err = open_output(request)
                pid = os.fork()
                if pid == 0:
                    return run_child(request, out, err)
                os.close(out)
                if err != out:
                    os.close(err)
                children.add(pid)
                print(f"CHILD {request['id']} {pid}", flush=True)
        if not open_stdin:
            for pid in children:  # the tests ended: no job outlives them
                os.kill(pid, signal.SIGKILL)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            print(f"EXIT {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
