"""An HTTP proxy in front of the BigQuery emulator that injects server errors.

The emulator never answers 5xx for SQL, so transient and persistent backend
failures are made here, on the wire, where the real client's retry sees them.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass
class Faults:
    """Which requests fail: `fail_next` of those matching, or all of them while `fail_all`."""

    method: str = "POST"
    path_contains: str = "/jobs"
    status: int = 503
    fail_next: int = 0
    fail_all: bool = False
    # The error body sent with an injected failure (BigQuery's error format).
    payload: bytes = b'{"error": {"code": 503, "message": "injected backendError", "status": "UNAVAILABLE"}}'
    seen: list[tuple[str, str, int]] = field(default_factory=list)
    # Every request body relayed or refused, with its method and path (what a tick sent).
    bodies: list[tuple[str, str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def should_fail(self, method: str, path: str) -> bool:
        with self.lock:
            if method != self.method or self.path_contains not in path:
                return False
            if self.fail_all:
                return True
            if self.fail_next > 0:
                self.fail_next -= 1
                return True
            return False

    def matching(self) -> list[tuple[str, str, int]]:
        return [s for s in self.seen if s[0] == self.method and self.path_contains in s[1]]


@contextlib.contextmanager
def faulty_proxy(upstream: str, faults: Faults) -> Iterator[str]:
    """Serve a proxy to `upstream` on a free loopback port; yield its base URL."""
    target = urlsplit(upstream)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            faults.bodies.append((self.command, self.path, body or b""))
            if faults.should_fail(self.command, self.path):
                payload = faults.payload
                faults.seen.append((self.command, self.path, faults.status))
                self.send_response(faults.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"host"}}
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            faults.seen.append((self.command, self.path, response.status))
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP | {"content-length"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            connection.close()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def never_finishing_jobs(upstream: str, project: str) -> Iterator[str]:
    """Proxies in front of `upstream` under which every query job stays RUNNING: its insert,
    its status and its results all say so (a job stuck in BigQuery's queue)."""
    reference = {"projectId": project, "jobId": "lossspike-stuck", "location": "US"}
    job = {
        "kind": "bigquery#job",
        "id": f"{project}:US.lossspike-stuck",
        "jobReference": reference,
        "status": {"state": "RUNNING"},
        "configuration": {"jobType": "QUERY", "query": {"query": "SELECT 1"}},
    }
    results = {"kind": "bigquery#getQueryResultsResponse", "jobReference": reference, "jobComplete": False}

    def running(method: str, path: str, body: dict) -> Faults:
        return Faults(method=method, path_contains=path, status=200, fail_all=True, payload=json.dumps(body).encode())

    with (
        faulty_proxy(upstream, running("GET", "/jobs/", job)) as status,
        faulty_proxy(status, running("POST", "/jobs", job)) as insert,
        faulty_proxy(insert, running("GET", "/queries/", results)) as url,
    ):
        yield url
