"""Bad input, one row each: a one-line message saying what is wrong and what to do, nothing deleted.

Every row starts from a copy of a real run folder with two good checkpoints (a tiny model
trained two epochs), does one wrong thing, and checks the exception type (or the CLI's exit
code, or the warning), a fragment of the message, that the message is one line, and that
every file of the run folder still has its name and bytes. docs/troubleshooting.md lists
the same messages.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from paths import ROOT

import resumable
from resumable import (
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    NotAFolderError,
    NotAuthenticatedError,
    ResumableError,
    RetryPolicy,
    RunNotFoundError,
    RunStorage,
)
from resumable.cli.app import main
from resumable.core.checksum import crc32c_of_file

keras = pytest.importorskip("keras")

pytestmark = pytest.mark.slow  # one tiny training run for the whole table, and a few resumes

rng = np.random.default_rng(0)
X = rng.normal(size=(64, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
FIT: dict[str, Any] = {"batch_size": 32, "shuffle": False, "verbose": 0, "validation_data": (X[:32], Y[:32])}
BUCKET = "gs://no-such-bucket-7f3a9"
MISSING_BUCKET = f"{BUCKET}/runs/exp1"


def make_model(units: int = 8, optimizer: str = "adam") -> Any:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with ckpt-000001 and ckpt-000002, trained once for the whole table."""
    folder = tmp_path_factory.mktemp("template") / "run"
    resumable.resume(str(folder), build_model=make_model, async_upload=False).fit(X, Y, epochs=2, **FIT)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["ckpt-000001", "ckpt-000002"]
    return folder


def files_of(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: relative path -> crc32c."""
    return {p.relative_to(folder).as_posix(): crc32c_of_file(p)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@dataclass
class Ctx:
    run: Path  # the copy of the template this row works on
    tmp: Path
    request: pytest.FixtureRequest

    @property
    def url(self) -> str:
        return str(self.run)

    def manifest(self, name: str = "ckpt-000002") -> Path:
        return self.run / name / "manifest.json"

    def edit_manifest(self, change: Callable[[dict[str, Any]], None], name: str = "ckpt-000002") -> None:
        raw = json.loads(self.manifest(name).read_text())
        change(raw)
        self.manifest(name).write_text(json.dumps(raw))

    def gcs(self) -> str:
        return str(self.request.getfixturevalue("gcs_server"))


@dataclass(frozen=True)
class Row:
    id: str
    act: Callable[[Ctx], Any]
    # the exception, the CLI's exit code, UserWarning (warnings.warn) or LogRecord (a logged warning)
    expect: type[BaseException] | type[logging.LogRecord] | int
    fragment: str
    prepare: Callable[[Ctx], Any] | None = None  # the damage done before the snapshot
    warns: bool = False  # the outcome is a warning (training or resume goes on), not an error


def fresh(ctx: Ctx, **kwargs: Any) -> resumable.CheckpointCallback:
    return resumable.CheckpointCallback(ctx.url, **kwargs)


def resume(ctx: Ctx, **kwargs: Any) -> resumable.Run:
    kwargs.setdefault("build_model", make_model)
    return resumable.resume(ctx.url, **kwargs)


def a_file(ctx: Ctx) -> str:
    path = ctx.tmp / "notes.txt"
    path.write_text("not a folder")
    return str(path)


def garbage(ctx: Ctx) -> None:
    path = ctx.run / "ckpt-000002" / "model.keras"
    path.write_bytes(os.urandom(path.stat().st_size))  # same size: only the checksum can tell


def truncate_manifest(ctx: Ctx) -> None:
    data = ctx.manifest().read_bytes()
    ctx.manifest().write_bytes(data[: len(data) // 2])


def newer_format(ctx: Ctx) -> None:
    ctx.edit_manifest(lambda raw: raw.update(format_version=99))


def hand_edited_epoch(ctx: Ctx) -> None:
    ctx.edit_manifest(lambda raw: raw.update(epoch="two"))


def hand_edited_size(ctx: Ctx) -> None:
    ctx.edit_manifest(lambda raw: raw["files"]["model.keras"].update(size=12))


def fit_plain(ctx: Ctx, **kwargs: Any) -> Any:
    model = make_model()
    return model.fit(X, Y, epochs=1, callbacks=[fresh(ctx, **kwargs)], **FIT)


def fit_best_only_on_unlogged_metric(ctx: Ctx) -> Any:
    run = resume(ctx, monitor="val_acc", save_best_only=True)
    return run.fit(X, Y, epochs=3, **FIT)


def bad_service_account(ctx: Ctx) -> Any:
    ctx.gcs()
    path = ctx.tmp / "missing-service-account.json"
    saved = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(path)
    try:
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()
        return RunStorage(f"gs://bucket-{uuid.uuid4().hex[:8]}/runs/exp1",
                          storage_options={"token": "google_default"}).latest()
    finally:
        if saved is None:
            os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
        else:
            os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = saved


def missing_bucket(ctx: Ctx) -> Any:
    ctx.gcs()
    return resumable.resume(MISSING_BUCKET, build_model=make_model)


def cli_missing_bucket(ctx: Ctx) -> Any:
    ctx.gcs()
    return main(["list", MISSING_BUCKET])


ROWS = [
    # ---- where the run folder is
    Row("bucket does not exist", missing_bucket, RunNotFoundError, f"does the bucket {BUCKET} exist"),
    Row("cli: bucket does not exist", cli_missing_bucket, 2, f"does the bucket {BUCKET} exist"),
    Row("not authenticated", bad_service_account, NotAuthenticatedError, "not authenticated to Google Cloud"),
    Row("path is a file", lambda c: resumable.resume(a_file(c), build_model=make_model), NotAFolderError,
        "is a file, not a run folder"),
    Row("cli: path is a file", lambda c: main(["list", a_file(c)]), 2, "is a file, not a run folder"),
    Row("cli: a checkpoint folder, not the run folder",
        lambda c: main(["list", str(c.run / "ckpt-000002")]), 2, "is one checkpoint, not a run folder"),
    Row("cli: folder does not exist", lambda c: main(["list", str(c.tmp / "nope")]), 2, "not found"),
    Row("empty URL", lambda c: RunStorage(""), ResumableError, "the run folder URL is empty"),
    # ---- someone else's run in the folder
    Row("another run's architecture", lambda c: resume(c, build_model=lambda: make_model(units=32)),
        CheckpointMismatchError, "does not fit the model from build_model()"),
    Row("another optimizer", lambda c: resume(c, build_model=lambda: make_model(optimizer="sgd")),
        CheckpointMismatchError, "Adam optimizer state but the model's optimizer is SGD"),
    Row("plain fit into a folder that holds a run", fit_plain, CheckpointExistsError,
        "already holds a run (latest ckpt-000002, 2 epochs)"),
    Row("fit of a resumed run from the wrong epoch",
        lambda c: resume(c).fit(X, Y, epochs=3, initial_epoch=0, **FIT), ValueError,
        "Expected 2 (the epochs this run has done)"),
    Row("model.fit of a resumed model without initial_epoch",
        lambda c: (run := resume(c)).model.fit(X, Y, epochs=3, callbacks=[run.callback], **FIT),
        ResumableError, "has 2 epochs done; pass initial_epoch=2 to fit"),
    Row("no checkpoint and no build_model", lambda c: resumable.resume(str(c.tmp / "new")),
        CheckpointNotFoundError, "no checkpoint to resume from; pass build_model="),
    # ---- damaged checkpoints
    Row("checkpoint file replaced by garbage", lambda c: resume(c), UserWarning,
        "the checkpoint is damaged, an older one will be used", prepare=garbage, warns=True),
    Row("cli verify: checkpoint file replaced by garbage", lambda c: main(["verify", c.url]), 1,
        "ckpt-000002/model.keras", prepare=garbage),
    Row("truncated manifest", lambda c: resume(c), logging.LogRecord, "manifest is not valid JSON",
        prepare=truncate_manifest, warns=True),
    Row("cli verify: truncated manifest", lambda c: main(["verify", c.url, "--name", "ckpt-000002"]), 1,
        "manifest is not valid JSON", prepare=truncate_manifest),
    Row("hand-edited manifest (epoch)", lambda c: resume(c), logging.LogRecord,
        "manifest is missing or has a bad field", prepare=hand_edited_epoch, warns=True),
    Row("hand-edited manifest (size)", lambda c: resume(c), logging.LogRecord,
        "model.keras has", prepare=hand_edited_size, warns=True),
    Row("manifest from a newer format", lambda c: resume(c), logging.LogRecord,
        "upgrade with `pip install -U keras-resumable`", prepare=newer_format, warns=True),
    Row("cli verify: manifest from a newer format",
        lambda c: main(["verify", c.url, "--name", "ckpt-000002"]), 1,
        "upgrade with `pip install -U keras-resumable`", prepare=newer_format),
    # ---- callback arguments
    Row("save_freq='daily'", lambda c: fresh(c, save_freq="daily"), ValueError,
        "Received: save_freq='daily'. Expected 'epoch' or a positive int."),
    Row("keep_last=-1", lambda c: fresh(c, keep_last=-1), ValueError, "Received: keep_last=-1"),
    Row("keep_best=-1", lambda c: fresh(c, keep_best=-1), ValueError, "Received: keep_best=-1"),
    Row("mode='up'", lambda c: fresh(c, mode="up"), ValueError, "Received: mode='up'"),
    Row("filepath is a model file", lambda c: resumable.CheckpointCallback(str(c.run / "model.keras")),
        ValueError, "Expected a run folder"),
    Row("filename without {epoch}", lambda c: fresh(c, filename="ckpt"), ValueError,
        "Received: filename='ckpt'"),
    Row("resume() with a bad callback argument", lambda c: resume(c, save_freq=0), ValueError,
        "Received: save_freq=0"),
    Row("retry attempts=0", lambda c: RetryPolicy(attempts=0), ValueError, "Received: attempts=0"),
    Row("save_best_only on a metric fit never logs", fit_best_only_on_unlogged_metric, ValueError,
        "Received: monitor='val_acc'"),
    Row("save_best_only on val_loss without validation",
        lambda c: resume(c, save_best_only=True).fit(X, Y, epochs=3, batch_size=32, verbose=0), UserWarning,
        "monitor='val_loss' is not logged without validation", warns=True),
    # ---- command line
    Row("cli: unknown command", lambda c: main(["pruneit", c.url]), 2, "invalid choice: 'pruneit'"),
    Row("cli: no URL", lambda c: main(["list"]), 2, "the following arguments are required: URL"),
    Row("cli: --epoch not a number", lambda c: main(["inspect", c.url, "--epoch", "two"]), 2,
        "invalid int value: 'two'"),
    Row("cli: no such epoch", lambda c: main(["inspect", c.url, "--epoch", "9"]), 2,
        "no checkpoint of epoch 9"),
    Row("cli: prune --keep-last 0", lambda c: main(["prune", c.url, "--keep-last", "0", "--yes"]), 2,
        "--keep-last must be >= 1, got 0"),
    Row("cli: prune by a metric never recorded",
        lambda c: main(["prune", c.url, "--keep-best", "1", "--monitor", "accuracy", "--yes"]), 2,
        "--monitor accuracy: no checkpoint recorded this metric"),
    Row("cli: prune without confirmation", lambda c: main(["prune", c.url, "--keep-last", "1"]), 2,
        "refusing to delete without confirmation"),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_bad_input(row: Row, template: Path, tmp_path: Path, request: pytest.FixtureRequest,
                   capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    ctx = Ctx(tmp_path / "run", tmp_path, request)
    shutil.copytree(template, ctx.run)
    if row.prepare is not None:
        row.prepare(ctx)
    before = files_of(ctx.run)
    capsys.readouterr()

    message = _outcome(row, ctx, capsys, caplog)

    assert row.fragment in message, message
    assert "\n" not in message.strip() and "Traceback" not in message
    assert files_of(ctx.run) == before  # nothing deleted, nothing overwritten


def _outcome(row: Row, ctx: Ctx, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    if row.warns:  # resume goes on with the older good checkpoint, and says why
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, "resumable"):
            warnings.simplefilter("always")
            row.act(ctx)
        if row.expect is logging.LogRecord:
            texts = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        else:
            texts = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        return next((t for t in texts if row.fragment in t), f"no warning with the fragment among {texts}")
    if isinstance(row.expect, int):  # the command line: an exit code and one `error:` line
        code = row.act(ctx)
        out, err = capsys.readouterr()
        assert code == row.expect, (out, err)
        if code == 1:  # verification failed: the bad file is named on stdout
            return next(line for line in out.splitlines() if row.fragment in line)
        assert err.startswith("error: ") and err.count("\n") == 1, (out, err)  # stdout may show a plan
        return err
    assert isinstance(row.expect, type) and issubclass(row.expect, BaseException)
    with pytest.raises(row.expect) as caught_error:
        row.act(ctx)
    return str(caught_error.value)


def test_the_table_is_big_enough_and_documented() -> None:
    assert len(ROWS) >= 25
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    missing = [row.id for row in ROWS if row.fragment not in page]
    assert not missing, f"docs/troubleshooting.md lacks the messages of: {missing}"
