"""What the storage tests share: files to commit, raw reads and writes in a run folder, summaries."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from resumable import Manifest, RunStorage

FILES = {
    "model.keras": bytes(random.Random(0).randrange(256) for _ in range(50_000)),
    "state.json": b'{"epoch": 3}\n',
    "assets/vocab.txt": b"a\nb\n",
}

# The filesystem calls `fs_calls` counts (tests/storage/conftest.py).
COUNTED = (
    "find",
    "ls",
    "walk",
    "glob",
    "info",
    "exists",
    "isdir",
    "isfile",
    "cat",
    "cat_file",
    "open",
    "get_file",
    "du",
    "expand_path",
)


def stage(folder: Path, files: dict[str, bytes] | None = None) -> Path:
    """Write ``files`` (relative path -> bytes; FILES by default) into the staging ``folder``."""
    for rel, data in (files or FILES).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def staged_checkpoint(root: Path, epoch: int, files: dict[str, bytes]) -> tuple[Path, str, Manifest]:
    """Checkpoint ``epoch``'s ``files`` staged in ``root/staging/ckpt-<epoch>``; its folder, name and
    manifest (step ``10 * epoch``), as an uploader is given them."""
    name = f"ckpt-{epoch:06d}"
    return stage(root / "staging" / name, files), name, Manifest(epoch=epoch, step=epoch * 10)


def commit(
    storage: RunStorage, tmp_path: Path, name: str, manifest: Manifest, files: dict[str, bytes] | None = None
) -> Any:
    return storage.commit(stage(tmp_path / "stage" / name, files), name, manifest)


def raw(storage: RunStorage, *parts: str) -> bytes:
    return bytes(storage.fs.cat_file("/".join((storage.root, *parts))))


def put_raw(storage: RunStorage, data: bytes, *parts: str) -> None:
    path = "/".join((storage.root, *parts))
    if storage.is_local:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    storage.fs.pipe_file(path, data)


def names(infos: Any) -> list[str]:
    return [info.name for info in infos]


def summary(infos: Any) -> list[tuple[Any, ...]]:
    return [(i.name, i.status, i.epoch, i.step, i.size, i.metrics, i.created) for i in infos]


def bad_service_account(tmp_path: Path, token_uri: str) -> Path:
    """A service-account key file whose token endpoint is ``token_uri``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = tmp_path / "service-account.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "k",
                "private_key": key.decode(),
                "client_email": "nobody@p.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )
    return path
