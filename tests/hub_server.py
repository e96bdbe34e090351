"""A local stand-in for the Hugging Face Hub's file endpoints, for the real ``huggingface_hub`` client.

``serve_hub({"org/name": {"config.json": b"...", "model.safetensors": b"..."}})`` serves those repos on
127.0.0.1 the way huggingface.co serves ``/{repo}/resolve/{revision}/{file}`` (huggingface_hub's
file_download.py ``get_hf_file_metadata`` and ``http_get``, hf_api.py ``file_exists`` and
``parse_safetensors_file_metadata``):

* ``HEAD`` answers ``X-Repo-Commit``, ``ETag`` and ``Content-Length``; ``GET`` the bytes, honouring a
  ``Range: bytes=a-b`` header with 206 (safetensors headers are read with range requests);
* a missing file is 404 with ``X-Error-Code: EntryNotFound``, a missing repo 404 with ``RepoNotFound``
  (what ``hf_raise_for_status`` turns into ``RemoteEntryNotFoundError`` / ``RepositoryNotFoundError``).

Point the client at it with ``HF_ENDPOINT=<url>`` (read when huggingface_hub is imported: a subprocess,
or the frozen binary of ``packaging/smoke_checks.py``). Used by tests and the packaging smoke test; it only
ever listens on the loopback address.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # any 40 hex digits: huggingface_hub's REGEX_COMMIT_HASH
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def _handler(repos: Mapping[str, Mapping[str, bytes]], log: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # every request is in ``log``; nothing on stderr

        def _missing(self, code: str) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _answer(self, body: bool) -> None:
            log.append(f"{self.command} {self.path}")
            m = RESOLVE.match(self.path.split("?", 1)[0])
            if m is None or m["repo"] not in repos:
                self._missing("RepoNotFound")
                return
            data = repos[m["repo"]].get(m["file"])
            if data is None:
                self._missing("EntryNotFound")
                return
            status, part = 200, data
            rng = RANGE.match(self.headers.get("Range", ""))
            if rng:
                start, end = int(rng[1]), int(rng[2]) if rng[2] else len(data) - 1
                status, part = 206, data[start : end + 1]
            self.send_response(status)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(part)))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{start + len(part) - 1}/{len(data)}")
            self.end_headers()
            if body:
                self.wfile.write(part)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

    return Handler


@contextlib.contextmanager
def serve_hub(repos: Mapping[str, Mapping[str, bytes]]) -> Iterator[tuple[str, list[str]]]:
    """``(endpoint URL, request log)`` of a Hub stand-in serving ``repos`` until the block ends."""
    log: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(repos, log))
    thread = threading.Thread(target=server.serve_forever, name="hub-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
