"""A run folder under /content/drive/ without Drive mounted: one line, never a new run on the VM's disk.

The check reads /proc/self/mountinfo; these tests hand it a written mountinfo file instead (the
real one of a Colab VM before and after ``drive.mount``), so no mount is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resumable import DriveNotMountedError, RunNotFoundError, RunStorage
from resumable.cli.app import main
from resumable.storage import mounts

# What a Colab VM's mountinfo looks like (shortened): before drive.mount, and the line it adds.
COLAB = """\
1102 1034 0:160 / / rw,relatime master:446 - overlay overlay rw,lowerdir=/var/lib/docker/l1
1103 1102 0:163 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1107 1102 8:1 /var/colab/content /content rw,relatime - ext4 /dev/sda1 rw
"""
DRIVE = "1290 1107 0:190 / /content/drive rw,nosuid,nodev,relatime - fuse.drive drive rw,user_id=0\n"
URL = "/content/drive/MyDrive/runs/exp1"


@pytest.fixture
def mountinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``mountinfo(text)``: the check reads ``text`` as this process's mount table."""

    def write(text: str) -> Path:
        path = tmp_path / "mountinfo"
        path.write_text(text)
        monkeypatch.setattr(mounts, "MOUNTINFO", str(path))
        return path

    return write


def test_a_drive_folder_without_the_mount_is_one_line_telling_to_mount(mountinfo) -> None:  # type: ignore[no-untyped-def]
    mountinfo(COLAB)
    with pytest.raises(DriveNotMountedError) as caught:
        RunStorage(URL)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{URL}: Google Drive is not mounted at /content/drive")
    assert "drive.mount('/content/drive')" in message
    assert isinstance(caught.value, RunNotFoundError) and isinstance(caught.value, FileNotFoundError)


def test_the_mounted_drive_is_accepted(mountinfo) -> None:  # type: ignore[no-untyped-def]
    mountinfo(COLAB + DRIVE)
    storage = RunStorage(URL)  # opens without touching the folder
    assert storage.truncate_before_delete is True


def test_only_paths_under_content_drive_are_checked(mountinfo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mountinfo(COLAB)
    RunStorage(str(tmp_path / "run"))
    RunStorage("/content/drive-backup/runs/exp1")  # a sibling, not under the mount point
    RunStorage("memory://content/drive/x")  # not a local path


def test_mount_points_with_spaces_and_a_mount_deeper_than_content_drive(mountinfo) -> None:  # type: ignore[no-untyped-def]
    mountinfo(COLAB + "1291 1107 0:191 / /content/drive/My\\040Drive rw - fuse.rclone gdrive rw\n")
    assert "/content/drive/My Drive" in (mounts.mount_points() or set())
    RunStorage("/content/drive/My Drive/runs/exp1")
    with pytest.raises(DriveNotMountedError):
        RunStorage(URL)  # /content/drive/MyDrive is not under that mount


def test_without_a_mount_table_the_mount_point_itself_is_asked(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "absent"))
    assert mounts.mount_points() is None
    asked: list[str] = []

    def ismount(path: str) -> bool:
        asked.append(path)
        return False

    assert not mounts.drive_mounted(URL, ismount=ismount)
    assert asked == ["/content/drive"]
    assert mounts.drive_mounted(URL, ismount=lambda p: True)


def test_the_cli_says_the_same_line_and_creates_nothing(  # type: ignore[no-untyped-def]
        mountinfo, capsys: pytest.CaptureFixture[str]) -> None:
    mountinfo(COLAB)
    existed = os.path.exists("/content/drive")
    assert main(["list", URL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {URL}: Google Drive is not mounted")
    assert os.path.exists("/content/drive") == existed


def test_the_real_mount_table_is_read() -> None:
    points = mounts.mount_points()
    assert points is None or "/" in points
