"""The openai engine through the real ``oam-bridge`` subprocess, against a real
OpenAI-compatible server on loopback: llama-cpp-python's ``llama_cpp.server`` with the bundled
SmolLM2 model (started once for the module), plus a tiny stub server for a 429."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from typing import Any

import jsonschema
import pytest
import trio

from bridge.engines import llama
from bridge.engines.llama._cpu import llama_cpp_server_command

from tests.conftest import ROOT, Proc, open_bridge

INVENTORY_TOOL = {
    "name": "check_inventory",
    "description": "Look up how many of an item the tavern has in stock.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string", "enum": ["ale", "bread", "mead", "stew"]}}, "required": ["item"]},
}
PRICE_TOOL = {
    "name": "check_price",
    "description": "Look up the price of an item in copper coins.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string", "enum": ["ale", "bread", "mead", "stew"]}}, "required": ["item"]},
}
MOOD_SCHEMA = {
    "type": "object",
    "properties": {"mood": {"type": "string", "enum": ["happy", "grumpy", "tired"]}, "line": {"type": "string", "maxLength": 60}},
    "required": ["mood", "line"],
}

try:
    import llama_cpp.server  # noqa: F401

    _server_problem = None
except ImportError as e:  # the test extra installs llama-cpp-python[server]
    _server_problem = f"llama_cpp.server is not installed: {e}"

# Skipped where the model or the server is missing, except under CI=true: there they fail.
pytestmark = pytest.mark.skipif(
    (not llama.availability()[0] or _server_problem is not None) and os.environ.get("CI") != "true",
    reason=_server_problem or f"llama engine unavailable: {llama.availability()[1]}",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """``llama_cpp.server`` on the bundled model, one request at a time in the server
    (``--interrupt_requests False``: a new request waits instead of cutting the running one)."""
    port = free_port()
    proc = subprocess.Popen(
        [*llama_cpp_server_command(), "--model", llama.default_model_path(), "--host", "127.0.0.1",
         "--port", str(port), "--n_threads", "1", "--interrupt_requests", "False", "--verbose", "False"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                raise AssertionError(f"llama_cpp.server exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            if time.monotonic() > deadline:
                raise AssertionError("llama_cpp.server did not answer /v1/models within 120 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def bridge(nursery: trio.Nursery, url: str, *args: str) -> Proc:
    p = await open_bridge(nursery, "--engine", "openai", "--openai-url", url, *args)
    init = await p.client.initialize()
    info = {e["name"]: e for e in init["engines"]}["openai"]
    assert info["available"] is True and info["reason"] is None, info
    return p


async def finish(p: Proc) -> None:
    assert p.process.stdin is not None
    await p.process.stdin.aclose()
    with trio.fail_after(10):
        assert await p.process.wait() == 0


def deltas(p: Proc, turn_id: str, method: str = "turn/textDelta") -> list[str]:
    return [e["params"]["delta"] for e in p.client.turn_events(turn_id) if e["method"] == method]


async def test_a_streamed_text_turn(server_url: str) -> None:
    async with trio.open_nursery() as nursery:
        p = await bridge(nursery, server_url)
        c = p.client
        created = await c.call("npc/create", {"npcId": "keeper", "engine": "openai", "instructions": "You keep a tavern. Answer in one sentence.",
                                               "options": {"temperature": 0, "maxTokens": 24, "seed": 1}})
        assert created["engine"] == "openai" and created["contextSize"] > 0
        with trio.fail_after(60):
            tid, done = await c.turn("keeper", "Hello! What do you sell?")
        assert done["method"] == "turn/completed", done
        parts = deltas(p, tid)
        assert len(parts) > 1, "streamed in more than one delta"
        assert done["params"]["text"] == "".join(parts) and done["params"]["text"].strip()
        assert done["params"]["finishReason"] in ("stop", "length")
        assert done["params"]["usage"]["outputTokens"] > 0
        c.assert_well_formed(tid)
        save = await c.call("npc/transcript", {"npcId": "keeper"})
        assert [m["role"] for m in save["turns"][0]] == ["user", "assistant"]
        await finish(p)


async def test_a_forced_tool_call_validates_then_the_final_text(server_url: str) -> None:
    async with trio.open_nursery() as nursery:
        p = await bridge(nursery, server_url)
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai", "instructions": "You keep a tavern.", "tools": [INVENTORY_TOOL],
                                    "options": {"temperature": 0, "maxTokens": 48, "seed": 1}})
        with trio.fail_after(90):
            r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Do you have ale?", "toolChoice": {"tool": "check_inventory"}, "maxToolRounds": 1})
            ev = await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
            assert ev["params"]["name"] == "check_inventory"
            jsonschema.validate(ev["params"]["arguments"], INVENTORY_TOOL["parameters"])
            await c.call("npc/submit", {"npcId": "keeper", "callId": ev["params"]["callId"], "output": {"count": 3}})
            done = await c.wait_terminal(r["turnId"])
        assert done["method"] == "turn/completed", done
        params = done["params"]
        assert params["toolCalls"][0]["output"] == {"count": 3} and params["steps"] == 2
        assert params["text"] == "".join(deltas(p, r["turnId"]))  # the final step's text (the call step had none)
        assert not [w for w in params["warnings"] if "did not constrain" in w], params["warnings"]
        c.assert_well_formed(r["turnId"])
        save = await c.call("npc/transcript", {"npcId": "keeper"})
        assert [m["role"] for m in save["turns"][0]] == ["user", "assistant", "tool", "assistant"]
        await finish(p)


async def test_a_schema_turn_parses_and_validates(server_url: str) -> None:
    async with trio.open_nursery() as nursery:
        p = await bridge(nursery, server_url)
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai", "instructions": "You keep a tavern. Answer in JSON.",
                                    "options": {"temperature": 0, "maxTokens": 64, "seed": 1}})
        with trio.fail_after(90):
            tid, done = await c.turn("keeper", "How are you today?", schema=MOOD_SCHEMA)
        assert done["method"] == "turn/completed", done
        jsonschema.validate(done["params"]["json"], MOOD_SCHEMA)
        assert json.loads("".join(deltas(p, tid, "turn/partialJson"))) == done["params"]["json"]
        assert not [w for w in done["params"]["warnings"] if "did not constrain" in w]
        await finish(p)


async def test_grammar_mode_a_required_step_with_two_tools_calls_one(server_url: str) -> None:
    """``--openai-grammar``: llama_cpp.server writes text when offered several tools; with the
    llama engine's grammar in the request the first (``required``) step calls one of them
    with arguments valid against its schema."""
    async with trio.open_nursery() as nursery:
        p = await bridge(nursery, server_url, "--openai-grammar")
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai", "instructions": "You keep a tavern.",
                                    "tools": [INVENTORY_TOOL, PRICE_TOOL], "options": {"temperature": 0, "maxTokens": 48, "seed": 1}})
        with trio.fail_after(90):
            r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "How much is your ale?", "toolChoice": "required", "maxToolRounds": 1})
            ev = await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
            tool = {t["name"]: t for t in (INVENTORY_TOOL, PRICE_TOOL)}[ev["params"]["name"]]
            jsonschema.validate(ev["params"]["arguments"], tool["parameters"])
            await c.call("npc/submit", {"npcId": "keeper", "callId": ev["params"]["callId"], "output": {"copper": 4}})
            done = await c.wait_terminal(r["turnId"])
        assert done["method"] == "turn/completed", done
        params = done["params"]
        assert params["toolCalls"][0]["name"] == tool["name"] and params["toolCalls"][0]["output"] == {"copper": 4}
        assert params["text"] == "".join(deltas(p, r["turnId"])) and "tool_calls" not in params["text"]
        assert not [w for w in params["warnings"] if "did not constrain" in w], params["warnings"]
        c.assert_well_formed(r["turnId"])
        await finish(p)


async def test_grammar_mode_an_auto_step_speaks_and_a_schema_turn_parses(server_url: str) -> None:
    """``OAM_OPENAI_GRAMMAR=1``: an ``auto`` step with two tools may answer in text (streamed
    in deltas, no JSON envelope), and a schema turn is constrained by the grammar."""
    async with trio.open_nursery() as nursery:
        p = await open_bridge(nursery, "--engine", "openai", "--openai-url", server_url, env={"OAM_OPENAI_GRAMMAR": "1"})
        c = p.client
        await c.initialize()
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai", "instructions": "You keep a tavern. Answer in one sentence.",
                                    "tools": [INVENTORY_TOOL, PRICE_TOOL], "options": {"temperature": 0, "maxTokens": 24, "seed": 1}})
        with trio.fail_after(90):
            tid, done = await c.turn("keeper", "Good morning! Lovely weather, isn't it?")
        assert done["method"] == "turn/completed", done
        parts = deltas(p, tid)
        assert done["params"]["toolCalls"] == [] and done["params"]["steps"] == 1, done
        assert len(parts) > 1 and done["params"]["text"] == "".join(parts) and done["params"]["text"].strip()
        assert "{" not in done["params"]["text"]
        c.assert_well_formed(tid)
        await c.call("npc/create", {"npcId": "judge", "engine": "openai", "instructions": "You keep a tavern.",
                                    "options": {"temperature": 0, "maxTokens": 64, "seed": 1}})
        with trio.fail_after(90):
            tid, done = await c.turn("judge", "How are you today?", schema=MOOD_SCHEMA)
        assert done["method"] == "turn/completed", done
        jsonschema.validate(done["params"]["json"], MOOD_SCHEMA)
        assert not [w for w in done["params"]["warnings"] if "did not constrain" in w]
        await finish(p)


async def test_cancel_mid_stream_rolls_back_and_the_npc_goes_on(server_url: str) -> None:
    async with trio.open_nursery() as nursery:
        p = await bridge(nursery, server_url)
        c = p.client
        await c.call("npc/create", {"npcId": "bard", "engine": "openai", "instructions": "You are a bard who tells very long stories.",
                                    "options": {"temperature": 0.8, "maxTokens": 400, "seed": 7}})
        with trio.fail_after(60):
            r = await c.call("npc/respond", {"npcId": "bard", "prompt": "Tell me the longest tale you know."})
            await c.wait_event("turn/textDelta", turnId=r["turnId"])
            t0 = trio.current_time()
            assert (await c.call("npc/cancel", {"npcId": "bard"}))["cancelled"] == [r["turnId"]]
            done = await c.wait_terminal(r["turnId"])
            assert trio.current_time() - t0 < 2
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
        assert (await c.call("npc/transcript", {"npcId": "bard"}))["turns"] == []
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai", "options": {"temperature": 0, "maxTokens": 8}})
        with trio.fail_after(90):  # the server and the bridge go on (the cut request is closed)
            _, after = await c.turn("keeper", "Hello")
        assert after["method"] == "turn/completed", after
        await finish(p)


async def test_four_npcs_stream_at_once(server_url: str) -> None:
    async with trio.open_nursery() as nursery:
        p = await bridge(nursery, server_url)
        c = p.client
        ids = [f"npc{i}" for i in range(4)]
        for i, npc in enumerate(ids):
            await c.call("npc/create", {"npcId": npc, "engine": "openai", "instructions": f"You are villager number {i}.",
                                        "options": {"temperature": 0, "maxTokens": 16, "seed": i}})
        turns = [(await c.call("npc/respond", {"npcId": npc, "prompt": "Good morning!"}))["turnId"] for npc in ids]
        with trio.fail_after(120):
            done = [await c.wait_terminal(t) for t in turns]
        for t, d in zip(turns, done):
            assert d["method"] == "turn/completed", d
            assert d["params"]["text"] == "".join(deltas(p, t)) and deltas(p, t)
            c.assert_well_formed(t)
        await finish(p)


async def test_an_unreachable_server_fails_the_turn_quickly() -> None:
    port = free_port()  # nothing listens there
    async with trio.open_nursery() as nursery:
        p = await bridge(nursery, f"http://127.0.0.1:{port}/v1")
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai"})
        t0 = trio.current_time()
        with trio.fail_after(10):
            _, done = await c.turn("keeper", "Hello")
        assert trio.current_time() - t0 < 6
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "model_unavailable", done
        assert str(port) in done["params"]["error"]["message"]
        assert (await c.call("npc/transcript", {"npcId": "keeper"}))["turns"] == []
        await finish(p)


async def _stub(stream: trio.SocketStream, status: str, body: bytes, extra: str = "") -> None:
    """One HTTP/1.1 exchange: read the request (headers and a Content-Length body), answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    await stream.send_all(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode() + body)
    await stream.aclose()


async def test_a_429_is_rate_limited_and_the_engine_is_unavailable_without_a_url() -> None:
    async def handler(stream: trio.SocketStream) -> None:
        await _stub(stream, "429 Too Many Requests", b'{"error":{"message":"slow down","type":"rate_limit"}}', "Retry-After: 1\r\n")

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        p = await bridge(nursery, f"http://127.0.0.1:{port}/v1", "--openai-model", "stub")
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai"})
        with trio.fail_after(10):
            _, done = await c.turn("keeper", "Hello")
        err = done["params"]["error"]
        assert done["method"] == "turn/failed" and err["code"] == "rate_limited" and err["retryable"] is True, done
        assert "slow down" in err["message"]
        await finish(p)

        q = await open_bridge(nursery, "--engine", "scripted", env={"OAM_OPENAI_URL": ""})
        info = {e["name"]: e for e in (await q.client.initialize())["engines"]}["openai"]
        assert info["available"] is False and "--openai-url" in info["reason"]
        await finish(q)
        nursery.cancel_scope.cancel()


async def test_arguments_the_server_did_not_constrain_are_warned_about() -> None:
    """A server that streams a call in pieces (as OpenAI does) whose arguments break the
    tool's schema: the pieces are put together, the agent gives the model the error, and
    the turn's warnings say the server did not constrain the call."""
    answers = [
        "".join(f"data: {json.dumps(x)}\n\n" for x in [
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "check_inventory", "arguments": ""}}]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"item": '}}]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"wine"}'}}]}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]) + "data: [DONE]\n\n",
        "".join(f"data: {json.dumps(x)}\n\n" for x in [
            {"choices": [{"index": 0, "delta": {"content": "No wine, "}}]},
            {"choices": [{"index": 0, "delta": {"content": "sorry."}, "finish_reason": "stop"}]},
        ]) + "data: [DONE]\n\n",
    ]
    bodies: list[dict[str, Any]] = []

    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += await stream.receive_some(65536)
        bodies.append(json.loads(rest))
        body = answers[len(bodies) - 1].encode()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        p = await bridge(nursery, f"http://127.0.0.1:{port}", "--openai-model", "stub")
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai", "instructions": "Be brief.", "tools": [INVENTORY_TOOL],
                                    "options": {"maxTokens": 20, "temperature": 0.5, "seed": 3, "topP": 0.9}})
        with trio.fail_after(10):
            _, done = await c.turn("keeper", "Any wine?", toolChoice="required")
        assert done["method"] == "turn/completed", done
        params = done["params"]
        assert params["text"] == "No wine, sorry." and params["toolCalls"][0]["error"].startswith("invalid arguments")
        assert any("did not constrain the arguments of 'check_inventory'" in w for w in params["warnings"]), params["warnings"]
        first, second = bodies
        assert first["tool_choice"] == {"type": "function", "function": {"name": "check_inventory"}}
        assert first["tools"][0]["function"]["parameters"] == INVENTORY_TOOL["parameters"]
        assert (first["model"], first["max_tokens"], first["temperature"], first["seed"], first["top_p"], first["stream"]) == ("stub", 20, 0.5, 3, 0.9, True)
        assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Any wine?"}]
        assert second["tool_choice"] == "auto"  # required applies to the first step only
        assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
        assert second["messages"][2]["tool_calls"][0]["function"] == {"name": "check_inventory", "arguments": '{"item": "wine"}'}
        await finish(p)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("server", ["silent", "cut"])
async def test_a_silent_or_cut_off_server_fails_the_turn_and_never_hangs(server: str) -> None:
    """``silent`` takes the request and never answers: the read timeout fails the step;
    ``cut`` streams one delta and closes the connection: the step fails, no hang."""

    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        # Read the whole body before closing: a close with unread input is a TCP reset, which
        # the client reports as a lost connection instead of the end of the stream.
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += await stream.receive_some(65536)
        if server == "silent":
            await trio.sleep_forever()
        event = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
        await stream.send_all(f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: {event}\n\n".encode())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        p = await bridge(nursery, f"http://127.0.0.1:{port}/v1", "--openai-model", "stub", "--openai-timeout", "0.5")
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai"})
        with trio.fail_after(10):
            _, done = await c.turn("keeper", "Hello")
        err = done["params"]["error"]
        assert done["method"] == "turn/failed" and err["code"] == "generation_failed" and err["retryable"] is True, done
        assert ("0.5 s" in err["message"]) if server == "silent" else ("ended the stream" in err["message"]), err
        assert (await c.call("npc/transcript", {"npcId": "keeper"}))["turns"] == []
        await finish(p)
        nursery.cancel_scope.cancel()
