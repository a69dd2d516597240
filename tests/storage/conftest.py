"""Fixtures of the storage tests: a RunStorage on each backend, and a count of its filesystem calls."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from storage_helpers import COUNTED

from resumable import RetryPolicy, RunStorage


@pytest.fixture
def storage(run_url: str) -> RunStorage:
    return RunStorage(run_url, retry=RetryPolicy(attempts=2, initial_delay=0.001))


@pytest.fixture
def fs_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Count the filesystem calls RunStorage makes (not those fsspec makes inside them)."""

    def install(storage: RunStorage) -> Counter[str]:
        calls: Counter[str] = Counter()
        depth = [0]
        for name in COUNTED:
            original = getattr(storage.fs, name)

            def wrapper(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
                if not depth[0]:
                    calls[_name] += 1
                depth[0] += 1
                try:
                    return _original(*args, **kwargs)
                finally:
                    depth[0] -= 1

            monkeypatch.setattr(storage.fs, name, wrapper)
        if storage.is_gcs:  # and every HTTP request gcsfs sends
            original_call = storage.fs._call

            async def counting_call(*args: Any, **kwargs: Any) -> Any:
                calls["http"] += 1
                return await original_call(*args, **kwargs)

            monkeypatch.setattr(storage.fs, "_call", counting_call)
        return calls

    yield install


@pytest.fixture
def refusing_token_server() -> Iterator[str]:
    """A token endpoint on 127.0.0.1 that answers every refresh with 400 invalid_grant."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps(
                {"error": "invalid_grant", "error_description": "Invalid JWT\nSignature."}
            ).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()
    server.server_close()
