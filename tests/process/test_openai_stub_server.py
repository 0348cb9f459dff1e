"""The openai engine through the real ``oam-bridge`` subprocess, against stub servers on
loopback that need no model: nothing listening, a 429, a call streamed in pieces whose
arguments break the schema, a server that goes silent or cuts the stream. Against a real
OpenAI-compatible server on the bundled model: tests/model/test_openai_engine.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio

from tests.support.harness import Proc, bridge, free_port

INVENTORY_TOOL = {
    "name": "check_inventory",
    "description": "Look up how many of an item the tavern has in stock.",
    "parameters": {
        "type": "object",
        "properties": {"item": {"type": "string", "enum": ["ale", "bread", "mead", "stew"]}},
        "required": ["item"],
    },
}


@asynccontextmanager
async def openai_bridge(url: str, *args: str) -> AsyncIterator[Proc]:
    """The bridge on the openai engine at ``url``, initialized; the engine must say it is available."""
    async with bridge("--engine", "openai", "--openai-url", url, *args) as p:
        init = await p.initialize()
        info = {e["name"]: e for e in init["engines"]}["openai"]
        assert info["available"] is True and info["reason"] is None, info
        yield p


async def test_an_unreachable_server_fails_the_turn_quickly() -> None:
    port = free_port()  # nothing listens there
    async with openai_bridge(f"http://127.0.0.1:{port}/v1") as p:
        c = p.client
        await c.call("npc/create", {"npcId": "keeper", "engine": "openai"})
        t0 = trio.current_time()
        with trio.fail_after(10):
            _, done = await c.turn("keeper", "Hello")
        assert trio.current_time() - t0 < 6
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "model_unavailable", done
        assert str(port) in done["params"]["error"]["message"]
        assert (await c.call("npc/transcript", {"npcId": "keeper"}))["turns"] == []
        await p.finish()


async def _stub(stream: trio.SocketStream, status: str, body: bytes, extra: str = "") -> None:
    """One HTTP/1.1 exchange: read the request (headers and a Content-Length body), answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    await stream.send_all(
        (
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
        ).encode()
        + body
    )
    await stream.aclose()


async def test_a_429_is_rate_limited_and_the_engine_is_unavailable_without_a_url() -> None:
    async def handler(stream: trio.SocketStream) -> None:
        await _stub(
            stream,
            "429 Too Many Requests",
            b'{"error":{"message":"slow down","type":"rate_limit"}}',
            "Retry-After: 1\r\n",
        )

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with openai_bridge(f"http://127.0.0.1:{port}/v1", "--openai-model", "stub") as p:
            c = p.client
            await c.call("npc/create", {"npcId": "keeper", "engine": "openai"})
            with trio.fail_after(10):
                _, done = await c.turn("keeper", "Hello")
            err = done["params"]["error"]
            assert done["method"] == "turn/failed" and err["code"] == "rate_limited" and err["retryable"] is True, done
            assert "slow down" in err["message"]
            await p.finish()

        async with bridge("--engine", "scripted", env={"OAM_OPENAI_URL": ""}) as q:
            info = {e["name"]: e for e in (await q.initialize())["engines"]}["openai"]
            assert info["available"] is False and "--openai-url" in info["reason"]
            await q.finish()
        nursery.cancel_scope.cancel()


async def test_arguments_the_server_did_not_constrain_are_warned_about() -> None:
    """A server that streams a call in pieces (as OpenAI does) whose arguments break the
    tool's schema: the pieces are put together, the agent gives the model the error, and
    the turn's warnings say the server did not constrain the call."""
    answers = [
        "".join(
            f"data: {json.dumps(x)}\n\n"
            for x in [
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "call_a",
                                        "type": "function",
                                        "function": {"name": "check_inventory", "arguments": ""},
                                    }
                                ]
                            },
                        }
                    ]
                },
                {
                    "choices": [
                        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"item": '}}]}}
                    ]
                },
                {
                    "choices": [
                        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"wine"}'}}]}}
                    ]
                },
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            ]
        )
        + "data: [DONE]\n\n",
        "".join(
            f"data: {json.dumps(x)}\n\n"
            for x in [
                {"choices": [{"index": 0, "delta": {"content": "No wine, "}}]},
                {"choices": [{"index": 0, "delta": {"content": "sorry."}, "finish_reason": "stop"}]},
            ]
        )
        + "data: [DONE]\n\n",
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
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % len(body)
            + body
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with openai_bridge(f"http://127.0.0.1:{port}", "--openai-model", "stub") as p:
            c = p.client
            await c.call(
                "npc/create",
                {
                    "npcId": "keeper",
                    "engine": "openai",
                    "instructions": "Be brief.",
                    "tools": [INVENTORY_TOOL],
                    "options": {"maxTokens": 20, "temperature": 0.5, "seed": 3, "topP": 0.9},
                },
            )
            with trio.fail_after(10):
                _, done = await c.turn("keeper", "Any wine?", toolChoice="required")
            assert done["method"] == "turn/completed", done
            params = done["params"]
            assert params["text"] == "No wine, sorry." and params["toolCalls"][0]["error"].startswith(
                "invalid arguments"
            )
            assert any("did not constrain the arguments of 'check_inventory'" in w for w in params["warnings"]), params[
                "warnings"
            ]
            first, second = bodies
            assert first["tool_choice"] == {"type": "function", "function": {"name": "check_inventory"}}
            assert first["tools"][0]["function"]["parameters"] == INVENTORY_TOOL["parameters"]
            assert (
                first["model"],
                first["max_tokens"],
                first["temperature"],
                first["seed"],
                first["top_p"],
                first["stream"],
            ) == ("stub", 20, 0.5, 3, 0.9, True)
            assert first["messages"] == [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Any wine?"},
            ]
            assert second["tool_choice"] == "auto"  # required applies to the first step only
            assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
            assert second["messages"][2]["tool_calls"][0]["function"] == {
                "name": "check_inventory",
                "arguments": '{"item": "wine"}',
            }
            await p.finish()
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
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            body += await stream.receive_some(65536)
        if server == "silent":
            await trio.sleep_forever()
        event = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
        await stream.send_all(
            f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: {event}\n\n".encode()
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with openai_bridge(
            f"http://127.0.0.1:{port}/v1", "--openai-model", "stub", "--openai-timeout", "0.5"
        ) as p:
            c = p.client
            await c.call("npc/create", {"npcId": "keeper", "engine": "openai"})
            with trio.fail_after(10):
                _, done = await c.turn("keeper", "Hello")
            err = done["params"]["error"]
            assert (
                done["method"] == "turn/failed" and err["code"] == "generation_failed" and err["retryable"] is True
            ), done
            assert ("0.5 s" in err["message"]) if server == "silent" else ("ended the stream" in err["message"]), err
            assert (await c.call("npc/transcript", {"npcId": "keeper"}))["turns"] == []
            await p.finish()
        nursery.cancel_scope.cancel()
