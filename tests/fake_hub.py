"""A Hugging Face Hub on loopback for tests: the part of the Hub's HTTP API that huggingface_hub
uses to list a model repo and download a file from it, so downloads, progress bars, resumes and
the cache are exercised for real, with no network.

Served, as huggingface.co answers them (plain HTTP files, no Xet storage):
- GET  /api/models/USER/REPO[/revision/REV]      the repo's info: sha and siblings
- HEAD /USER/REPO/resolve/REV/PATH               ETag, X-Repo-Commit, Content-Length
- GET  /USER/REPO/resolve/REV/PATH               the bytes; `Range: bytes=N-` answers 206
Unknown repos and files answer 404 with the Hub's X-Error-Code header.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Seen:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]]          # "USER/REPO" -> {path in repo: bytes}
    cut_once: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the
    #                                              first GET of it breaks off (then forgotten)
    seen: list[Seen] = field(default_factory=list)
    endpoint: str = ""

    def commit(self, repo_id: str) -> str:
        """A 40-hex commit id that changes with the repo's contents."""
        h = hashlib.sha1(repo_id.encode())
        for path, data in sorted(self.repos[repo_id].items()):
            h.update(path.encode() + hashlib.sha256(data).digest())
        return h.hexdigest()

    def __enter__(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects

        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.seen.append(Seen(self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) in (4, 6):
                return self._repo_info("/".join(parts[2:4]), body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._file("/".join(parts[:2]), "/".join(parts[4:]), body)
            self._send(404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "not found"}', body)

        def _repo_info(self, repo_id: str, body: bool) -> None:
            if repo_id not in hub.repos:
                return self._send(404, {"X-Error-Code": "RepoNotFound"},
                                  b'{"error": "Repository not found"}', body)
            info = {"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": hub.commit(repo_id),
                    "private": False, "tags": ["gguf"], "downloads": 0, "likes": 0,
                    "siblings": [{"rfilename": p} for p in sorted(hub.repos[repo_id])]}
            self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)

        def _file(self, repo_id: str, name: str, body: bool) -> None:
            files = hub.repos.get(repo_id)
            if files is None:
                return self._send(404, {"X-Error-Code": "RepoNotFound"}, b"", body)
            commit = {"X-Repo-Commit": hub.commit(repo_id)}
            if name not in files:
                return self._send(404, {**commit, "X-Error-Code": "EntryNotFound"}, b"", body)
            data = files[name]
            base = name.rsplit("/", 1)[-1]
            headers = {**commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                       # as the Hub's file storage names a download (progress bars show it)
                       "Content-Disposition": f"inline; filename*=UTF-8''{base}; filename=\"{base}\";"}
            start = _range_start(self.headers.get("Range"))
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            status = 206 if start else 200
            cut = hub.cut_once.pop(name, None) if body else None
            if cut is None:
                return self._send(status, headers, data[start:], body)
            # Promise the whole file, send part of it, and drop the connection.
            self._send_headers(status, headers, len(data) - start)
            self.wfile.write(data[start:start + cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

        def _send(self, status: int, headers: dict[str, str], data: bytes, body: bool) -> None:
            self._send_headers(status, headers, len(data))
            if body:
                self.wfile.write(data)

        def _send_headers(self, status: int, headers: dict[str, str], n_bytes: int) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(n_bytes))
            self.end_headers()

    return Handler


def _range_start(header: str | None) -> int:
    """N of `bytes=N-` (the only form huggingface_hub sends), 0 without a Range."""
    if not header:
        return 0
    assert header.startswith("bytes=") and header.endswith("-"), header
    return int(header[len("bytes="):-1])
