"""A local stand-in for the Hugging Face hub: just enough of its HTTP API for huggingface_hub's
model_info(files_metadata=True) and hf_hub_download (HEAD for etag/size/commit, GET with Range).

Tests point engine.downloads at it with `endpoint=hub.url`. `hold_after` makes file responses stop
after that many bytes until `release` is set, so a test can cancel a download that is really in
flight; `requests` records what the client asked for (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")


class FakeHub:
    """A hub serving `repos` ({repo_id: {path: bytes}}) on 127.0.0.1; use it as a context manager.

    Files named as the real hub keeps in LFS (weights: .bin, .safetensors, .gguf) are listed with their SHA-256, as
    its API lists them. garble: paths whose bytes are served with their first byte changed (the listing keeps the
    true hash), as a transfer damaged on the way would arrive.
    """

    def __init__(self, repos: dict[str, dict[str, bytes]], hold_after: int | None = None,
                 garble: frozenset[str] = frozenset()):
        self.repos = repos
        self.hold_after = hold_after
        self.garble = set(garble)
        self.release = threading.Event()
        self.requests: list[tuple[str, str, str | None]] = []
        self.shas = {repo: hashlib.sha1(repo.encode()).hexdigest() for repo in repos}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest's output clean
            pass

        def do_GET(self):
            self._serve(body=True)

        def do_HEAD(self):
            self._serve(body=False)

        def _serve(self, body: bool):
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            path = urlsplit(self.path).path
            if info := _INFO.match(path):
                return self._info(info["repo"], info["rev"])
            if resolve := _RESOLVE.match(path):
                return self._file(resolve["repo"], resolve["path"], body)
            self._not_found("EntryNotFound")

        def _not_found(self, code: str):
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _info(self, repo: str, rev: str | None):
            if repo not in hub.repos or rev not in (None, "main", hub.shas[repo]):
                return self._not_found("RepoNotFound")
            doc = {"id": repo, "sha": hub.shas[repo],
                   "siblings": [_sibling(p, b) for p, b in hub.repos[repo].items()]}
            data = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _file(self, repo: str, path: str, body: bool):
            content = hub.repos.get(repo, {}).get(path)
            if content is None:
                return self._not_found("EntryNotFound")
            if path in hub.garble:
                content = bytes([content[0] ^ 0xFF]) + content[1:]
            start = 0
            if (rng := self.headers.get("Range")) and (m := re.fullmatch(r"bytes=(\d+)-", rng)):
                start = int(m[1])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", hub.shas[repo])
            self.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
            self.send_header("Content-Length", str(len(content) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
            self.end_headers()
            if not body:
                return
            rest = content[start:]
            try:
                if hub.hold_after is not None and not hub.release.is_set() and hub.hold_after < len(rest):
                    self.wfile.write(rest[: hub.hold_after])
                    self.wfile.flush()
                    hub.release.wait(timeout=60)
                    rest = rest[hub.hold_after:]
                self.wfile.write(rest)
            except (BrokenPipeError, ConnectionResetError):  # the client was stopped mid-file
                pass

    return Handler


def _sibling(path: str, content: bytes) -> dict:
    """A file as the hub's model info lists it."""
    sibling = {"rfilename": path, "size": len(content)}
    if path.endswith((".bin", ".safetensors", ".gguf")):
        sibling["lfs"] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content), "pointerSize": 134}
    return sibling


def repo_files(folder) -> dict[str, bytes]:
    """A folder as FakeHub serves a repository: {path inside it: bytes}."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

