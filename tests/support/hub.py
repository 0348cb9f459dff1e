"""A stand-in Hugging Face Hub on loopback, for ``oam models pull`` and ``make dist``'s pulls
(tests/process/test_oam_models.py, tests/process/test_dist_model.py): it serves one file,
``hub.body``, as ``hub.repo``/``hub.file``, to huggingface_hub pointed at it by
``HF_ENDPOINT`` (``hub_env``), under a catalog entry ``hub_env`` adds (``OAM_MODELS_CATALOG``).

It answers what huggingface_hub's ``hf_hub_download`` path needs: ``HEAD`` and
``GET /{repo}/resolve/{revision}/{file}`` with ``X-Repo-Commit``, ``ETag`` and
``X-Linked-Etag`` (the sha256), ``X-Linked-Size``, ``Content-Length``, and Range requests
(``206`` with ``Content-Range``). Each GET can be told to misbehave: cut the connection
mid-file, or answer 503.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = "oam-test/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    """The stand-in's state: the file it serves (``repo``/``file``), the sha256 it claims,
    what each GET does (``plan``: "cut" sends half the body and closes, "503" refuses; then
    normal) and every request it saw (method, path, Range header)."""

    body: bytes
    sha256: str
    repo: str = REPO
    file: str = FILE
    plan: list[str] = field(default_factory=list)
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)
    port: int = 0


def _handler(hub: Hub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _headers(self, status: int, length: int, extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in {
                "X-Repo-Commit": COMMIT,
                "ETag": f'"{hub.sha256}"',
                "X-Linked-Etag": f'"{hub.sha256}"',
                "X-Linked-Size": str(len(hub.body)),
                "Accept-Ranges": "bytes",
                "Content-Length": str(length),
                "Content-Type": "application/octet-stream",
                **(extra or {}),
            }.items():
                self.send_header(k, v)
            self.end_headers()

        def _known(self) -> bool:
            hub.seen.append((self.command, self.path, self.headers.get("Range")))
            if self.path != f"/{hub.repo}/resolve/main/{hub.file}":
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False
            return True

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
            if self._known():
                self._headers(200, len(hub.body))

        def do_GET(self) -> None:  # noqa: N802
            if not self._known():
                return
            step = hub.plan.pop(0) if hub.plan else "ok"
            if step == "503":
                self._headers(503, 0)
                return
            start = 0
            m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if m:
                start = int(m.group(1))
                end = len(hub.body) - 1
                self._headers(206, len(hub.body) - start, {"Content-Range": f"bytes {start}-{end}/{len(hub.body)}"})
            else:
                self._headers(200, len(hub.body))
            data = hub.body[start:]
            if step == "cut":
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(data)

    return Handler


@contextmanager
def serve_hub(body: bytes, repo: str = REPO, file: str = FILE) -> Iterator[Hub]:
    """The stand-in, serving ``body`` as ``repo``/``file``, for the block's duration."""
    state = Hub(body=body, sha256=hashlib.sha256(body).hexdigest(), repo=repo, file=file)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def hub_env(tmp_path: Path, port: int, name: str, size: int, repo: str = REPO, file: str = FILE) -> dict[str, str]:
    """This process's environment for a pull from the stand-in on ``port``: a catalog file in
    ``tmp_path`` with one entry, ``name`` (``repo``/``file``, ``size`` bytes), pulled models in
    ``tmp_path/models``, and no Hugging Face setting or token of this machine's."""
    catalog = tmp_path / "catalog.json"
    entry = {"name": name, "repo": repo, "file": file, "size": size, "size_exact": True}
    catalog.write_text(json.dumps([entry]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_HOME=str(tmp_path / "hf-home"),  # no token of this machine's is read or sent
        HF_HUB_DISABLE_TELEMETRY="1",
        OAM_MODELS_DIR=str(tmp_path / "models"),
        OAM_MODELS_CATALOG=str(catalog),
    )
    return env
