"""An attack pass on the openai engine through the real ``oam-bridge`` subprocess: a server on
loopback that hypothesis drives to misbehave (events of random shapes, random line breaks and
read boundaries, truncated streams, wrong framing and encodings, random status codes and
bodies), several NPCs' turns at once on it. Every turn must end in exactly one terminal event,
the last of its gap-free events, with a documented error code other than ``internal_error``
(or ``turn/completed`` with a documented ``finishReason``); stderr never shows a traceback,
and the process keeps serving.

One bridge serves every example: hypothesis runs in a worker thread and hands each example to
the trio side. ``OAM_OPENAI_ATTACK_EXAMPLES`` sets how many (default 150); the test prints how
many cases and turns ran, and the codes they ended with."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.errors import ERROR_CODES
from tests.process.test_openai_hostile_server import Reply, Request, StubServer, openai_bridge, serving
from tests.support.harness import DOOR_TOOL, INVENTORY_TOOL, TERMINAL, Proc, rpc

EXAMPLES = int(os.environ.get("OAM_OPENAI_ATTACK_EXAMPLES", "150"))
FINISH_REASONS = {"stop", "length"}  # tool_calls only ends a step that leads to a tool round

# ---- what the server sends ----

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()  # inf and nan too: json.dumps writes Infinity and NaN, which are not JSON
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# text rich in line breaks of every kind, raw in the JSON when ensure_ascii is off
TEXT = st.text(
    st.sampled_from(["a", "b", " ", ".", "é", "\u2028", "\u2029", "\x85", "\r", "\n", "\x00", "{", '"', "😀"]),
    max_size=12,
)


def events(fuzz: bool) -> st.SearchStrategy[dict[str, Any]]:
    """chat.completion.chunk events; with ``fuzz`` each field is, 1 time in 10, any JSON
    value at all, and an event may be a server's error report."""

    def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(*[valid] * 9, JSON) if fuzz else valid

    def some_keys(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries({}, optional={k: maybe(v) for k, v in fields.items()})

    call_piece = some_keys(
        index=st.integers(min_value=0, max_value=3),
        id=st.sampled_from(["call_a", "call_b", ""]),
        type=st.just("function"),
        function=some_keys(
            name=st.sampled_from(["check_inventory", "open_door", "nope"]),
            arguments=st.sampled_from(['{"item":"ale"}', '{"door":', '"north"}', "{}", "not json", '{"item":"'])
            | st.dictionaries(st.sampled_from(["item", "door"]), st.text(max_size=5), max_size=2),
        ),
    )
    choice = some_keys(
        index=st.sampled_from([0, 0, 0, 1]),
        delta=some_keys(
            content=TEXT | st.none(), role=st.just("assistant"), tool_calls=st.lists(call_piece, max_size=2)
        ),
        finish_reason=st.sampled_from([None, "stop", "length", "tool_calls", "content_filter", "eos", "function_call"]),
    )
    usage = some_keys(
        prompt_tokens=st.integers(min_value=-2 if fuzz else 0, max_value=10**20 if fuzz else 10**6),
        completion_tokens=st.integers(min_value=0, max_value=100),
        prompt_tokens_details=some_keys(cached_tokens=st.integers(min_value=0, max_value=5)),
    )
    optional: dict[str, st.SearchStrategy[Any]] = {"usage": maybe(usage)}
    if fuzz:
        optional["error"] = some_keys(message=TEXT, code=st.sampled_from([400, 429, 503, 500]))
    return st.fixed_dictionaries({"choices": maybe(st.lists(choice, max_size=2))}, optional=optional)


EVENTS = {fuzz: events(fuzz) for fuzz in (False, True)}


@st.composite
def event_line(draw: st.DrawFn, fuzz: bool) -> bytes:
    kinds = ["event"] * 6 + ["done", "comment", "blank", "field"] + (["garbage", "bytes"] if fuzz else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "event":
        text = json.dumps(draw(EVENTS[fuzz]), ensure_ascii=draw(st.booleans()))
        return f"data:{draw(st.sampled_from([' ', '', '  ']))}{text}".encode()
    if kind == "done":
        return b"data: [DONE]"
    if kind == "comment":
        return b": ping"
    if kind == "blank":
        return b""
    if kind == "field":
        return draw(st.sampled_from([b"event: message", b"id: 7", b"retry: 10", b"data", b"data:"]))
    if kind == "garbage":
        return ("data: " + draw(TEXT)).encode()
    return draw(st.binary(max_size=20))


@st.composite
def call_lines(draw: st.DrawFn) -> list[bytes]:
    """A batch of one or two calls streamed in pieces as OpenAI does (id and name first, the
    arguments in pieces), then ``finish_reason`` ``tool_calls``."""
    out: list[bytes] = []
    for index in range(draw(st.integers(min_value=1, max_value=2))):
        name, args = draw(st.sampled_from([("check_inventory", '{"item": "ale"}'), ("open_door", '{"door": "north"}')]))
        cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=len(args) - 1), max_size=2)))
        parts = [args[a:b] for a, b in zip([0, *cuts], [*cuts, len(args)], strict=True)]
        first = {"index": index, "id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": ""}}
        pieces = [first] + [{"index": index, "function": {"arguments": part}} for part in parts]
        out += [json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [p]}}]}).encode() for p in pieces]
    out.append(b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}')
    return [b"data: " + line for line in out] + [b"data: [DONE]"]


@st.composite
def sse_body(draw: st.DrawFn, fuzz: bool) -> bytes:
    lines = draw(st.lists(event_line(fuzz), max_size=10))
    if draw(st.integers(min_value=0, max_value=2)) == 0:
        lines += draw(call_lines())
    elif draw(st.integers(min_value=0, max_value=3)):  # most streams end as they should
        lines += [
            b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}',
            b"",
            b"data: [DONE]",
        ]
    ends = draw(st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b"\r\n\r\n"]), min_size=len(lines)))
    return b"".join(line + end for line, end in zip(lines, ends, strict=False))


ERROR_BODY = st.one_of(
    st.builds(
        lambda msg: json.dumps({"error": {"message": msg, "type": "x"}}).encode(),
        st.sampled_from(["slow down", "context length exceeded", "response_format is not supported", "no"]),
    ),
    st.binary(max_size=64),
    st.builds(lambda n, b: b * n, st.integers(min_value=0, max_value=200_000), st.sampled_from([b"x", b"\xff", b"\n"])),
)
STATUS = st.sampled_from([200] * 24 + [100, 101, 204, 302, 304, 400, 401, 403, 404, 413, 418, 422, 429, 500, 502, 503])


@dataclass
class Plan:
    """One response: the bytes, the writes they go in, and whether the body is cut short."""

    status: int
    body: bytes
    content_type: str
    framing: str
    encoding: str
    cuts: list[int]
    truncate_at: int | None

    def wire(self) -> list[bytes]:
        body = self.body
        if self.encoding == "gzip":
            body = gzip.compress(body)
        elif self.encoding == "deflate":
            body = zlib.compress(body)
        if self.truncate_at is not None:
            body = body[: self.truncate_at]
        head = [f"HTTP/1.1 {self.status} Whatever", f"Content-Type: {self.content_type}"]
        if self.encoding not in ("identity", ""):
            head.append(f"Content-Encoding: {self.encoding.removesuffix('-lie')}")
        if self.framing == "length":
            head.append(f"Content-Length: {len(body)}")
        elif self.framing == "length_wrong":
            head.append(f"Content-Length: {len(body) * 2 + 1}")
        elif self.framing.startswith("chunked"):
            head.append("Transfer-Encoding: chunked")
            step = max(1, len(body) // 3)
            parts = [body[i : i + step] for i in range(0, len(body), step)]
            body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
            body += b"0\r\n\r\n" if self.framing == "chunked" else b"zz\r\n"
        head.append("Connection: close")
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        points = sorted({min(c, len(data)) for c in self.cuts})
        return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if b > a]


@st.composite
def plan(draw: st.DrawFn) -> Plan:
    """Half the responses are well-formed streams of valid events (random line ends, read
    boundaries, framing); the other half may be anything."""
    if not draw(st.booleans()):
        body = draw(sse_body(False))
        return Plan(
            status=200,
            body=body,
            content_type="text/event-stream",
            framing=draw(st.sampled_from(["close", "length", "chunked"])),
            encoding=draw(st.sampled_from(["identity", "identity", "gzip"])),
            cuts=draw(st.lists(st.integers(min_value=0, max_value=len(body) + 200), max_size=6)),
            truncate_at=None,
        )
    status = draw(STATUS)
    body = draw(sse_body(True)) if status == 200 else draw(ERROR_BODY)
    return Plan(
        status=status,
        body=body,
        content_type=draw(st.sampled_from(["text/event-stream", "application/json", "text/plain"])),
        framing=draw(
            st.sampled_from(["close"] * 4 + ["length"] * 2 + ["length_wrong"] + ["chunked"] * 2 + ["chunked_bad"])
        ),
        encoding=draw(st.sampled_from(["identity"] * 12 + ["gzip", "gzip", "deflate", "br", "gzip-lie"])),
        cuts=draw(st.lists(st.integers(min_value=0, max_value=len(body) + 200), max_size=6)),
        truncate_at=draw(st.one_of(*[st.none()] * 5, st.integers(min_value=0, max_value=len(body) + 10))),
    )


@dataclass
class NpcCase:
    """One NPC's turn: how it is set up and asked, and the server's answers to its steps
    (after them, a plain answer)."""

    max_tokens: int | None
    tools: bool
    tool_choice: Any
    schema: bool
    plans: list[Plan]


NPC_CASE = st.builds(
    NpcCase,
    max_tokens=st.none() | st.integers(min_value=1, max_value=64),
    tools=st.booleans(),
    tool_choice=st.sampled_from(["auto", "required", "none", {"tool": "check_inventory"}]),
    schema=st.integers(min_value=0, max_value=5).map(lambda n: n == 0),
    plans=st.lists(plan(), min_size=1, max_size=3),
)
CASE = st.lists(NPC_CASE, min_size=1, max_size=3)  # NPCs whose turns run at once


# ---- running them ----

GOOD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"Aye."},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)


@dataclass
class Attack:
    proc: Proc
    server: StubServer
    plans: dict[str, list[Plan]] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    cases: int = 0
    turns: int = 0
    requests: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    sending: trio.Lock = field(default_factory=trio.Lock)  # one writer on the bridge's stdin at a time

    async def call_raw(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A request from one of several concurrent tasks; its response."""
        id_ = f"attack{next(self.ids)}"
        async with self.sending:
            await self.proc.send(rpc(id_, method, params))
        return await self.proc.response(id_)

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        resp = await self.call_raw(method, params)
        assert "result" in resp, resp
        return resp["result"]

    def route(self, req: Request) -> Reply:
        left = self.plans.get(req.prompt)
        pieces = left.pop(0).wire() if left else [GOOD]
        self.requests += 1

        async def reply(stream: trio.SocketStream, req: Request) -> None:
            for piece in pieces:
                await stream.send_all(piece)
                await trio.sleep(0)

        return reply

    async def run_case(self, case: list[NpcCase]) -> list[str]:
        """Every NPC's turn at once; what was wrong (nothing: [])."""
        self.cases += 1
        problems: list[str] = []
        stderr_from = len(self.proc.stderr)
        async with trio.open_nursery() as nursery:
            for npc in case:
                nursery.start_soon(self.run_turn, npc, problems)
        log = bytes(self.proc.stderr[stderr_from:]).decode("utf-8", "replace")
        if "Traceback" in log or "internal error" in log:
            problems.append(f"stderr: {log[-3000:]}")
        return problems

    async def run_turn(self, npc: NpcCase, problems: list[str]) -> None:
        p = self.proc
        k = next(self.ids)
        npc_id, prompt = f"npc{k}", f"case {k}"
        self.plans[prompt] = list(npc.plans)
        config: dict[str, Any] = {"npcId": npc_id, "engine": "openai", "instructions": "Be brief."}
        if npc.max_tokens is not None:
            config["options"] = {"maxTokens": npc.max_tokens}
        if npc.tools:
            config["tools"] = [INVENTORY_TOOL, DOOR_TOOL]
        await self.call("npc/create", config)
        params: dict[str, Any] = {"npcId": npc_id, "prompt": prompt}
        if npc.tools:
            params["toolChoice"] = npc.tool_choice
        if npc.schema:
            params["schema"] = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        self.turns += 1
        tid = (await self.call("npc/respond", params))["turnId"]
        with trio.move_on_after(20) as waited:
            answered: set[int] = set()  # by seq: a server that numbers its calls call_0, ... each step repeats ids
            while True:
                n = len(p.turn_events(tid))
                for e in p.turn_events(tid):
                    if e["method"] == "turn/toolCallRequested" and e["params"]["seq"] not in answered:
                        answered.add(e["params"]["seq"])
                        call_id = e["params"]["callId"]
                        resp = await self.call_raw("npc/submit", {"npcId": npc_id, "callId": call_id, "output": 3})
                        if "error" in resp and resp["error"]["data"]["code"] != "unknown_tool_call":
                            problems.append(f"{npc_id}: submit refused: {resp}")
                if any(e["method"] in TERMINAL for e in p.turn_events(tid)):
                    break
                await p.until(f"the next event of {tid}", lambda n=n: len(p.turn_events(tid)) > n or None)
        self.plans.pop(prompt, None)
        if waited.cancelled_caught:
            problems.append(f"{npc_id}: no terminal event within 20 s: {[e['method'] for e in p.turn_events(tid)]}")
            return
        evs = p.turn_events(tid)
        seqs = [e["params"]["seq"] for e in evs]
        terminal = [e for e in evs if e["method"] in TERMINAL]
        if seqs != list(range(len(evs))) or len(terminal) != 1 or evs[-1] is not terminal[0]:
            problems.append(f"{npc_id}: not one terminal event last, seqs gap-free: {[e['method'] for e in evs]}")
            return
        done = terminal[0]["params"]
        if terminal[0]["method"] == "turn/failed":
            code = done["error"]["code"]
            reason = str(done["error"]["message"]).split(":", 1)[0]
            self.outcomes[f"{code} ({reason})" if re.fullmatch(r"[a-z_]+", reason) else code] += 1
            if code not in ERROR_CODES or code == "internal_error" or not isinstance(done["error"]["message"], str):
                problems.append(f"{npc_id}: {done['error']}")
        else:
            self.outcomes[f"completed ({done['finishReason']})"] += 1
            if done["finishReason"] not in FINISH_REASONS or not isinstance(done["text"], str):
                problems.append(f"{npc_id}: finishReason {done['finishReason']!r}")


async def test_a_server_that_misbehaves_at_random_never_breaks_a_turn() -> None:
    attack: Attack | None = None

    def route(req: Request) -> Reply:
        assert attack is not None
        return attack.route(req)

    async with serving(route) as server:
        async with openai_bridge(
            server.url, "--openai-model", "stub", "--openai-timeout", "3", "--openai-step-timeout", "6", guard=None
        ) as p:
            attack = Attack(p, server)
            p.keep_raw = False

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=CASE)
            def check(case: list[NpcCase]) -> None:
                assert attack is not None
                problems = trio.from_thread.run(attack.run_case, case)
                assert problems == [], "\n".join(problems)

            await trio.to_thread.run_sync(check)
            print(
                f"\nattack: {attack.cases} cases, {attack.turns} turns, {attack.requests} requests; "
                f"outcomes: {dict(attack.outcomes.most_common())}"
            )
            assert attack.cases >= EXAMPLES
            # still serving, and it ends as a game ends it
            _, done = await p.turn("keeper", "Hello")
            assert done["method"] == "turn/completed" and done["params"]["text"] == "Aye.", done
            log = bytes(p.stderr).decode("utf-8", "replace")
            assert "Traceback" not in log, log[-3000:]
            await p.finish(within=15)
