"""One big file to fake-gcs-server, sent the ways a checkpoint's file could go: wall time, the
CPU of the client and of the server, and whether the server answers another request meanwhile.

- ``resumable``: `storage.gcs_upload.upload`, what a commit sends: a resumable-upload session,
  then the whole file in one PUT, read a piece at a time, its CRC32C computed as it goes;
- ``single-request upload``: the same pieces in one POST to the JSON API's ``uploadType=media``
  URL, no session;
- ``gcsfs put_file``: gcsfs' own upload of a local file (resumable, in 50 MB requests);
- the floors, the same bytes from memory, no file read, no checksum: ``a session, one PUT`` (what
  resumable sends), ``one POST`` (a single-request upload), and ``4 sessions at once, composed``
  (a parallel composite upload: a quarter of the bytes in each of four concurrent sessions, then
  one ``compose`` into the object; the parts are deleted after the round, off its clock).

The ways run in rounds, in an order rotated each round; each object is deleted after its round.
Then, for the two streamed ways, a body is held after its first piece while a listing of the
bucket is sent: how long the server takes to answer it (a server that reads that body under its
lock answers nothing else until the body is in).

    python benchmarks/bench_upload.py                  # 287 MB (bench_save's checkpoint), 5 rounds
    python benchmarks/bench_upload.py --mb 9 --rounds 2   # the quick version a test runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# gcsfs' gRPC bucket probe stalls about a minute against an emulator; set before importing it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fake_gcs import fake_gcs_server, point_gcs_clients_at, server_process  # noqa: E402

from resumable.storage import gcs_upload  # noqa: E402
from resumable.storage.gcs_client import client_for  # noqa: E402

BUCKET = "bench-upload"
PARTS = 4  # the composed floor's parts, each sent in a session of its own, all at once


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Held:
    """An upload's body, a piece at a time; ``hold`` keeps it after its first piece until released."""

    def __init__(self, local: Path, hold: threading.Event | None = None) -> None:
        self.local, self.hold = local, hold

    def __len__(self) -> int:
        return self.local.stat().st_size

    def __iter__(self) -> Iterator[bytes]:
        with open(self.local, "rb") as source:
            while piece := source.read(gcs_upload.PIECE_SIZE):
                yield piece
                if self.hold is not None:
                    self.hold.wait(60)


def media_url(fs: object, key: str) -> str:
    """The single-request upload of ``key`` into the bench's bucket (the JSON API's ``uploadType=media``)."""
    return f"{client_for(fs).client.api_endpoint}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={key}"


def ways(fs: object, local: Path, data: bytes, hold: threading.Event | None = None
         ) -> dict[str, Callable[[str], None]]:
    gcs = client_for(fs)

    def ours(key: str) -> None:
        if hold is None:
            gcs_upload.upload(fs, local, f"{BUCKET}/{key}", before_piece=lambda: None, on_sent=lambda n: None)
            return
        size = local.stat().st_size
        session = gcs.bucket(BUCKET).blob(key).create_resumable_upload_session(size=size, retry=None)
        gcs.session.put(session, data=Held(local, hold),
                        headers={"Content-Range": f"bytes 0-{size - 1}/{size}"})

    def single_request(key: str) -> None:
        response = gcs.session.post(media_url(fs, key), data=Held(local, hold),
                                    headers={"Content-Type": "application/octet-stream"})
        response.raise_for_status()

    def put_file(key: str) -> None:
        fs.put_file(str(local), f"{BUCKET}/{key}")  # type: ignore[attr-defined]

    def floor(key: str) -> None:
        response = gcs.session.post(media_url(fs, key), data=data,
                                    headers={"Content-Type": "application/octet-stream"})
        response.raise_for_status()

    def composed_floor(key: str) -> None:
        parts = [f"{key}.part-{i}" for i in range(PARTS)]
        step = -(-len(data) // PARTS)
        senders = [threading.Thread(target=session_put, args=(part, data[i * step:(i + 1) * step]))
                   for i, part in enumerate(parts)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        bucket = gcs.bucket(BUCKET)
        bucket.blob(key).compose([bucket.blob(part) for part in parts], retry=None)
        # the parts are deleted with the object after the round, off its clock: a commit could too

    def session_put(key: str, body: bytes) -> None:
        session = gcs.bucket(BUCKET).blob(key).create_resumable_upload_session(size=len(body), retry=None)
        response = gcs.session.put(session, data=body,
                                   headers={"Content-Range": f"bytes 0-{len(body) - 1}/{len(body)}"})
        response.raise_for_status()

    return {"resumable": ours, "single-request upload": single_request, "gcsfs put_file": put_file,
            "floor: a session, one PUT from memory": lambda key: session_put(key, data),
            "floor: one POST from memory": floor,
            f"floor: {PARTS} sessions at once, composed": composed_floor}


def answered_meanwhile(fs: object, local: Path, data: bytes, endpoint: str, name: str) -> str:
    """How long a listing sent while ``name``'s body is held after its first piece waits for its answer."""
    import requests

    hold = threading.Event()
    upload = threading.Thread(target=ways(fs, local, data, hold)[name], args=(f"held/{name.split()[0]}",))
    upload.start()
    time.sleep(1)  # the first piece is on its way
    started = time.perf_counter()
    try:
        requests.get(f"{endpoint}/storage/v1/b/{BUCKET}/o", timeout=5).raise_for_status()
        answer = f"answered in {time.perf_counter() - started:.2f} s"
    except requests.Timeout:
        answer = "no answer in 5 s: the server waits for the held body"
    finally:
        hold.set()
        upload.join()
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=287, help="the file's size in MB (default 287)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    args = parser.parse_args(argv)
    data = os.urandom(int(args.mb * 2**20))
    with tempfile.TemporaryDirectory(prefix="bench-upload-") as folder, fake_gcs_server() as endpoint:
        point_gcs_clients_at(endpoint)
        import gcsfs

        fs = gcsfs.GCSFileSystem(token="anon")
        fs.mkdir(BUCKET)
        local = Path(folder) / "model.keras"
        local.write_bytes(data)
        server = server_process(endpoint).pid
        named = ways(fs, local, data)
        seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in named}
        names = list(named)
        for number in range(args.rounds):
            for name in names[number % len(names):] + names[:number % len(names)]:
                key = f"round-{number}/{name.split()[0]}"
                client, served, started = time.process_time(), process_cpu(server), time.perf_counter()
                named[name](key)
                seen[name].append((time.perf_counter() - started, time.process_time() - client,
                                   process_cpu(server) - served))
                assert fs.info(f"{BUCKET}/{key}")["size"] == len(data)
                fs.rm(fs.glob(f"{BUCKET}/{key}*"))  # the object, and the composed floor's parts
        meanwhile = {name: answered_meanwhile(fs, local, data, endpoint, name)
                     for name in ("resumable", "single-request upload")}
    print(f"{args.mb:g} MB to fake-gcs-server on loopback, {args.rounds} rounds in a rotated order: "
          "median [min-max] seconds")
    print(f"{'':<38}{'wall':>22}{'client CPU':>22}{'server CPU':>22}{'wall / resumable':>20}")
    for name, rows in seen.items():
        cells = []
        for column in range(3):
            values = sorted(row[column] for row in rows)
            cells.append(f"{statistics.median(values):.2f} [{values[0]:.2f}-{values[-1]:.2f}]")
        ratio = statistics.median(w / r for (w, _, _), (r, _, _) in zip(rows, seen["resumable"], strict=True))
        print(f"{name:<38}{cells[0]:>22}{cells[1]:>22}{cells[2]:>22}{ratio:>19.2f}x")
    print("a listing sent while a body is held after its first piece:")
    for name, answer in meanwhile.items():
        print(f"  {name}: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
