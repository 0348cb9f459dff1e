"""``oam serve`` hardened (issue 32, items 2, 8 and 9), each through a real ``oam serve``
subprocess on loopback, on the scripted engine unless a test says otherwise:

- who may ask: the Host and Origin checks, the JSON Content-Type rule, the API key, and JSON
  nested too deep (item 2);
- slow and heavy clients: a large history read off the event loop, the body deadline and
  the request limit, a client leaving mid-body, streams closed after HTTP/1.0 and
  ``Connection: close`` (item 8);
- what a request may ask: a forced call cut off by max_tokens is 422 and not retried, the
  server's script continues across a conversation's requests, ``stop`` and the sampling
  fields, ``GET /health``, the served model's name (item 9).

``OAM_BRIDGE_ROOT`` names another source tree whose server these start (a checkout of an
older commit shows which tests fail there), as tests/support/harness.py does for the bridge.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.harness import BRIDGE_ROOT

DEADLINE = 30
SERVE = [sys.executable, "-c", "import sys; from bridge.hosts.http.app import main; sys.exit(main(sys.argv[1:]))"]
HELLO: Any = {"model": "scripted", "messages": [{"role": "user", "content": "Hello"}]}
DICE: Any = {
    "type": "function",
    "function": {
        "name": "roll_dice",
        "parameters": {"type": "object", "properties": {"sides": {"type": "integer"}}, "required": ["sides"]},
    },
}
FORCED: Any = {"type": "function", "function": {"name": "roll_dice"}}


class Served:
    """A running ``oam serve``: its URL, port and everything it wrote on stderr."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, seen: list[str]) -> None:
        self.proc, self.url, self.lines = proc, url, seen
        self.port = int(url.rsplit(":", 1)[1])
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.decode("utf-8", "replace"))

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def client(self, api_key: str = "unused", max_retries: int = 0, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=api_key, max_retries=max_retries, timeout=DEADLINE, **kw
        )

    def post(self, body: Any, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        h = {"Content-Type": "application/json", **(headers or {})}
        return httpx.post(self.url + "/v1/chat/completions", content=content, headers=h, timeout=DEADLINE, **kw)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def serve(*args: str, env: dict[str, str] | None = None) -> Served:
    """``oam serve ARGS`` on a free loopback port (the scripted engine unless ARGS say)."""
    engine = [] if "--engine" in args else ["--engine", "scripted"]
    proc = subprocess.Popen(
        [*SERVE, *engine, *args, "--port", "0"],
        cwd=BRIDGE_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode("utf-8", "replace")
        seen.append(line)
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return Served(proc, found.group(1), seen)
        if not line:
            break
    proc.kill()
    raise AssertionError("the server did not start: " + "".join(seen))


@pytest.fixture(scope="module")
def scripted() -> Iterator[Served]:
    s = serve("--log-level", "info")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.stderr, s.stderr


def error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    return body["error"]  # type: ignore[no-any-return]


# ---- item 2: who may ask ----


def test_http_a_web_pages_simple_request_is_refused(scripted: Served) -> None:
    """A page's CORS "simple" request (text/plain, its own Origin and, after DNS rebinding,
    its own Host) got a 200 and an answer; each of the three now refuses it."""
    body = json.dumps(HELLO).encode()
    page = {"Content-Type": "text/plain", "Origin": "http://evil.example", "Host": "evil.example"}
    r = scripted.post(body, page)
    assert r.status_code == 403 and error(r)["code"] == "host_not_allowed"
    r = scripted.post(body, {**page, "Host": f"127.0.0.1:{scripted.port}"})
    assert r.status_code == 403 and error(r)["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in r.headers
    r = scripted.post(body, {"Content-Type": "text/plain"})
    assert r.status_code == 415 and error(r)["code"] == "unsupported_media_type"
    assert error(r)["type"] == "invalid_request_error"
    for host in ("localhost", f"localhost:{scripted.port}", "127.0.0.1", f"[::1]:{scripted.port}"):
        r = scripted.post(HELLO, {"Host": host})
        assert r.status_code == 200, (host, r.text)
    r = scripted.post(HELLO, {"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "You said: Hello"


def test_http_allowed_hosts_and_origins_are_answered_with_cors_headers() -> None:
    s = serve("--allow-host", "npc.example", "--allow-origin", "http://game.example:3000")
    try:
        r = s.post(HELLO, {"Host": "npc.example:8090", "Origin": "http://game.example:3000"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://game.example:3000"
        r = s.post(HELLO, {"Host": "other.example"})
        assert r.status_code == 403 and error(r)["code"] == "host_not_allowed"
        preflight = httpx.options(
            s.url + "/v1/chat/completions",
            headers={
                "Origin": "http://game.example:3000",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
            timeout=DEADLINE,
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == "http://game.example:3000"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        r = s.post(HELLO, {"Origin": "http://evil.example"})
        assert r.status_code == 403 and error(r)["code"] == "origin_not_allowed"
    finally:
        assert s.stop() == 0


def test_http_the_api_key_is_required_where_one_is_set(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-from-file\n")
    for args, env, key in (
        (["--api-key", "s3cret"], None, "s3cret"),
        (["--api-key-file", str(key_file)], None, "s3cret-from-file"),
        ([], {"OAM_API_KEY": "s3cret-from-env"}, "s3cret-from-env"),
    ):
        s = serve(*args, env=env)
        try:
            r = s.post(HELLO)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert error(r) == {
                "message": error(r)["message"],
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
                "retryable": False,
            }
            assert s.post(HELLO, {"Authorization": "Bearer wrong"}).status_code == 401
            assert s.post(HELLO, {"Authorization": key}).status_code == 401, "only a bearer token"
            assert httpx.get(s.url + "/v1/models", timeout=DEADLINE).status_code == 401
            assert httpx.get(s.url + "/health", timeout=DEADLINE).json() == {"status": "ok"}
            with pytest.raises(openai.AuthenticationError) as e:
                s.client(api_key="wrong").chat.completions.create(model="scripted", messages=HELLO["messages"])
            assert e.value.code == "invalid_api_key"
            r2 = s.client(api_key=key).chat.completions.create(model="scripted", messages=HELLO["messages"])
            assert r2.choices[0].message.content == "You said: Hello"
        finally:
            assert s.stop() == 0


DEEP = "@DEEP@"


def _nested(depth: int) -> str:
    """JSON text of a list nested ``depth`` deep."""
    return "[" * depth + "1" + "]" * depth


def _deep_schema(depth: int) -> str:
    """JSON text of an object schema nested ``depth`` schemas deep."""
    return '{"type":"object","properties":{"a":' * depth + '{"type":"string"}' + "}}" * depth


def _with(body: Any, deep: str) -> bytes:
    """``body`` as JSON text with the string ``DEEP`` in it replaced by the JSON text ``deep``."""
    return json.dumps(body).replace(json.dumps(DEEP), deep).encode()


def test_http_json_nested_too_deep_is_400_too_deep(scripted: Served) -> None:
    """5,000 deep in messages (or response_format, tool parameters, call arguments, a script's
    json step) was a 500 internal_error with two tracebacks; the JSON-RPC host answers such
    a line invalid_message, reason too_deep. Deeper than 100 levels: 400, reason too_deep."""
    user = [{"role": "user", "content": "Hi"}]

    def with_args(args: str) -> bytes:
        call = {"id": "c1", "type": "function", "function": {"name": "t", "arguments": args}}
        return json.dumps(
            {
                "model": "scripted",
                "messages": [
                    *user,
                    {"role": "assistant", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                ],
            }
        ).encode()

    bodies = {
        "messages": _with({"model": "scripted", "messages": DEEP}, _nested(5000)),
        "response_format": _with(
            {
                "model": "scripted",
                "messages": user,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP}},
            },
            _deep_schema(2500),
        ),
        "tools": _with(
            {
                "model": "scripted",
                "messages": user,
                "tools": [{"type": "function", "function": {"name": "t", "parameters": DEEP}}],
            },
            _deep_schema(2500),
        ),
        "arguments": with_args('{"x":' + _nested(5000) + "}"),
        "arguments, 150 deep": with_args('{"x":' + _nested(150) + "}"),
        "script": _with({"model": "scripted", "messages": user, "script": [{"json": DEEP}]}, _nested(5000)),
        "script, 150 deep": _with({"model": "scripted", "messages": user, "script": [{"json": DEEP}]}, _nested(150)),
    }
    for what, body in bodies.items():
        r = scripted.post(body)
        assert r.status_code == 400, (what, r.status_code, r.text[:300])
        assert (error(r)["code"], error(r)["reason"]) == ("invalid_request", "too_deep"), what
    # within the limit: answered
    r = scripted.post(_with({"model": "scripted", "messages": user, "script": [{"json": DEEP}]}, _nested(90)))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == _nested(90)
    assert "Traceback" not in scripted.stderr


# ---- item 8: slow and heavy clients ----


def _history(pairs: int) -> list[dict[str, str]]:
    msgs = []
    for _ in range(pairs):
        msgs += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    return [*msgs, {"role": "user", "content": "last"}]


def test_http_a_large_history_does_not_hold_up_small_requests(scripted: Served) -> None:
    """A 3.9 MB request (120,000 history messages) was decoded and mapped on the event loop:
    a small request sent meanwhile waited 0.4-1.8 s (0.97 s here). Now that work runs in a
    worker thread, and a running engine gets no more history turns than its window could
    show: the small request waits 0.1-0.25 s on a busy 2-core machine (garbage collection
    passes over the large request's objects, which hold the interpreter lock)."""
    big = json.dumps({"model": "scripted", "messages": _history(60_000)}, separators=(",", ":")).encode()
    assert 3_500_000 < len(big) < 4 * 1024 * 1024
    small_latencies: list[float] = []
    done = threading.Event()

    def small() -> None:
        with httpx.Client(timeout=DEADLINE) as c:
            c.post(scripted.url + "/v1/chat/completions", json=HELLO)  # a warm connection
            while not done.is_set():
                t0 = time.monotonic()
                r = c.post(scripted.url + "/v1/chat/completions", json=HELLO)
                small_latencies.append(time.monotonic() - t0)
                assert r.status_code == 200
                time.sleep(0.01)

    with ThreadPoolExecutor(2) as pool:
        watcher = pool.submit(small)
        time.sleep(0.3)
        for _ in range(3):
            r = scripted.post(big)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "You said: last"
        done.set()
        watcher.result()
    worst = max(small_latencies)
    print(f"worst small-request latency {worst:.3f} s")
    assert worst < 0.35, f"a small request waited {worst:.2f} s behind a large one"


def _slow_body(port: int, body: bytes, started: threading.Event, pace: float = 0.2) -> bytes:
    """A request whose body comes one byte every ``pace`` seconds; what the server answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        started.set()
        got = b""
        try:
            for i in range(len(body)):
                s.sendall(body[i : i + 1])
                s.settimeout(pace)
                try:
                    got += s.recv(65536)
                    if got:
                        break
                except TimeoutError:
                    pass
            s.settimeout(DEADLINE)
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                got += piece
        except (BrokenPipeError, ConnectionResetError):
            pass
        return got


def test_http_slow_bodies_count_in_the_limit_and_time_out() -> None:
    """Two clients sending their bodies at 5 bytes a second: they hold the two places of
    --max-requests 2 (a third request is 503 overloaded) until --body-timeout 1.5 ends them
    with 408 and closes their connections; then the server answers again."""
    s = serve("--max-requests", "2", "--body-timeout", "1.5")
    try:
        body = json.dumps(HELLO).encode()
        events = [threading.Event(), threading.Event()]
        with ThreadPoolExecutor(2) as pool:
            t0 = time.monotonic()
            slow = [pool.submit(_slow_body, s.port, body, e) for e in events]
            for e in events:
                assert e.wait(DEADLINE)
            time.sleep(0.5)
            r = s.post(HELLO)
            assert r.status_code == 503 and error(r)["code"] == "overloaded", r.text
            answers = [f.result(timeout=DEADLINE) for f in slow]
            elapsed = time.monotonic() - t0
        for a in answers:
            assert a.startswith(b"HTTP/1.1 408"), a[:200]
            assert b'"code":"request_timeout"' in a
        assert elapsed < 5, f"the slow bodies took {elapsed:.1f} s to be refused"
        assert s.post(HELLO).status_code == 200
    finally:
        assert s.stop() == 0
    assert "Traceback" not in s.stderr, s.stderr


def test_http_slow_headers_are_cut_off() -> None:
    s = serve()
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=DEADLINE) as sock:
            t0 = time.monotonic()
            closed = False
            for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n":
                try:
                    sock.sendall(bytes([byte]))
                    sock.settimeout(0.5)
                    if sock.recv(100) == b"":
                        closed = True
                        break
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
            assert closed and time.monotonic() - t0 < 10
    finally:
        assert s.stop() == 0


def test_http_a_client_leaving_mid_body_logs_one_line(scripted: Served) -> None:
    before = len(scripted.lines)
    body = json.dumps(HELLO).encode()
    with socket.create_connection(("127.0.0.1", scripted.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        time.sleep(0.3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("request body" in x for x in scripted.lines[before:]):
        time.sleep(0.05)
    time.sleep(0.3)
    new = scripted.lines[before:]
    assert [x for x in new if "request body" in x] == [
        "oam serve INFO oam_bridge.http: client disconnected before the end of its request body\n"
    ], new
    assert not any("Traceback" in x or "ERROR" in x for x in new), new
    assert scripted.post(HELLO).status_code == 200


def _raw_stream(port: int, version: str, extra: str = "") -> tuple[bytes, float | None]:
    """A streamed request over a raw socket: what came back, and how long after the request
    the server closed the connection (None: it did not, within 3 s)."""
    body = json.dumps({**HELLO, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        t0 = time.monotonic()
        sock.sendall(
            f"POST /v1/chat/completions HTTP/{version}\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n".encode()
            + body
        )
        sock.settimeout(3)
        got = b""
        try:
            while True:
                piece = sock.recv(65536)
                if not piece:
                    return got, time.monotonic() - t0
                got += piece
        except TimeoutError:
            return got, None


def test_http_a_stream_closes_its_connection_after_http_1_0_and_connection_close(scripted: Served) -> None:
    for version, extra in (("1.0", ""), ("1.1", "Connection: close\r\n")):
        got, closed_after = _raw_stream(scripted.port, version, extra)
        assert b"data: [DONE]" in got, got[-300:]
        assert closed_after is not None and closed_after < 2, f"HTTP/{version} {extra!r}: the connection stayed open"
    got, closed_after = _raw_stream(scripted.port, "1.1")
    assert b"0\r\n\r\n" in got and closed_after is None, "a keep-alive stream stays open for the next request"


@pytest.mark.skipif(not Path("/usr/bin/curl").exists(), reason="no curl")
def test_http_curl_http1_0_stream_ends(scripted: Served) -> None:
    r = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "--http1.0",
            "--max-time",
            "10",
            scripted.url + "/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps({**HELLO, "stream": True}),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert r.returncode == 0 and r.stdout.rstrip().endswith("data: [DONE]"), (r.returncode, r.stderr)


# ---- item 9: what a request may ask ----


CUT_CALL = {"text": '{"tool_calls":[{"name":"roll_dice","arguments":{"si', "finishReason": "length"}


def test_http_a_forced_call_cut_off_by_max_tokens_is_422_and_not_retried(scripted: Served) -> None:
    """What the llama engine does when max_tokens cuts a forced call short (its text is the
    start of a call batch): a 500 marked retryable, which the openai client sent 3 times."""
    sent: list[httpx.Request] = []
    client = scripted.client(max_retries=2, http_client=httpx.Client(event_hooks={"request": [sent.append]}))
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Roll"}],
            tools=[DICE],
            tool_choice=FORCED,
            max_tokens=5,
            extra_body={"script": [CUT_CALL]},
        )
    assert len(sent) == 1, "not retried"
    err = e.value.body
    assert isinstance(err, dict)
    assert (e.value.status_code, err["code"], err["param"], err["retryable"]) == (
        422,
        "max_tokens_reached",
        "max_tokens",
        False,
    )
    assert "retry-after" not in e.value.response.headers
    # a JSON answer cut off by the budget, too
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    with pytest.raises(openai.UnprocessableEntityError) as e2:
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Open?"}],
            response_format=fmt,
            max_completion_tokens=4,
            extra_body={"script": [{"text": '{"open": tr', "finishReason": "length"}]},
        )
    assert e2.value.code == "max_tokens_reached" and e2.value.param == "max_completion_tokens"
    # streamed: the error event carries the same code
    r = scripted.post(
        {
            "model": "scripted",
            "stream": True,
            "messages": [{"role": "user", "content": "Roll"}],
            "tools": [DICE],
            "tool_choice": FORCED,
            "max_tokens": 5,
            "script": [CUT_CALL],
        }
    )
    last = [x for x in r.text.split("\n") if x.startswith("data: ")][-1]
    assert json.loads(last[6:])["error"]["code"] == "max_tokens_reached"
    # a forced step answered in words is still the model's failure (500, retryable)
    r = scripted.post(
        {
            "model": "scripted",
            "messages": [{"role": "user", "content": "Roll"}],
            "tools": [DICE],
            "tool_choice": FORCED,
            "script": [{"text": "No."}],
        }
    )
    assert r.status_code == 500 and error(r)["code"] == "generation_failed"


def test_http_the_servers_script_continues_across_a_conversations_requests(tmp_path: Path) -> None:
    """``oam serve --script``: each request used to start the script over, so a tool round
    trip called the tool again and again. A request that continues an earlier one (its
    messages up to its last assistant message are that request's) continues the script."""
    script = tmp_path / "scene.json"
    script.write_text(
        json.dumps(
            {
                "default": [
                    {
                        "text": "Let me roll.",
                        "toolCalls": [{"id": "r1", "name": "roll_dice", "arguments": {"sides": 6}}],
                    },
                    {"text": "You rolled a four."},
                    {"text": "Farewell."},
                ]
            }
        )
    )
    s = serve("--script", str(script))
    try:
        client = s.client()
        messages: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Roll"}]
        first = client.chat.completions.create(model="scripted", messages=messages, tools=[DICE])
        assert first.choices[0].finish_reason == "tool_calls"
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": "r1", "content": "4"})
        for _ in range(2):  # a retry of the same request gets the same answer
            second = client.chat.completions.create(model="scripted", messages=messages, tools=[DICE])
            assert second.choices[0].finish_reason == "stop"
            assert second.choices[0].message.content == "You rolled a four."
        messages += [{"role": "assistant", "content": "You rolled a four."}, {"role": "user", "content": "Bye"}]
        third = client.chat.completions.create(model="scripted", messages=messages, tools=[DICE])
        assert third.choices[0].message.content == "Farewell."
        # another conversation starts the script from its first step
        other = client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Roll again"}],
            tools=[DICE],
        )
        assert other.choices[0].finish_reason == "tool_calls"
    finally:
        assert s.stop() == 0


def test_http_stop_cuts_the_answer_before_the_stop_sequence(scripted: Served) -> None:
    client = scripted.client()
    r = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hello"}],
        stop=["goes"],
        extra_body={"script": [{"text": "Halt! Who goes there? Speak!", "chunkMs": 50}]},
    )
    assert r.choices[0].message.content == "Halt! Who " and r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens == 2
    stream = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hello"}],
        stop="o g",  # across two of the engine's pieces
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"script": [{"text": "Halt! Who goes there?"}]},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Halt! Wh"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    # no stop sequence in the answer: all of it
    r = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hello"}],
        stop=["\n\n", "xyz"],
        extra_body={"script": [{"text": "Halt! Who goes there?"}]},
    )
    assert r.choices[0].message.content == "Halt! Who goes there?"


def test_http_sampling_fields_are_taken_where_the_engine_honours_them(scripted: Served) -> None:
    client = scripted.client()
    r = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hi"}],
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={"42": 10},
        seed=7,
        extra_body={"top_k": 20, "min_p": 0.1},
    )
    assert r.choices[0].message.content == "You said: Hi"
    for field, value in (("top_k", 20), ("min_p", 0.2), ("presence_penalty", 1.0), ("logit_bias", {"1": 5})):
        resp = scripted.post({"model": "llama", "messages": [{"role": "user", "content": "Hi"}], field: value})
        err = error(resp)
        assert resp.status_code == 400 and (err["code"], err["param"], err["reason"]) == (
            "invalid_request",
            field,
            "unsupported_parameter",
        ), err
        assert "llama engine" in err["message"]
    resp = scripted.post({"model": "scripted", "messages": [{"role": "user", "content": "Hi"}], "top_k": -1})
    assert resp.status_code == 400 and error(resp)["param"] == "top_k"


def test_http_health_and_the_served_models_name(scripted: Served) -> None:
    r = httpx.get(scripted.url + "/health", timeout=DEADLINE)
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    models = httpx.get(scripted.url + "/v1/models", timeout=DEADLINE).json()["data"]
    served = [x for x in models if x.get("engine") == "llama"]
    if not served:
        pytest.skip("no llama model here")
    name = served[0]["id"]
    assert httpx.get(f"{scripted.url}/v1/models/{name}", timeout=DEADLINE).json()["engine"] == "llama"
    # the name selects the llama engine (which honours no top_k 5: the refusal says so)
    resp = scripted.post({"model": name, "messages": [{"role": "user", "content": "Hi"}], "top_k": 5})
    assert resp.status_code == 400 and "llama engine" in error(resp)["message"]
    resp = scripted.post({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code == 400 and error(resp)["code"] == "invalid_params"


# ---- on the bundled model ----


@pytest.mark.model
def test_http_a_forced_call_cut_off_on_the_bundled_model_is_422() -> None:
    s = serve("--engine", "llama")
    try:
        sent: list[httpx.Request] = []
        client = s.client(max_retries=2, http_client=httpx.Client(event_hooks={"request": [sent.append]}))
        models = [x.id for x in client.models.list()]
        served = next(x for x in models if x not in ("scripted", "llama", "native", "openai", "auto"))
        for max_tokens in (3, 12):
            sent.clear()
            with pytest.raises(openai.UnprocessableEntityError) as e:
                client.chat.completions.create(
                    model=served,
                    messages=[{"role": "user", "content": "Roll a die"}],
                    tools=[DICE],
                    tool_choice=FORCED,
                    max_tokens=max_tokens,
                    temperature=0,
                )
            assert e.value.code == "max_tokens_reached" and len(sent) == 1, (max_tokens, e.value.body)
    finally:
        assert s.stop() == 0


# ---- issue 32, item 14: oam serve's log lines ----


def test_http_a_model_path_with_a_newline_is_logged_on_one_line() -> None:
    # The same escaping as oam-bridge's (bridge/hosts/_log.py): the unavailable model's path is
    # said in one line; its newline cannot start a forged record.
    forged = "oam serve ERROR bridge: the server is compromised"
    s = serve("--engine", "llama", "--model", f"/nowhere/model.gguf\n{forged}\r.gguf", "--log-level", "info")
    try:
        time.sleep(0.5)
    finally:
        s.stop()
    lines = s.stderr.splitlines()
    assert not [line for line in lines if line.startswith(forged)], lines
    assert [line for line in lines if "/nowhere/model.gguf\\noam serve ERROR" in line], lines
