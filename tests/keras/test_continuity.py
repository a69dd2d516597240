"""CSVLogger continued across sessions: a lost session's rows after the checkpoint are dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from resumable.keras.resuming.continuity import csv_logs_continued

keras = pytest.importorskip("keras")

HEADER = "epoch,loss,val_loss\n"


def rows(epochs: range, mark: str = "") -> str:
    return "".join(f"{e},{e}.5{mark},{e}.25\n" for e in epochs)


@pytest.mark.parametrize(("before", "epochs_done", "after"), [
    (HEADER + rows(range(6)), 3, HEADER + rows(range(3))),  # epochs 3-5 were logged by a lost session
    (HEADER + rows(range(3)), 3, HEADER + rows(range(3))),  # nothing after the checkpoint
    (HEADER, 3, HEADER),
    # an earlier run appended to the same file: only the trailing rows of this run are looked at
    (HEADER + rows(range(10)) + rows(range(5), "x"), 3, HEADER + rows(range(10)) + rows(range(3), "x")),
    (HEADER + rows(range(10)) + rows(range(2), "x"), 3, HEADER + rows(range(10)) + rows(range(2), "x")),
])
def test_rows_from_the_checkpoint_s_epoch_on_are_dropped(tmp_path: Path, before: str, epochs_done: int,
                                                         after: str) -> None:
    path = tmp_path / "log.csv"
    path.write_text(before)
    logger = keras.callbacks.CSVLogger(str(path))
    with csv_logs_continued([logger], epochs_done):
        assert logger.append
    assert path.read_text() == after
    assert logger.append is False  # the user's value, back


def test_a_new_run_and_a_missing_file_are_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text(HEADER + rows(range(4)))
    logger = keras.callbacks.CSVLogger(str(path))
    with csv_logs_continued([logger], 0):
        assert logger.append is False
    assert path.read_text() == HEADER + rows(range(4))
    missing = keras.callbacks.CSVLogger(str(tmp_path / "none.csv"), separator=";")
    with csv_logs_continued([missing], 5):
        assert missing.append
    assert not (tmp_path / "none.csv").exists()


def test_another_separator_is_read_as_the_logger_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "log.tsv"
    path.write_text("epoch\tloss\n0\t1.0\n1\t0.5\n2\t0.25\n")
    with csv_logs_continued([keras.callbacks.CSVLogger(str(path), separator="\t")], 1):
        pass
    assert path.read_text() == "epoch\tloss\n0\t1.0\n"
