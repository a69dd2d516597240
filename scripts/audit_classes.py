"""The second set of hostile_audit.py's cases: files NumPy or Keras refuse, wrong clocks, failing
servers, a checkpoint damaged after its commit. See hostile_audit.py for the counts.

Each case returns nothing; it appends what went wrong to the `Outcome` it is given. Only public
API is used (resume(), the CLI, RunStorage, the lease), so the same cases count the code of
any version: the figures before and after in docs/reliability.md come from this file.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import time
import traceback
import tracemalloc
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MEMORY_BOUND = 128 * 2**20  # bytes a resume of these tiny checkpoints may peak at, a bomb included
SLOW = 35.0  # seconds: a command's one line must come sooner against a failing server
CONTROL = "\x1b\x07"

Case = Callable[[Path, Any], None]  # (a folder of its own, the Outcome) -> None
CLASSES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CLASSES[name] = fn
        return fn
    return register


def run_classes(names: list[str], base: Path, outcome_type: type) -> list[Any]:
    outcomes = []
    try:
        for i, name in enumerate(names):
            outcome = outcome_type(name)
            folder = base / f"class-{i}"
            folder.mkdir(parents=True)
            try:
                CLASSES[name](folder, outcome)
            except Exception:
                outcome.tracebacks.append(f"{name}: {traceback.format_exc(limit=4)}")
            outcomes.append(outcome)
    finally:
        _Server.stop()
    return outcomes


@contextlib.contextmanager
def captured() -> Iterator[io.StringIO]:
    """stdout, stderr and the resumable logger's lines, as a terminal would show them."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        handler = logging.StreamHandler(text)
        logging.getLogger("resumable").addHandler(handler)
        try:
            yield text
        finally:
            logging.getLogger("resumable").removeHandler(handler)


# ----------------------------------------------------------------------------- files Keras reads back


def _keras_run(folder: Path) -> tuple[str, Callable[[], Any]]:
    """A real run of two checkpoints of a tiny Keras model; its URL and model builder."""
    import keras
    import numpy as np

    import resumable

    def build() -> Any:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dropout(0.1),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    template = _Templates.keras
    if template is None:
        template = _Templates.keras = folder.parent / "keras-template"
        x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
        with captured():
            resumable.resume(str(template), build_model=build, async_upload=False).fit(
                x, x[:, :1], epochs=2, batch_size=16, verbose=0)
        (template / "lease.json").unlink(missing_ok=True)
    url = folder / "run"
    shutil.copytree(template, url)
    return str(url), build


class _Templates:
    keras: Path | None = None


def _replace(run: Path, rel: str, data: bytes, name: str = "ckpt-000002") -> None:
    """Rewrite a committed file and its manifest entry, as whoever writes the run folder can."""
    from resumable.core.checksum import crc32c_of_bytes

    (run / name / rel).write_bytes(data)
    manifest = json.loads((run / name / "manifest.json").read_text())
    manifest["files"][rel] = {"size": len(data), "crc32c": crc32c_of_bytes(data)}
    (run / name / "manifest.json").write_text(json.dumps(manifest))
    (run / "index.json").unlink(missing_ok=True)


def _resume_falls_back(folder: Path, outcome: Any, rel: str, data: Callable[[Path], bytes],
                       build_model: bool = True) -> None:
    """After replacing ``rel`` of the newest checkpoint: resume() must load the older one, in bounds."""
    import resumable
    from resumable.core.errors import ResumableError

    url, build = _keras_run(folder)
    _replace(Path(url), rel, data(Path(url) / "ckpt-000002" / rel))
    tracemalloc.start()
    try:
        with captured() as text, warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            try:
                run = resumable.resume(url, build_model=build if build_model else None, async_upload=False)
                outcome.resumed = run.checkpoint.name if run.checkpoint else None
            except ResumableError as e:
                print(f"error: {e}")
            except Exception:
                outcome.tracebacks.append(f"resume(): {traceback.format_exc(limit=3)}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if outcome.resumed != "ckpt-000001" and not outcome.tracebacks:
        said = text.getvalue()[-300:]
        outcome.committed_lost.append(f"resume() loaded {outcome.resumed}, not ckpt-000001: {said}")
    if peak > MEMORY_BOUND:
        outcome.memory.append(f"resume() peaked at {peak / 2**20:.0f} MB")
    if any(c in text.getvalue() for c in CONTROL):
        outcome.control_chars.append("resume() printed a control character")


def _npz(**arrays: Any) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    body = text + b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


def _bomb(size: int) -> bytes:
    """An arrays.npz of ``size`` zero bytes, deflated to about a thousandth of that."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("seed_generators/0.npy", "w", force_zip64=True) as f:
        f.write(_npy_header("|u1", (size,)))
        for _ in range(size // 2**20):
            f.write(bytes(2**20))
    return buffer.getvalue()


def _with_config(model_file: Path, change: Callable[[dict[str, Any]], None]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(model_file) as source, zipfile.ZipFile(buffer, "w") as target:
        for member in source.infolist():
            data = source.read(member)
            if member.filename == "config.json":
                config = json.loads(data)
                change(config)
                data = json.dumps(config).encode()
            target.writestr(member, data)
    return buffer.getvalue()


def _insert_layer(layer: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda config: config["config"]["layers"].insert(1, layer)


@case("arrays-npz-object-array")
def _(folder: Path, outcome: Any) -> None:
    import numpy as np

    _resume_falls_back(folder, outcome, "arrays.npz",
                       lambda _: _npz(**{"seed_generators/0": np.array([{"a": 1}], dtype=object)}))


@case("arrays-npz-not-a-zip")
def _(folder: Path, outcome: Any) -> None:
    _resume_falls_back(folder, outcome, "arrays.npz", lambda _: b"not a zip" * 100)


@case("arrays-npz-header-asks-4-tb")
def _(folder: Path, outcome: Any) -> None:
    def lying(_: Path) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("seed_generators/0.npy", _npy_header("<u4", (2**40,)) + bytes(8))
        return buffer.getvalue()

    _resume_falls_back(folder, outcome, "arrays.npz", lying)


@case("arrays-npz-inflates-to-512-mb")
def _(folder: Path, outcome: Any) -> None:
    _resume_falls_back(folder, outcome, "arrays.npz", lambda _: _bomb(512 * 2**20))


@case("model-keras-lambda-layer")
def _(folder: Path, outcome: Any) -> None:
    code = ("4wEAAAAAAAAAAAAAAAEAAAACAAAAQwAAAHMEAAAAfABTACkBTqkAKQHaAXhyAQAAAHIBAAAA+gg8c3RkaW4+"
            "2gg8bGFtYmRhPgEAAABzAAAAAA==")  # marshalled `lambda x: x`: safe mode must refuse it unrun
    function = {"class_name": "__lambda__", "config": {"code": code, "defaults": None, "closure": None}}
    lambda_layer = {"module": "keras.layers", "class_name": "Lambda",
                    "config": {"name": "evil", "function": function}, "build_config": None}
    _resume_falls_back(folder, outcome, "model.keras",
                       lambda path: _with_config(path, _insert_layer(lambda_layer)), build_model=False)


@case("model-keras-module-os")
def _(folder: Path, outcome: Any) -> None:
    layer = {"module": "os", "class_name": "system", "config": {"name": "evil"}, "registered_name": None}
    _resume_falls_back(folder, outcome, "model.keras", lambda path: _with_config(path, _insert_layer(layer)),
                       build_model=False)


@case("model-keras-not-a-zip")
def _(folder: Path, outcome: Any) -> None:
    _resume_falls_back(folder, outcome, "model.keras", lambda _: b"garbage" * 100)


@case("model-keras-weights-not-hdf5")
def _(folder: Path, outcome: Any) -> None:
    def broken(path: Path) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(path) as source, zipfile.ZipFile(buffer, "w") as target:
            for member in source.infolist():
                data = bytes(4096) if member.filename == "model.weights.h5" else source.read(member)
                target.writestr(member, data)
        return buffer.getvalue()

    _resume_falls_back(folder, outcome, "model.keras", broken, build_model=False)


# ----------------------------------------------------------------------------- clocks


@contextlib.contextmanager
def _as_host(name: str, clock_ahead: float = 0.0) -> Iterator[None]:
    """Leases taken inside name host ``name``; the lease reads a clock ``clock_ahead`` s fast."""
    import datetime as dt

    from resumable.storage import lease_info, this_machine

    host, now = this_machine.HOST, lease_info.wall_clock
    this_machine.HOST = name
    lease_info.wall_clock = lambda: now() + dt.timedelta(seconds=clock_ahead)
    try:
        yield
    finally:
        this_machine.HOST, lease_info.wall_clock = host, now


@case("lease-contender-clock-60-s-ahead")
def _(folder: Path, outcome: Any) -> None:
    from resumable import RunStorage
    from resumable.core.errors import LeaseHeldError, LeaseLostError
    from resumable.storage.lease import Lease

    storage = RunStorage(str(folder / "run"))
    with _as_host("vm-a"):
        live = Lease(storage, timeout=1.0, renew_interval=0.2)
        live.acquire()
        live.start_renewing()
    try:
        with _as_host("vm-b", clock_ahead=60), captured():
            try:
                Lease(storage, timeout=1.0).acquire()
                outcome.writers_stopped.append("a contender 60 s ahead took a live writer's lease")
            except LeaseHeldError:
                pass
        try:
            live.fence()
        except LeaseLostError as e:
            if "host 'vm-b'" not in str(e):
                outcome.wrong_errors.append(f"the lost writer's line does not say who took the lease: {e}")
    finally:
        live.release()


@case("lease-renewed-in-2099-by-a-live-process-here")
def _(folder: Path, outcome: Any) -> None:
    import datetime as dt
    import subprocess

    from resumable import RunStorage
    from resumable.core.errors import LeaseHeldError
    from resumable.storage import lease, this_machine

    storage = RunStorage(str(folder / "run"))
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        far = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)
        hostile = lease.LeaseInfo(token="x", host=this_machine.HOST, pid=alive.pid, started=far, renewed=far,
                                  timeout=1.0, boot_id=this_machine.BOOT_ID)
        storage.run_files.create_run_file(lease.LEASE_NAME, hostile.to_json())
        started = time.monotonic()
        with captured():
            try:
                lease.Lease(storage).acquire()
            except LeaseHeldError:
                outcome.writers_stopped.append("a lease renewed 'in 2099' blocks every writer until 2099")
        if time.monotonic() - started > 10:
            outcome.writers_stopped.append("a lease renewed 'in 2099' blocked for more than its 1 s timeout")
    finally:
        alive.kill()
        alive.wait()


# ----------------------------------------------------------------------------- failing servers


class _Server:
    """fake-gcs-server, started once for the cases that need it; a bucket with a run of two."""

    context: Any = None
    endpoint: str | None = None
    run: str | None = None
    saved: dict[str, str | None] = {}

    @classmethod
    def start(cls, folder: Path) -> tuple[str, str]:
        if cls.endpoint is None:
            import fsspec
            from fake_gcs import fake_gcs_server, point_gcs_clients_at

            cls.saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "FSSPEC_GCS_TOKEN")}
            cls.saved["token"] = fsspec.config.conf.get("gcs", {}).get("token")
            cls.context = fake_gcs_server()
            cls.endpoint = cls.context.__enter__()
            point_gcs_clients_at(cls.endpoint)
            import gcsfs

            from resumable import Manifest, RunStorage

            gcsfs.GCSFileSystem(token="anon").mkdir("audit-classes")
            cls.run = "gs://audit-classes/runs/exp1"
            storage = RunStorage(cls.run)
            for epoch in (1, 2):
                stage = folder / f"stage-{epoch}"
                stage.mkdir()
                (stage / "model.keras").write_bytes(bytes([epoch]) * 5000)
                storage.commit(stage, f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch))
        assert cls.endpoint is not None and cls.run is not None
        return cls.endpoint, cls.run

    @classmethod
    def stop(cls) -> None:
        """Stop it, and point gcsfs where it pointed before (a test session's own server)."""
        if cls.context is None:
            return
        import fsspec
        import gcsfs

        cls.context.__exit__(None, None, None)
        cls.context = cls.endpoint = cls.run = None
        token = cls.saved.pop("token", None)
        for key, value in cls.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        gcs = fsspec.config.conf.setdefault("gcs", {})
        if token is None:
            gcs.pop("token", None)
        else:
            gcs["token"] = token
        gcsfs.GCSFileSystem.clear_instance_cache()


def _command_against(folder: Path, outcome: Any, rule: Any, expect: str) -> None:
    """`resumable list` through a proxy applying ``rule``: one line saying ``expect``, soon."""
    import gcsfs
    from fault_proxy import FaultProxy

    from resumable.cli.app import main

    endpoint, run = _Server.start(folder)
    with FaultProxy(endpoint) as proxy:
        proxy.add(rule)
        saved = os.environ["STORAGE_EMULATOR_HOST"]
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
        gcsfs.GCSFileSystem.clear_instance_cache()
        started = time.monotonic()
        try:
            with captured() as text:
                code = main(["list", run])
        finally:
            os.environ["STORAGE_EMULATOR_HOST"] = saved
            gcsfs.GCSFileSystem.clear_instance_cache()
        took = time.monotonic() - started
    shown = text.getvalue()
    errors = [line for line in shown.splitlines() if line.startswith("error: ")]
    if code != 2 or len(errors) != 1 or expect not in errors[0]:
        outcome.wrong_errors.append(f"expected one 'error: ...{expect}...' line; exit {code}: {shown[-300:]}")
    if took > SLOW:
        outcome.wrong_errors.append(f"the one line came after {took:.0f} s")
    if "Traceback" in shown:
        outcome.tracebacks.append("a traceback reached the terminal")
    if any(c in shown for c in CONTROL):
        outcome.control_chars.append("a server's control characters reached the terminal")


@case("server-answers-500")
def _(folder: Path, outcome: Any) -> None:
    from fault_proxy import Rule

    _command_against(folder, outcome, Rule(500, times=None), "500")


@case("server-answers-403")
def _(folder: Path, outcome: Any) -> None:
    from fault_proxy import Rule

    _command_against(folder, outcome, Rule(403, times=None), "permission denied")


@case("server-text-with-terminal-escapes")
def _(folder: Path, outcome: Any) -> None:
    from fault_proxy import Rule

    _command_against(folder, outcome, Rule(500, times=None, message="\x1b[2J\x1b]0;pwned\x07gone"), "pwned")


# ----------------------------------------------------------------------------- damaged after the commit


@case("newest-checkpoint-damaged-after-its-commit")
def _(folder: Path, outcome: Any) -> None:
    from resumable import Manifest, RunStorage
    from resumable.cli.app import main

    run = folder / "run"
    storage = RunStorage(str(run))
    for epoch in (1, 2, 3):
        stage = folder / f"stage-{epoch}"
        stage.mkdir()
        (stage / "model.keras").write_bytes(bytes([epoch]) * 5000)
        storage.commit(stage, f"ckpt-{epoch:06d}", Manifest(epoch=epoch, step=epoch))
    (run / "ckpt-000003" / "model.keras").write_bytes(b"cut")  # the index still says "ok"
    with captured() as text:
        code = main(["verify", str(run), "--latest"])
    if code == 0:
        outcome.called_good.append("`verify --latest` exits 0 while the newest checkpoint is damaged")
    with captured() as text:
        main(["list", str(run)])
    if "latest good: ckpt-000003" in text.getvalue():
        outcome.called_good.append("`list` calls the damaged ckpt-000003 the latest good")


__all__ = ["CLASSES", "run_classes"]

