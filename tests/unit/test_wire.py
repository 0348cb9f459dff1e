"""Framing and the JSON-RPC envelope, tested as plain functions (no I/O), plus random input."""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st
import msgspec
import trio
from hypothesis import given, settings

from bridge import EngineRegistry, Server
from bridge.core._methods import PARAMS
from bridge.jsonrpc._framing import LineFramer, LineTooLong
from bridge.jsonrpc._protocol import encode_line


def test_framer_splits_lines_tolerates_crlf_and_skips_blanks() -> None:
    f = LineFramer(100)
    assert f.feed(b'{"a":1}\r\n\n  \n{"b"') == [b'{"a":1}']
    assert f.feed(b":2}\n") == [b'{"b":2}']
    assert f.eof() == []


def test_framer_drops_an_oversize_line_and_resynchronises() -> None:
    f = LineFramer(10)
    out = f.feed(b"x" * 8)
    out += f.feed(b"y" * 8)
    out += f.feed(b"zz\nok\n")
    assert len(out) == 2 and isinstance(out[0], LineTooLong) and out[0].size == 18 and out[1] == b"ok"
    assert f.feed(b"a" * 30 + b"\nb\n")[1] == b"b"


def test_framer_reports_a_last_line_without_newline_at_eof() -> None:
    f = LineFramer(10)
    f.feed(b"abc")
    assert f.eof() == [b"abc"]


def handle(server: Server, line: bytes) -> bytes | None:
    """The protocol without I/O: one line in, the response line out."""
    return trio.run(server.handle_line, line)


def rpc(server: Server, obj: object) -> object:
    out = handle(server, json.dumps(obj).encode())
    return None if out is None else json.loads(out)


def ready() -> Server:
    s = Server()
    rpc(s, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
    return s


def test_requests_before_initialize_get_not_initialized() -> None:
    r = rpc(Server(), {"jsonrpc": "2.0", "id": 1, "method": "npc/list"})
    assert r["error"]["code"] == -31022 and r["error"]["data"]["code"] == "not_initialized"


def test_parse_error_has_null_id() -> None:
    out = json.loads(handle(ready(), b'{"jsonrpc": "2.0", "method"'))
    assert out == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32700,
            "message": out["error"]["message"],
            "data": {"code": "parse_error", "retryable": False, "reason": "parse_error"},
        },
    }


def test_batch_cases_from_the_specification() -> None:
    s = ready()
    assert rpc(s, [])["error"]["code"] == -32600  # empty array: one error, not an array
    r = rpc(s, [1])  # invalid batch element: an array with one error
    assert isinstance(r, list) and r[0]["error"]["code"] == -32600 and r[0]["id"] is None
    r = rpc(s, [1, 2, 3])
    assert len(r) == 3
    assert (
        rpc(s, [{"jsonrpc": "2.0", "method": "npc/list"}, {"jsonrpc": "2.0", "method": "npc/list"}]) is None
    )  # all notifications
    r = rpc(
        s,
        [
            {"jsonrpc": "2.0", "id": "a", "method": "npc/list"},
            {"jsonrpc": "2.0", "method": "npc/list"},
            {"foo": "boo"},
            {"jsonrpc": "2.0", "id": "b", "method": "nope"},
        ],
    )
    assert [x.get("id") for x in r] == ["a", None, "b"]
    assert "result" in r[0] and r[1]["error"]["code"] == -32600 and r[2]["error"]["code"] == -32601
    out = handle(s, b'[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},{"jsonrpc": "2.0", "method"]')
    assert json.loads(out)["error"]["code"] == -32700  # invalid JSON batch: one parse error


def test_envelope_checks() -> None:
    s = ready()
    assert rpc(s, {"jsonrpc": "1.0", "id": 1, "method": "npc/list"})["error"]["data"]["reason"] == "bad_version"
    assert rpc(s, {"jsonrpc": "2.0", "id": 1, "method": 5})["error"]["code"] == -32600
    assert rpc(s, {"jsonrpc": "2.0", "id": [1], "method": "npc/list"})["error"]["data"]["reason"] == "bad_id"
    assert rpc(s, {"jsonrpc": "2.0", "id": 1, "method": "npc/list", "params": [1]})["error"]["code"] == -32602
    assert rpc(s, {"jsonrpc": "2.0", "id": 1, "method": "npc/list", "params": 3})["error"]["code"] == -32600
    assert rpc(s, {"jsonrpc": "2.0", "method": "nope"}) is None  # notifications are never answered
    assert rpc(s, {"jsonrpc": "2.0", "id": None, "method": "npc/list"})["result"] == {"npcs": []}


def test_deep_nesting_is_refused() -> None:
    s = ready()
    deep = b'{"jsonrpc":"2.0","id":1,"method":"npc/list","params":{"a":' + b"[" * 200 + b"]" * 200 + b"}}"
    assert json.loads(handle(s, deep))["error"]["data"]["reason"] == "too_deep"
    deeper = b"[" * 100_000 + b"]" * 100_000
    assert json.loads(handle(s, deeper))["error"]["data"]["reason"] == "too_deep"


def test_initialize_twice_and_wrong_types() -> None:
    s = ready()
    assert (
        rpc(s, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})["error"]["data"][
            "code"
        ]
        == "invalid_request"
    )
    r = rpc(s, {"jsonrpc": "2.0", "id": 2, "method": "npc/create", "params": {"npcId": 7}})
    assert r["error"]["code"] == -32602 and "npcId" in r["error"]["message"]


def test_whole_number_floats_count_as_integers() -> None:
    # REQ wire-doubles: Godot and JavaScript send every number as a double
    s = Server()
    r = rpc(s, {"jsonrpc": "2.0", "id": 1.0, "method": "initialize", "params": {"protocolVersion": 1.0}})
    assert r["result"]["protocolVersion"] == 1 and r["id"] == 1.0, "the id comes back as it was sent"
    assert rpc(s, {"jsonrpc": "2.0", "id": 1.5, "method": "npc/list"})["error"]["data"]["reason"] == "bad_id"
    ok = {"jsonrpc": "2.0", "id": 2, "method": "tokens/count", "params": {"text": "hi", "engine": "scripted"}}
    assert "result" in rpc(s, ok)
    for bad in (1.5, "1"):  # a fraction, or a string, is never an integer
        r = rpc(s, {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": bad}})
        assert r["error"]["code"] == -32602 and "protocolVersion" in r["error"]["message"]


async def test_whole_number_floats_reach_integer_options(client) -> None:  # type: ignore[no-untyped-def]
    await client.call(
        "npc/create",
        {"npcId": "a", "script": [{"text": "hi"}], "options": {"maxTokens": 64.0, "seed": 3.0, "temperature": 1.0}},
    )
    save = await client.call("npc/transcript", {"npcId": "a"})
    assert save["config"]["options"]["maxTokens"] == 64 and isinstance(save["config"]["options"]["maxTokens"], int)
    _, done = await client.turn("a", "x", maxToolRounds=2.0, toolTimeoutMs=1000.0)
    assert done["method"] == "turn/completed"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_and_always_answer_once(data: bytes) -> None:
    s = ready()
    for line in data.split(b"\n"):
        out = handle(s, line)
        if out is not None:
            assert out.endswith(b"\n") and out.count(b"\n") == 1
            json.loads(out)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)
# Every method of the protocol (the registry protocol.md is checked against) and one that is not.
METHODS = [*PARAMS, "bogus"]
FIELDS = {method: [f.encode_name for f in msgspec.structs.fields(t)] for method, t in PARAMS.items()}
REQUIRED = {method: [f.encode_name for f in msgspec.structs.fields(t) if f.required] for method, t in PARAMS.items()}
ALL_FIELDS = sorted({f for fields in FIELDS.values() for f in fields})
# Values that pass decoding often, so that requests reach the service: the same two NPCs,
# keys and tags, so that respond, submit, decide or world/get meet what create or world/set
# made. By field name; by (method, field) where methods differ.
npc_ids = st.sampled_from(["a", "b"])
TOOL = {"name": "check_inventory", "parameters": {"type": "object"}}
CALL_STEP = {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {}}]}
short_text = st.text(max_size=12)
LIKELY: dict[Any, st.SearchStrategy[Any]] = {
    "npcId": npc_ids,
    "npcIds": st.lists(npc_ids, max_size=2),
    "key": st.sampled_from(["gate", "weather"]),
    "value": st.text(max_size=8) | st.integers(),
    "tags": st.lists(st.sampled_from(["gate", "tavern"]), max_size=2),
    "lore": st.booleans(),
    "reasoning": st.booleans(),
    "remember": st.booleans(),
    "fullText": st.booleans(),
    "prompt": short_text,
    "text": short_text,
    "situation": short_text,
    "instructions": short_text,
    "speaker": short_text,
    "callId": st.sampled_from(["c1", "call_1"]),
    "output": json_values,
    "engine": st.just("scripted"),  # never one that loads a model
    "protocolVersion": st.just(1),
    "clientInfo": st.fixed_dictionaries({"name": short_text}),
    "persona": st.fixed_dictionaries({"name": short_text}),
    "toolChoice": st.sampled_from(["auto", "none", "required"]),
    "maxToolRounds": st.integers(0, 4),
    "maxToolCalls": st.integers(0, 4),
    "toolTimeoutMs": st.integers(0, 100),
    "schema": st.just({"type": "object"}),
    "tools": st.just([TOOL]),
    "script": st.lists(st.fixed_dictionaries({"text": st.text(max_size=8)}) | st.just(CALL_STEP), max_size=2),
    "save": st.fixed_dictionaries(
        {"version": st.just(1), "config": st.fixed_dictionaries({"npcId": npc_ids}), "turns": st.just([])}
    ),
    ("npc/create", "npcId"): st.sampled_from(["a", "c"]),  # a exists already (populated), c is new
    ("npc/create", "options"): st.fixed_dictionaries(
        {}, optional={"maxTokens": st.integers(1, 64), "seed": st.integers(0, 9)}
    ),
    ("npc/decide", "options"): st.lists(
        st.fixed_dictionaries({"name": st.sampled_from(["let_in", "question"])}),
        min_size=1,
        max_size=3,
        unique_by=lambda o: o["name"],
    ),
}
ids = st.integers() | st.text(max_size=5)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    """A request of any method. Mostly its own fields, those it requires always, with likely
    values (now and then any JSON); one in ten is any fields of any method with any JSON."""
    method = draw(st.sampled_from(METHODS))
    if method not in FIELDS or draw(st.integers(0, 9)) == 0:
        params = draw(st.dictionaries(st.sampled_from(ALL_FIELDS), json_values, max_size=4))
    else:
        keys = dict.fromkeys(REQUIRED[method] + draw(st.lists(st.sampled_from(FIELDS[method] or ["-"]), max_size=3)))
        params = {}
        for k in keys.keys() - {"-"}:
            likely = LIKELY.get((method, k), LIKELY.get(k))
            params[k] = draw(json_values if likely is None or draw(st.integers(0, 9)) == 0 else likely)
    return {"jsonrpc": "2.0", "id": draw(ids), "method": method, "params": params}


# Before the batch: nothing (requests before initialize), or initialize and a few things for
# the requests to meet: NPC a with a tool and a script, NPC b, a world fact.
SET_UP = {
    "fresh": [],
    "populated": [
        {"method": "initialize", "params": {"protocolVersion": 1}},
        {"method": "npc/create", "params": {"npcId": "a", "tags": ["gate"], "tools": [TOOL], "script": [CALL_STEP]}},
        {"method": "npc/create", "params": {"npcId": "b"}},
        {"method": "world/set", "params": {"key": "gate", "value": "barred", "tags": ["gate"]}},
    ],
}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(SET_UP)), st.lists(messages(), min_size=1, max_size=8))
def test_random_requests_get_exactly_one_response_each(set_up: str, batch: list[dict]) -> None:
    s = Server(EngineRegistry(default="scripted"))
    s.service.attach(_NoNursery())  # type: ignore[arg-type]  # npc/create may start a worker; nothing runs here
    for i, request in enumerate(SET_UP[set_up]):
        assert "result" in rpc(s, {"jsonrpc": "2.0", "id": f"set-up {i}", **request})
    r = rpc(s, batch)
    assert isinstance(r, list) and len(r) == len(batch)
    assert [x["id"] for x in r] == [m["id"] for m in batch]
    for x in r:
        assert ("result" in x) != ("error" in x)
        if "error" in x:
            assert isinstance(x["error"]["data"]["code"], str) and isinstance(x["error"]["data"]["retryable"], bool)


class _NoNursery:
    def start_soon(self, *a: object) -> None:
        pass


def test_unicode_line_breaks_are_escaped_on_the_wire() -> None:
    # REQ wire-linebreaks: readers that split on U+2028, U+2029 or U+0085 still see one line
    line = encode_line({"text": "a\u2028b\u2029c\u0085d"})
    assert line.count(b"\n") == 1 and len(line.decode().splitlines()) == 1
    assert json.loads(line) == {"text": "a\u2028b\u2029c\u0085d"}


def test_unsupported_protocol_version_is_refused_with_the_supported_list() -> None:
    r = rpc(Server(), {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 7}})
    assert r["error"]["data"]["code"] == "invalid_params"
    assert r["error"]["data"]["reason"] == "unsupported_protocol_version" and r["error"]["data"]["supported"] == [1]
