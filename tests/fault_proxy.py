"""A real HTTP proxy on 127.0.0.1 in front of fake-gcs-server that fails requests on purpose.

Clients are pointed at the proxy instead of the server (``STORAGE_EMULATOR_HOST``, or
``storage_options={"endpoint_url": proxy.url}``); it forwards each request and its answer,
unless a rule says otherwise:

- ``reset``: the connection is closed with a TCP reset, nothing answered;
- ``lost-answer``: the request reaches the server, then the connection is reset instead of
  answering (a write that landed, its reply lost);
- ``late-answer``: the request reaches the server, then nothing for ``seconds``, then a reset
  (a write that landed, its reply later than the client waits);
- ``truncate``: the request reaches the server, its answer's status and headers come back
  with half of the body, then a reset (a reply cut short: the write landed);
- a status (500, 503, 429, 403, 401): answered with a JSON error body of ``message``; with
  ``applied``, after the request reached the server (a front end failing after the write);
- ``stall``: the request's first ``after`` body bytes are read, then nothing for ``seconds``,
  then a reset (an upload stalled mid-body; with no body, a server that never answers);
- tokens that expire (`FaultProxy.tokens`): a request whose ``Authorization: Bearer`` token was
  issued longer ago than ``ttl`` is answered 401 "Invalid Credentials", as GCS answers.

A rule matches a method and a part of the URL (``match``), from its ``nth`` matching request,
``times`` of them (None: every one from then on); with ``final_chunk``, only requests that
finish a resumable upload session (a ``Content-Range`` naming the total size: the last chunk,
or a single-request body). ``seen`` logs ``(method, path, outcome)`` (an outcome of a status
rule with ``applied`` reads ``500-applied``).

Two hooks for tests that decide per request (tests/soak.py): ``choose(method, path,
content_range)`` returns a Rule for a request no rule matched (seeded random faults, a fault at
the Nth step of a save); ``after(method, path, outcome)`` runs once a request was handled and
before its answer goes back (to SIGKILL the client right after a step). ``wait_idle`` waits
until no request is in flight: a killed client's last request may still be on its way.

Example:

```python
with FaultProxy(gcs_server) as proxy:
    proxy.add(Rule(500, match="/o/", times=None))   # every object request fails
```
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-authorization", "proxy-authenticate", "content-length"}


@dataclass
class Rule:
    """What to do with requests matching ``method`` (None: any) and ``match`` (a part of the URL)."""

    action: int | str  # an HTTP status, "reset", "lost-answer", "late-answer", "truncate" or "stall"
    match: str = ""
    method: str | None = None
    final_chunk: bool = False  # only requests finishing an upload session (module docstring)
    applied: bool = False  # a status: answered after forwarding the request (module docstring)
    nth: int = 1
    times: int | None = 1
    message: str = "injected failure"
    after: int = 0  # "stall": body bytes read before stalling
    seconds: float = 30.0  # "stall", "late-answer": how long
    seen: int = 0

    def hits(self, method: str, path: str, content_range: str = "") -> bool:
        if (self.method is not None and method != self.method) or self.match not in path:
            return False
        if self.final_chunk and not _finishes_session(content_range):
            return False
        self.seen += 1
        return self.seen >= self.nth and (self.times is None or self.seen < self.nth + self.times)


def _finishes_session(content_range: str) -> bool:
    """``bytes 0-9/10`` or ``bytes */10`` finish a session; ``bytes 0-9/*`` (more to come) does not."""
    return content_range.startswith("bytes ") and not content_range.endswith("/*")


@dataclass
class Tokens:
    """Bearer tokens the proxy accepts: each valid for ``ttl`` seconds after it was issued."""

    ttl: float | None = None  # None: every token is accepted
    issued: dict[str, float] = field(default_factory=dict)

    def issue(self) -> str:
        token = f"ya29.test-{len(self.issued)}-{time.monotonic_ns()}"
        self.issued[token] = time.monotonic()
        return token

    def expired(self, header: str | None) -> bool:
        if self.ttl is None or not header or not header.lower().startswith("bearer "):
            return False
        issued = self.issued.get(header.split(None, 1)[1])
        return issued is None or time.monotonic() - issued > self.ttl


class FaultProxy:
    """The proxy (see the module docstring); a context manager that starts and stops it."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.rules: list[Rule] = []
        self.tokens = Tokens()
        self.seen: list[tuple[str, str, str]] = []
        # Called (under the proxy's lock) for a request no rule matched: a Rule to apply, or None
        # (seeded random faults, faults at the Nth step of a save: tests/soak.py).
        self.choose: Callable[[str, str, str], Rule | None] | None = None
        # Called once a request was handled (forwarded, or failed as its rule says), before its
        # answer goes back: where a test SIGKILLs the client right after a step.
        self.after: Callable[[str, str, str], None] | None = None
        self._in_flight = 0
        self._idle = threading.Condition()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def upstream_url(self) -> str:
        return f"http://{self.upstream[0]}:{self.upstream[1]}"

    def add(self, *rules: Rule) -> None:
        with self._lock:
            self.rules.extend(rules)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no request is being handled (a killed client's last request may still be
        on its way to the server); False if one still is after ``timeout`` s."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def outcomes(self, outcome: str) -> list[tuple[str, str, str]]:
        return [s for s in self.seen if s[2] == outcome]

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _rule_for(self, method: str, path: str, content_range: str = "") -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.hits(method, path, content_range):
                    return rule
            return self.choose(method, path, content_range) if self.choose is not None else None


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (after a reset or a stall it gave up on) is no error of the proxy."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handle_error(request, client_address)


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _any(self) -> None:
            with proxy._idle:
                proxy._in_flight += 1
            try:
                self._handle()
            finally:
                with proxy._idle:
                    proxy._in_flight -= 1
                    proxy._idle.notify_all()

        def _handle(self) -> None:
            method, path = self.command, self.path
            rule = proxy._rule_for(method, path, self.headers.get("Content-Range", ""))
            if rule is None and proxy.tokens.expired(self.headers.get("Authorization")):
                rule = Rule(401, message="Invalid Credentials")
            outcome = "forwarded" if rule is None else f"{rule.action}{'-applied' if rule.applied else ''}"
            proxy.seen.append((method, path, outcome))
            if rule is not None and rule.action == "reset":
                self._body()
                self._after(method, path, outcome)
                self._reset()
            elif rule is not None and rule.action == "stall":
                self._stall(rule)
            elif rule is not None and rule.action == "lost-answer":
                self._forward(method, path, self._body(), answer=False)
                self._after(method, path, outcome)
                self._reset()
            elif rule is not None and rule.action == "late-answer":
                self._forward(method, path, self._body(), answer=False)
                self._after(method, path, outcome)
                time.sleep(rule.seconds)
                self._reset()
            elif rule is not None and rule.action == "truncate":
                self._forward(method, path, self._body(), truncate=True, outcome=outcome)
                self._reset()
            elif rule is not None:
                body = self._body()
                if rule.applied:
                    self._forward(method, path, body, answer=False)
                self._after(method, path, outcome)
                self._answer(int(rule.action), rule.message)
            else:
                self._forward(method, path, self._body(), outcome=outcome)

        def _after(self, method: str, path: str, outcome: str) -> None:
            if proxy.after is not None:
                proxy.after(method, path, outcome)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _forward(self, method: str, path: str, body: bytes, answer: bool = True,
                     truncate: bool = False, outcome: str = "") -> None:
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Host"] = f"{proxy.upstream[0]}:{proxy.upstream[1]}"
            upstream.request(method, path, body=body if body or method in ("POST", "PUT") else None,
                             headers=headers)
            response = upstream.getresponse()
            data = response.read()
            upstream.close()
            if not answer:
                return
            self._after(method, path, outcome)
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value.replace(proxy.upstream_url, proxy.url)
                                     if key.lower() == "location" else value)
            promised = max(len(data), 2) if truncate else len(data)  # an empty body cut short: 2 promised
            self.send_header("Content-Length", str(promised))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data[:len(data) // 2] if truncate else data)
                self.wfile.flush()

        def _answer(self, status: int, message: str) -> None:
            data = json.dumps({"error": {"code": status, "message": message,
                                         "errors": [{"message": message, "reason": "injected"}]}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stall(self, rule: Rule) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if rule.after and length:
                self.rfile.read(min(rule.after, length))
            time.sleep(rule.seconds)
            self._after(self.command, self.path, "stall")
            self._reset()

        def _reset(self) -> None:
            """Close with a TCP reset (SO_LINGER 0), as a dropped connection does."""
            with contextlib.suppress(OSError):
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.close()

    return Handler


