"""The openai engine through the real ``oam-bridge`` subprocess against OpenAI-compatible
servers on loopback that misbehave (issue 32, items 5-7): raw Unicode line separators inside
streamed JSON, events of the wrong shape, bodies and lines of hundreds of megabytes, streams
that never end. Whatever the server does, each turn ends in one terminal event with a
documented code, no traceback reaches stderr, memory stays bounded and the other NPCs keep
being served. The stand-in servers speak raw HTTP/1.1 over trio sockets (``StubServer``), so
a test can send exactly the bytes it means, in the pieces it means.

Every test here failed on commit a76effb, before the fix (``OAM_BRIDGE_ROOT=<a tree of that
commit>`` runs this file's bridges from it, tests/support/harness.py), except the cases that
pin what already held: ``finishReason`` ``stop``, ``length``, ``tool_calls`` with no call and
none at ``[DONE]``, and a ``/models`` answer whose first id is not a string or that is not UTF-8. Time limits are hang
guards. The random pass over the same servers is tests/process/test_openai_attack.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import trio

from tests.support.harness import DEADLINE, Proc, _leaves, bridge
from tests.support.procfs import rss_kib

MIB = 1 << 20


# ---- the stand-in server ----


@dataclass
class Request:
    method: str
    path: str
    body: Any  # the JSON body, None without one

    @property
    def prompt(self) -> str:
        """The last user message of a chat request ("" for another request)."""
        if not isinstance(self.body, dict):
            return ""
        users = [m.get("content") for m in self.body.get("messages", []) if m.get("role") == "user"]
        return users[-1] if users and isinstance(users[-1], str) else ""


Reply = Callable[[trio.SocketStream, Request], Awaitable[None]]


async def read_request(stream: trio.SocketStream) -> Request | None:
    """One HTTP/1.1 request, its body read whole (closing with unread input would be a TCP
    reset, which the client reports as a lost connection, not as what the test sent)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = await stream.receive_some(65536)
        if not piece:
            return None
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, path, _ = lines[0].decode("latin-1").split(" ", 2)
    length = next((int(h.split(b":", 1)[1]) for h in lines[1:] if h.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        piece = await stream.receive_some(65536)
        if not piece:
            return None
        rest += piece
    return Request(method, path, json.loads(rest) if rest else None)


class StubServer:
    """A loopback HTTP server whose answer to each request is ``route(request)``, a coroutine
    that writes whatever bytes it likes; the connection is closed after it. ``hung_up``
    counts the replies the bridge cut short by closing its end."""

    def __init__(self, route: Callable[[Request], Reply]) -> None:
        self.route = route
        self.requests: list[Request] = []
        self.hung_up = 0
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            req = await read_request(stream)
            if req is None:
                return
            self.requests.append(req)
            await self.route(req)(stream, req)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.hung_up += 1  # the bridge closed the connection: what a bound does
        finally:
            await stream.aclose()


@asynccontextmanager
async def serving(route: Callable[[Request], Reply]) -> AsyncIterator[StubServer]:
    """A ``StubServer`` listening on loopback for the block. A single failure inside is
    raised as itself, not wrapped in the nursery's exception group."""
    server = StubServer(route)
    try:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
            server.port = listeners[0].socket.getsockname()[1]
            yield server
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def head(status: str = "200 OK", content_type: str = "text/event-stream", extra: str = "") -> bytes:
    """A response head whose body the close of the connection ends."""
    return f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}Connection: close\r\n\r\n".encode()


def event(content: str | None = None, finish: Any = None, **more: Any) -> dict[str, Any]:
    """A chat.completion.chunk with choice 0's delta ``content`` and ``finish_reason``."""
    delta = {"content": content} if content is not None else {}
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **more,
    }


def sse(*events: Any, eol: str = "\n", done: bool = True) -> bytes:
    """Each event as ``data: JSON`` (raw Unicode, not escaped: as many servers send it) and a
    blank line, with ``eol`` ending every line; a string event goes out as it is."""
    out = "".join(f"data: {e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)}{eol}{eol}" for e in events)
    return (out + (f"data: [DONE]{eol}{eol}" if done else "")).encode()


def send(*pieces: bytes, pause: float = 0.0) -> Reply:
    """A reply that writes ``pieces`` one write each, ``pause`` seconds apart."""

    async def reply(stream: trio.SocketStream, req: Request) -> None:
        for i, piece in enumerate(pieces):
            if i and pause:
                await trio.sleep(pause)
            await stream.send_all(piece)

    return reply


def text_reply(text: str = "Aye.") -> Reply:
    return send(head(), sse(event(text), event(finish="stop")))


@asynccontextmanager
async def openai_bridge(url: str, *args: str, guard: float | None = DEADLINE) -> AsyncIterator[Proc]:
    """The bridge on the openai engine at ``url``, initialized, with an NPC ``keeper`` on it
    and an NPC ``guard`` on the scripted engine (which must keep answering). ``guard``: the
    block's hang guard in seconds."""
    async with bridge("--engine", "openai", "--openai-url", url, *args, guard=guard) as p:
        init = await p.initialize()
        assert {e["name"]: e for e in init["engines"]}["openai"]["available"] is True
        await p.call("npc/create", {"npcId": "keeper", "engine": "openai"})
        await p.call("npc/create", {"npcId": "guard", "engine": "scripted"})
        yield p


def no_traceback(p: Proc) -> None:
    log = bytes(p.stderr).decode("utf-8", "replace")
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


def failed(done: dict[str, Any], code: str = "generation_failed") -> dict[str, Any]:
    """The terminal event's error, which must be ``code``."""
    assert done["method"] == "turn/failed", done
    err: dict[str, Any] = done["params"]["error"]
    assert err["code"] == code, err
    return err


async def guard_answers(p: Proc, within: float = 5.0) -> None:
    """The scripted NPC completes a turn within ``within`` s: the process serves other NPCs."""
    with trio.fail_after(within):
        _, done = await p.turn("guard", "Halt?")
    assert done["method"] == "turn/completed", done


async def hangs_up(server: StubServer, within: float = 3.0) -> None:
    """The bridge closed the connection the server was still writing to."""
    with trio.move_on_after(within):
        while not server.hung_up:
            await trio.sleep(0.02)
    assert server.hung_up == 1, "the bridge did not close the connection"


# ---- item 5: SSE lines end only at CR, LF or CRLF ----


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
async def test_unicode_line_breaks_inside_an_event_are_text_not_line_ends(eol: str) -> None:
    """U+2028, U+2029 and U+0085 are valid raw inside a JSON string, and many servers send
    them unescaped; the SSE reader used ``str.splitlines``, which splits on them, and the turn
    failed "malformed stream event". Each event is also split across writes, a CRLF between
    its CR and its LF, so line ends are found across reads."""
    pieces = ["Roses\u2028", "are red,\u2029", "violets\x85", "blue\u2028\u2029\x85."]
    body = sse(*[event(x) for x in pieces], event(finish="stop"), eol=eol)
    cut = [i + 1 for i in range(len(body)) if body[i : i + 1] in (b"\r", b"\xe2", b"\xc2")]
    writes = [body[a:b] for a, b in zip([0, *cut], [*cut, len(body)], strict=True)]
    async with serving(lambda req: send(head(), *writes, pause=0.002)) as server:
        async with openai_bridge(server.url, "--openai-model", "stub") as p:
            with trio.fail_after(15):
                _, done = await p.turn("keeper", "A poem?")
            assert done["method"] == "turn/completed", done
            assert done["params"]["text"] == "".join(pieces) and done["params"]["finishReason"] == "stop"
            # the bridge's own output escapes them (protocol.md, framing)
            raw = b"".join(line for line in p.lines if b"turn/completed" in line)
            assert b"\\u2028" in raw and "\u2028".encode() not in raw
            no_traceback(p)
            await p.finish()


# ---- item 6: events of the wrong shape ----

# (the bad event, what the error message must name)
BAD_EVENTS: dict[str, tuple[str, str]] = {
    "delta_a_string": ('{"choices":[{"index":0,"delta":"text"}]}', "choices[0].delta"),
    "choices_a_number": ('{"choices":5}', "choices"),
    "delta_a_list": ('{"choices":[{"delta":[1]}]}', "choices[0].delta"),
    "tool_calls_a_number": ('{"choices":[{"delta":{"tool_calls":5}}]}', "choices[0].delta.tool_calls"),
    "call_name_a_number": (
        '{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":5}}]}}]}',
        "choices[0].delta.tool_calls[0].function.name",
    ),
    "choice_null": ('{"choices":[null]}', "choices[0]"),
    "prompt_tokens_a_word": ('{"choices":[],"usage":{"prompt_tokens":"many","completion_tokens":1}}', "prompt_tokens"),
    "prompt_tokens_out_of_range": (
        '{"choices":[],"usage":{"prompt_tokens":1e400,"completion_tokens":1}}',
        "prompt_tokens",
    ),
    "prompt_tokens_negative": ('{"choices":[],"usage":{"prompt_tokens":-3,"completion_tokens":1}}', "prompt_tokens"),
    "finish_reason_an_object": (
        '{"choices":[{"index":0,"delta":{},"finish_reason":{"a":1}}]}',
        "choices[0].finish_reason",
    ),
    "an_array": ("[1, 2]", "object"),
    "nested_too_deep": ('{"choices":[],"x":' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
    "not_json": ('{"choices":[', "not JSON"),
}


async def test_events_of_the_wrong_shape_fail_the_step_generation_failed() -> None:
    """Each bad event after a good one: ``generation_failed`` (retryable) naming what was
    wrong, never ``internal_error`` with a traceback; the NPC and the process go on."""

    def route(req: Request) -> Reply:
        if req.prompt in BAD_EVENTS:
            return send(head(), sse(event("Hel"), BAD_EVENTS[req.prompt][0], event("lo", "stop")))
        return text_reply()

    async with serving(route) as server:
        async with openai_bridge(server.url, "--openai-model", "stub") as p:
            wrong: dict[str, Any] = {}
            for name, (_, names) in BAD_EVENTS.items():
                with trio.fail_after(10):
                    _, done = await p.turn("keeper", name)
                err = done["params"].get("error") or {}
                if not (
                    err.get("code") == "generation_failed"
                    and err.get("retryable") is True
                    and err["message"].startswith("malformed_event: ")
                    and names in err["message"]
                ):
                    wrong[name] = done["params"]
            assert wrong == {}, json.dumps(wrong, indent=1)[:4000]
            with trio.fail_after(10):
                _, done = await p.turn("keeper", "Hello")
            assert done["method"] == "turn/completed" and done["params"]["text"] == "Aye."
            assert (await p.call("npc/transcript", {"npcId": "keeper"}))["turns"][0][0]["content"] == "Hello"
            no_traceback(p)
            await p.finish()


@pytest.mark.parametrize(
    ("sent", "wire"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("eos", "stop"),
        ("end_turn", "stop"),
        ("tool_calls", "stop"),
        (None, "stop"),
    ],
)
async def test_finish_reason_on_the_wire_is_always_one_of_the_documented_strings(sent: Any, wire: str) -> None:
    """A server's own finish reasons (``eos``, ``end_turn``) are ``stop``; a missing one at
    ``[DONE]`` is ``stop``; ``length`` stays."""
    async with serving(lambda req: send(head(), sse(event("Aye."), event(finish=sent)))) as server:
        async with openai_bridge(server.url, "--openai-model", "stub") as p:
            with trio.fail_after(10):
                _, done = await p.turn("keeper", "Hello")
            assert done["method"] == "turn/completed", done
            assert done["params"]["finishReason"] == wire
            no_traceback(p)
            await p.finish()


async def test_calls_on_a_step_that_offered_no_tools_end_it_with_stop() -> None:
    """``toolChoice`` ``none``: the engine sends no tools, a server calls one anyway; the agent
    ignores the call (a warning) and the text is the answer, so the turn's ``finishReason`` is
    ``stop``, not the server's ``tool_calls``."""
    call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "check_inventory", "arguments": "{}"}}
    events = [
        event("Three barrels."),
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": "tool_calls"}]},
    ]
    async with serving(lambda req: send(head(), sse(*events))) as server:
        async with openai_bridge(server.url, "--openai-model", "stub") as p:
            tool = {"name": "check_inventory", "description": "Stock.", "parameters": {"type": "object"}}
            await p.call("npc/create", {"npcId": "tooled", "engine": "openai", "tools": [tool]})
            with trio.fail_after(10):
                _, done = await p.turn("tooled", "Any ale?", toolChoice="none")
            assert done["method"] == "turn/completed", done
            assert done["params"]["text"] == "Three barrels." and done["params"]["finishReason"] == "stop"
            assert any("disallowed" in w for w in done["params"]["warnings"]), done["params"]["warnings"]
            await p.finish()


@pytest.mark.parametrize(
    "models",
    [b"[1, 2]", b'{"data": 5}', b'{"data": [{"id": 5}]}', b'{"data": [' * 50_000, b"\xff\xfe"],
    ids=["array", "data_a_number", "id_a_number", "deep", "not_utf8"],
)
async def test_a_models_list_of_the_wrong_shape_names_no_model(models: bytes) -> None:
    """Without ``--openai-model`` the engine asks ``GET /models`` once; an answer of the
    wrong shape means "name no model", not ``internal_error``."""

    def route(req: Request) -> Reply:
        if req.method == "GET":
            return send(head(content_type="application/json"), models)
        return text_reply()

    async with serving(route) as server:
        async with openai_bridge(server.url) as p:
            with trio.fail_after(10):
                _, done = await p.turn("keeper", "Hello")
            assert done["method"] == "turn/completed", done
            assert [r.method for r in server.requests] == ["GET", "POST"] and "model" not in server.requests[1].body
            no_traceback(p)
            await p.finish()


# ---- item 7: bounds ----


class PeakRss:
    """The bridge's resident memory: at the start, and its peak while ``watch`` runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self.peak = self.last = rss_kib(pid)

    async def watch(self) -> None:
        while True:
            self.last = rss_kib(self.pid)
            self.peak = max(self.peak, self.last)
            await trio.sleep(0.005)

    def __str__(self) -> str:
        return f"RSS {self.start / 1024:.0f} MiB -> peak {self.peak / 1024:.0f} MiB, {self.last / 1024:.0f} MiB after"

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / 1024


def flood(first: bytes, total: int, piece: bytes = b"x" * MIB) -> Reply:
    """``first``, then ``total`` bytes of ``piece`` repeated (the server's memory stays flat)."""

    async def reply(stream: trio.SocketStream, req: Request) -> None:
        await stream.send_all(first)
        for _ in range(total // len(piece)):
            await stream.send_all(piece)

    return reply


BIG = 200 * MIB
FLOODS: dict[str, tuple[bytes, str]] = {
    # a 500 whose body is 200 MB: read to 64 KiB, the rest left unread (the connection closed)
    "error_body": (
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % BIG,
        "HTTP 500",
    ),
    # a 200 whose one data: line is 200 MB, no newline: failed at the line bound
    "data_line": (head() + b"data: ", "stream_line_too_long: "),
    # a 200 whose one line is 200 MB of what is not an event at all
    "other_line": (head() + b": ", "stream_line_too_long: "),
}


@pytest.mark.parametrize("kind", list(FLOODS))
async def test_a_200_mb_body_or_line_is_read_to_its_bound_and_memory_stays_flat(kind: str) -> None:
    first, says = FLOODS[kind]

    def route(req: Request) -> Reply:
        return flood(first, BIG) if req.prompt == "flood" else text_reply()

    async with serving(route) as server:
        async with openai_bridge(server.url, "--openai-model", "stub") as p:
            with trio.fail_after(10):
                _, done = await p.turn("keeper", "warm up")  # httpx and the engine loaded
            assert done["method"] == "turn/completed", done
            rss = PeakRss(p.pid)
            async with trio.open_nursery() as watching:
                watching.start_soon(rss.watch)
                t0 = trio.current_time()
                with trio.fail_after(30):
                    tid = (await p.call("npc/respond", {"npcId": "keeper", "prompt": "flood"}))["turnId"]
                    await guard_answers(p)  # served while the flood arrives
                    done = await p.wait_terminal(tid)
                took = trio.current_time() - t0
                await trio.sleep(0.2)
                watching.cancel_scope.cancel()
            print(f"{kind}: {took:.2f} s, {rss}")
            err = failed(done)
            assert says in err["message"] and err["retryable"] is True, err
            assert rss.growth_mib < 40, f"RSS grew {rss.growth_mib:.0f} MiB reading a {BIG // MIB} MiB flood"
            await hangs_up(server)  # the bridge closed the connection instead of reading the flood
            with trio.fail_after(10):
                _, done = await p.turn("keeper", "after")
            assert done["method"] == "turn/completed", done
            no_traceback(p)
            await p.finish()


async def test_a_200_mb_models_list_is_not_read_whole() -> None:
    """``GET /models`` (no ``--openai-model``) is read to its bound too: over it the step
    fails ``model_unavailable`` and says to name the model."""

    def route(req: Request) -> Reply:
        if req.method == "GET":
            return flood(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % BIG, BIG)
        return text_reply()

    async with serving(route) as server:
        async with openai_bridge(server.url) as p:
            rss = PeakRss(p.pid)
            async with trio.open_nursery() as watching:
                watching.start_soon(rss.watch)
                with trio.fail_after(30):
                    _, done = await p.turn("keeper", "Hello")
                await trio.sleep(0.2)
                watching.cancel_scope.cancel()
            print(f"models: {rss}")
            err = failed(done, "model_unavailable")
            assert "--openai-model" in err["message"], err
            assert rss.growth_mib < 40, f"RSS grew {rss.growth_mib:.0f} MiB reading a {BIG // MIB} MiB /models"
            no_traceback(p)
            await p.finish()


def forever(first: bytes, piece: bytes, every: float) -> Reply:
    """``first``, then ``piece`` every ``every`` seconds until the bridge hangs up."""

    async def reply(stream: trio.SocketStream, req: Request) -> None:
        await stream.send_all(first)
        while True:
            await stream.send_all(piece)
            await trio.sleep(every)

    return reply


@pytest.mark.parametrize("kind", ["pings", "empty_events", "slow_text"])
async def test_a_stream_that_never_ends_fails_at_the_step_deadline(kind: str) -> None:
    """``: ping`` comments, events that say nothing, or a trickle of text keep the read
    timeout from firing; ``--openai-step-timeout`` ends the step anyway."""
    piece = {
        "pings": b": ping\n\n",
        "empty_events": sse(event(), done=False),
        "slow_text": sse(event("la "), done=False),
    }[kind]

    def route(req: Request) -> Reply:
        return forever(head(), piece, 0.05) if req.prompt == "forever" else text_reply()

    async with serving(route) as server:
        async with openai_bridge(server.url, "--openai-model", "stub", "--openai-step-timeout", "2") as p:
            t0 = trio.current_time()
            with trio.fail_after(15):
                tid = (await p.call("npc/respond", {"npcId": "keeper", "prompt": "forever"}))["turnId"]
                await guard_answers(p)
                done = await p.wait_terminal(tid)
            took = trio.current_time() - t0
            err = failed(done)
            assert err["message"].startswith("step_timeout: ") and "--openai-step-timeout" in err["message"], err
            assert 1.9 < took < 6, took
            await hangs_up(server)
            with trio.fail_after(10):
                _, done = await p.turn("keeper", "after")
            assert done["method"] == "turn/completed", done
            no_traceback(p)
            await p.finish()


async def test_a_step_deadline_of_0_means_none() -> None:
    async with serving(
        lambda req: send(head(), b": ping\n\n", sse(event("Aye."), event(finish="stop")), pause=0.3)
    ) as s:
        async with openai_bridge(s.url, "--openai-model", "stub", "--openai-step-timeout", "0") as p:
            with trio.fail_after(10):
                _, done = await p.turn("keeper", "Hello")
            assert done["method"] == "turn/completed", done
            await p.finish()


def call_event(arguments: str, index: int = 0, name: str | None = "check_inventory") -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        fn["name"] = name
    call = {"index": index, "id": f"call_{index}", "type": "function", "function": fn}
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}


OUTPUT_FLOODS: dict[str, tuple[Any, bytes]] = {
    # maxTokens 10: at most 10 x 32 characters, sent as fast as the server can
    "text_past_max_tokens": (10, sse(event("lalala "), done=False)),
    # no maxTokens: at most 1 MiB characters
    "text_without_max_tokens": (None, sse(event("la" * 32768), done=False)),
    # a call whose arguments never end
    "call_arguments": (None, sse(call_event('"ale' + "e" * 32768), done=False)),
    # calls without end, each a new index
    "many_calls": (None, b""),
}


@pytest.mark.parametrize("kind", list(OUTPUT_FLOODS))
async def test_output_past_the_cap_fails_the_step(kind: str) -> None:
    max_tokens, piece = OUTPUT_FLOODS[kind]

    def route(req: Request) -> Reply:
        if req.prompt != "flood":
            return text_reply()
        if kind == "many_calls":

            async def calls(stream: trio.SocketStream, req: Request) -> None:
                await stream.send_all(head())
                for i in range(100_000):
                    await stream.send_all(sse(call_event('{"item":"ale"}', index=i), done=False))

            return calls
        return forever(head(), piece, 0)

    async with serving(route) as server:
        async with openai_bridge(server.url, "--openai-model", "stub") as p:
            options = {"maxTokens": max_tokens} if max_tokens else {}
            tool = {
                "name": "check_inventory",
                "description": "How many of an item the tavern has.",
                "parameters": {"type": "object", "properties": {"item": {"type": "string"}}},
            }
            await p.call("npc/create", {"npcId": "flooded", "engine": "openai", "options": options, "tools": [tool]})
            with trio.fail_after(20):
                tid = (await p.call("npc/respond", {"npcId": "flooded", "prompt": "flood"}))["turnId"]
                await guard_answers(p)
                done = await p.wait_terminal(tid)
            err = failed(done)
            assert err["message"].startswith("output_too_long: "), err
            await hangs_up(server)
            no_traceback(p)
            await p.finish()
