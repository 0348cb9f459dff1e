"""``oam serve``'s request mapping hardened (issue 32), in process: the access checks'
parsing, the depth bound, ``stop``, the sampling fields an engine honours, a forced call cut
off by the token budget, the conversation keys the server's script follows, the history a
window could show; a hypothesis fuzz of the mapping (any JSON shape is a plan or a
``BridgeError``, never another exception); and docs/http.md against the code. The real
server: tests/process/test_http_serve_hardening.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.core import _messages as m
from bridge.errors import BridgeError
from bridge.hosts.http import _plan
from bridge.hosts.http._plan import (
    HTTP_ONLY,
    MAX_NESTING_DEPTH,
    VALID,
    ChatPlan,
    Refusal,
    ScriptPositions,
    StopScan,
    decode_body,
    plan_chat,
    turn_failure,
)
from bridge.hosts.http.app import Access, host_name, is_loopback, parse_args

ROOT = Path(__file__).resolve().parents[2]
USER = [{"role": "user", "content": "Hi"}]


def engine_of(model: str) -> str | None:
    return {"scripted": "scripted", "llama": "llama", "openai": "openai", "smol": "llama"}.get(model)


def refused(body: dict[str, Any], **kw: Any) -> BridgeError:
    with pytest.raises(BridgeError) as e:
        plan_chat(body, **kw)
    return e.value


# ---- who may ask ----


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8090", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("localhost.:80", "localhost"),
        ("[::1]:8090", "::1"),
        ("[::1]", "::1"),
        ("evil.example", "evil.example"),
        ("evil.example:8090", "evil.example"),
    ],
)
def test_a_host_header_is_read_without_its_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_the_host_check_is_on_for_a_loopback_bind_and_where_hosts_are_named() -> None:
    local = Access.for_bind("127.0.0.1", None, [], [])
    assert local.host_ok("localhost:1") and local.host_ok("[::1]:80") and local.host_ok(None)
    assert not local.host_ok("evil.example") and not local.host_ok("127.0.0.1.evil.example")
    assert Access.for_bind("127.0.0.1", None, ["npc.example"], []).host_ok("NPC.example:9")
    assert Access.for_bind("127.0.0.1", None, ["*"], []).host_ok("evil.example")
    assert Access.for_bind("0.0.0.0", None, [], []).host_ok("evil.example"), "any name reaches a public bind"
    public = Access.for_bind("0.0.0.0", None, ["npc.example"], [])
    assert public.host_ok("npc.example") and not public.host_ok("evil.example")
    assert is_loopback("127.0.0.2") and is_loopback("::1") and not is_loopback("0.0.0.0")


def test_origins_and_keys() -> None:
    a = Access.for_bind("127.0.0.1", "k3y", [], ["http://game.example:3000/"])
    assert a.origin_ok("http://game.example:3000") and not a.origin_ok("http://evil.example")
    assert Access.for_bind("127.0.0.1", None, [], ["*"]).origin_ok("null")
    assert a.key_ok("Bearer k3y") and a.key_ok("bearer  k3y ") and not a.key_ok("Bearer k3y2")
    assert not a.key_ok(None) and not a.key_ok("k3y") and not a.key_ok("Basic k3y")
    assert Access().key_ok(None)


def test_the_key_comes_from_the_option_the_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OAM_API_KEY", "from-env")
    assert parse_args([]).api_key == "from-env"
    assert parse_args(["--api-key", "given"]).api_key == "given"
    f = tmp_path / "key"
    f.write_text("from-file\nsecond line\n")
    assert parse_args(["--api-key-file", str(f)]).api_key == "from-file"
    f.write_text("\n")
    with pytest.raises(SystemExit):
        parse_args(["--api-key-file", str(f)])
    with pytest.raises(SystemExit):
        parse_args(["--api-key", "a", "--api-key-file", str(f)])
    with pytest.raises(SystemExit):
        parse_args(["--body-timeout", "0"])
    monkeypatch.delenv("OAM_API_KEY")
    assert parse_args([]).api_key is None


# ---- depth ----


def test_json_deeper_than_the_limit_is_too_deep_wherever_it_is() -> None:
    ok = "[" * (MAX_NESTING_DEPTH - 1) + "]" * (MAX_NESTING_DEPTH - 1)
    assert decode_body(ok.encode()) is not None
    for depth in (MAX_NESTING_DEPTH + 1, 5000, 100_000):
        e = refused_decode("[" * depth + "]" * depth)
        assert (e.code, e.data["reason"]) == ("invalid_request", "too_deep")
    deep_args = '{"a":' * 200 + "1" + "}" * 200
    call = {"id": "c", "type": "function", "function": {"name": "t", "arguments": deep_args}}
    e = refused(
        {
            "model": "scripted",
            "messages": [*USER, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c"}],
        }
    )
    assert (e.data["reason"], e.data["param"]) == ("too_deep", "messages[1].tool_calls[0].function.arguments")


def refused_decode(text: str) -> BridgeError:
    with pytest.raises(BridgeError) as e:
        decode_body(text.encode())
    return e.value


# ---- stop and the sampling fields ----


def test_sampling_fields_are_taken_where_the_engine_honours_them() -> None:
    body = {"model": "scripted", "messages": USER, "presence_penalty": 1, "top_k": 3, "min_p": 0.5, "stop": "x"}
    plan = plan_chat(body, engine_of=engine_of)
    assert plan.stop == ("x",)
    assert plan_chat({**body, "model": "llama", "top_k": 40, "min_p": 0.05, "presence_penalty": 0}, engine_of=engine_of)
    for field, value in (("top_k", 41), ("min_p", 0.1), ("presence_penalty", 0.1), ("logit_bias", {"1": 1})):
        e = refused({"model": "smol", "messages": USER, field: value}, engine_of=engine_of)
        assert (e.data["param"], e.data["reason"]) == (field, "unsupported_parameter") and "llama engine" in e.message
    e = refused({"model": "openai", "messages": USER, "top_k": 40}, engine_of=engine_of)
    assert e.data["param"] == "top_k" and "openai engine" in e.message
    # without the engine's word: only the neutral values (as before)
    assert refused({"model": "scripted", "messages": USER, "stop": ["\n"]}).data["param"] == "stop"
    # values of the wrong shape, whatever the engine
    wrong: list[tuple[str, Any]] = [
        ("stop", ""),
        ("stop", ["a"] * 5),
        ("top_k", -1),
        ("min_p", 2),
        ("logit_bias", {"1": 500}),
    ]
    for field, value in wrong:
        e = refused({"model": "scripted", "messages": USER, field: value}, engine_of=engine_of)
        assert (e.data["param"], e.data["reason"]) == (field, "invalid_value")
    fmt = {"type": "json_object"}
    e = refused({"model": "scripted", "messages": USER, "stop": "}", "response_format": fmt}, engine_of=engine_of)
    assert e.data["param"] == "stop"


def test_the_llama_engines_sampling_is_what_the_server_says() -> None:
    worker = pytest.importorskip("bridge.engines.llama._worker")
    assert (worker.TOP_K, worker.MIN_P) == (_plan.LLAMA_TOP_K, _plan.LLAMA_MIN_P)


def _cut(text: str, stops: tuple[str, ...]) -> str:
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(cuts)] if cuts else text


@given(
    st.text(alphabet="ab c\n", max_size=40),
    st.lists(st.integers(1, 6), max_size=20),
    st.lists(st.text(alphabet="ab c\n", min_size=1, max_size=4), min_size=1, max_size=4),
)
def test_stop_scan_shows_the_text_before_the_first_stop_sequence(text: str, cuts: list[int], stops: list[str]) -> None:
    scan = StopScan(tuple(stops))
    shown, i = "", 0
    for n in cuts:
        shown += scan.feed(text[i : i + n])
        i += n
    shown += scan.feed(text[i:])
    if not scan.hit:
        shown += scan.flush()
    assert shown == _cut(text, tuple(stops)) == scan.step_text
    assert scan.hit == (shown != text or any(s in text for s in stops))


def test_stop_scan_starts_again_on_a_new_step() -> None:
    scan = StopScan(("END",))
    assert scan.feed("one E") == "one "
    assert scan.feed("Two", reset=True) == "ETwo" and scan.step_text == "Two"
    assert scan.feed(" EN") == " " and scan.feed("D more") == "" and scan.hit and scan.step_text == "Two "


# ---- a turn that failed ----


def _plan_of(**kw: Any) -> ChatPlan:
    return plan_chat({"model": "scripted", "messages": USER, **kw})


def test_a_call_or_answer_cut_off_by_the_budget_is_max_tokens_reached() -> None:
    plan = _plan_of(max_tokens=5)
    cut = turn_failure(
        plan, m.ErrorInfo("generation_failed", "the model's tool call was cut off by maxTokens", True), ""
    )
    assert isinstance(cut, Refusal) and (cut.code, cut.status, cut.param) == ("max_tokens_reached", 422, "max_tokens")
    words = m.ErrorInfo(
        "generation_failed", "the model answered without calling a tool on a step that required one", True
    )
    for text in ('{"tool_calls":[{"na', "{ ", '{"'):
        assert isinstance(turn_failure(plan, words, text), Refusal), text
    for text in ("", "Hello!", "{}"):
        failed = turn_failure(plan, words, text)
        assert isinstance(failed, BridgeError) and failed.code == "generation_failed" and failed.retryable
    other = turn_failure(plan, m.ErrorInfo("rate_limited", "slow down", True), '{"tool_calls"')
    assert isinstance(other, BridgeError) and other.code == "rate_limited"
    plan = _plan_of(max_completion_tokens=5, max_tokens=9)
    json_cut = m.ErrorInfo(
        "generation_failed", "the structured answer is not valid JSON (cut off by maxTokens: ...)", True
    )
    failed = turn_failure(plan, json_cut, "")
    assert isinstance(failed, Refusal) and failed.param == "max_completion_tokens"


def test_the_messages_the_mapping_reads_are_the_ones_the_agent_and_engines_say() -> None:
    from bridge.core.agent._steering import structured_answer
    from bridge.engines._text._grammar import CALL_PREFIX, CallSniffer

    assert CALL_PREFIX == '{"tool_calls"'
    with pytest.raises(BridgeError) as e:
        structured_answer('{"open": tr', {"type": "object"}, "length")
    assert _plan.CUT_OFF in e.value.message
    sniff = CallSniffer(True)
    sniff.feed('{"tool_calls":[{"name":"roll')
    with pytest.raises(BridgeError) as e:
        sniff.end("length")
    assert _plan.CUT_OFF in e.value.message
    steering = (ROOT / "bridge" / "core" / "agent" / "_steering.py").read_text()
    assert _plan.REQUIRED_NO_CALL in steering


# ---- conversations and history ----


def test_a_request_that_continues_another_names_it_by_its_prefix() -> None:
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Roll"}]
    call = {"id": "r1", "type": "function", "function": {"name": "roll", "arguments": '{"sides": 6, "n": 1}'}}
    # what the client sends back: null content, another key order, spaces, extra fields
    echoed = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [{**call, "function": {"name": "roll", "arguments": '{"n":1,"sides":6}'}}],
    }
    p1 = plan_chat({"model": "scripted", "messages": first}, conversation_keys=True)
    p2 = plan_chat(
        {"model": "scripted", "messages": [*first, echoed, {"role": "tool", "tool_call_id": "r1", "content": "4"}]},
        conversation_keys=True,
    )
    assert p1.prefix_key is None and p2.prefix_key == p1.key and p2.key != p1.key
    other = plan_chat({"model": "scripted", "messages": [first[1]]}, conversation_keys=True)
    assert other.key != p1.key
    assert _plan_of().key is None, "no keys unless asked"
    positions = ScriptPositions([{"text": "a"}], max_kept=2)
    positions.record(p1.key, 1)
    assert positions.start(p2.prefix_key) == 1 and positions.start(None) == 0 and positions.start("x") == 0
    positions.record("k2", 2)
    positions.record("k3", 3)
    assert positions.start(p1.key) == 0, "the least recently used is forgotten"


def test_history_beyond_what_the_window_could_show_is_left_out() -> None:
    msgs: list[dict[str, Any]] = []
    for i in range(10):
        msgs += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    body = {"model": "scripted", "messages": [*msgs, {"role": "user", "content": "last"}]}
    assert len(plan_chat(body).history) == 10
    plan = plan_chat(body, engine_of=engine_of, context_sizes={"scripted": 4})
    assert [t[0].content for t in plan.history] == ["q6", "q7", "q8", "q9"]


# ---- the fuzz: any JSON shape is a plan or an error with a code ----
# Bodies that are mostly right, with any field wrong in any way: a valid conversation and
# plausible values, each of which may be any JSON instead (a body of any shape too).

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
any_json = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``valid`` (7 in 8), else any JSON."""
    return st.integers(0, 7).flatmap(lambda i: any_json if i == 0 else valid)


text = st.text(max_size=12)
schema = st.sampled_from(
    [
        {"type": "object", "properties": {"sides": {"type": "integer"}}, "required": ["sides"]},
        {"type": "object"},
        {"type": "string"},
        {"type": "nope"},
        {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}},
        {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": [1, "a", None]}}}},
    ]
) | st.dictionaries(st.sampled_from(["type", "properties", "required", "enum", "items", "$ref"]), any_json)
call = st.fixed_dictionaries(
    {
        "id": maybe(st.sampled_from(["c1", "c2"])),
        "type": maybe(st.just("function")),
        "function": maybe(
            st.fixed_dictionaries(
                {
                    "name": maybe(st.sampled_from(["roll", "open"])),
                    "arguments": maybe(st.sampled_from(["{}", '{"sides": 6}', "[1]", "{", '{"a":' * 150 + "1"])),
                }
            )
        ),
    }
)
user = st.fixed_dictionaries(
    {
        "role": st.just("user"),
        "content": maybe(text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)),
    },
    optional={"name": maybe(text)},
)
system = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer"]), "content": maybe(text)})
answered = st.builds(
    lambda u, calls, outs: [
        u,
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": o, "content": "4"} for o in outs),
    ],
    user,
    st.lists(call, min_size=1, max_size=2),
    st.lists(st.sampled_from(["c1", "c2", "c3"]), max_size=2),
)
exchange = st.builds(lambda u, a: [u, {"role": "assistant", "content": a}], user, maybe(text))
conversation = st.builds(
    lambda sys_, turns, last: [*sys_, *(m for t in turns for m in t), *last],
    st.lists(system, max_size=1),
    st.lists(exchange | answered, max_size=3),
    st.lists(user, min_size=1, max_size=1) | st.just([]) | st.lists(any_json, max_size=1),
)
tool = st.fixed_dictionaries(
    {
        "type": maybe(st.just("function")),
        "function": maybe(
            st.fixed_dictionaries(
                {"name": maybe(st.sampled_from(["roll", "open"]))}, optional={"parameters": schema, "description": text}
            )
        ),
    }
)
step = st.one_of(
    st.fixed_dictionaries({"text": text}, optional={"finishReason": st.sampled_from(["stop", "length"])}),
    st.fixed_dictionaries({"json": any_json}),
    st.fixed_dictionaries(
        {
            "toolCalls": st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(["roll", "open"]),
                        "arguments": st.dictionaries(text, any_json, max_size=2),
                    }
                ),
                max_size=2,
            )
        }
    ),
    st.fixed_dictionaries({"error": st.sampled_from(["refusal", "guardrail_violation", "nope"])}),
    st.fixed_dictionaries({"echo": st.sampled_from(["prompt", "instructions", "x"])}),
    st.dictionaries(text, any_json, max_size=2),
)
OPTIONAL_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "tools": maybe(st.lists(tool, max_size=2)),
    "tool_choice": maybe(
        st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "roll"}}])
    ),
    "parallel_tool_calls": maybe(st.booleans()),
    "response_format": maybe(
        st.sampled_from([{"type": "text"}, {"type": "json_object"}])
        | st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}, schema)
    ),
    "stop": maybe(text | st.lists(text, max_size=5)),
    "max_tokens": maybe(st.integers(-2, 50)),
    "max_completion_tokens": maybe(st.integers(-2, 50)),
    "temperature": maybe(st.floats(-1, 3)),
    "top_p": maybe(st.floats(-0.5, 1.5)),
    "seed": maybe(st.integers(-5, 2**33)),
    "top_k": maybe(st.integers(-1, 100)),
    "min_p": maybe(st.floats(-0.5, 1.5)),
    "presence_penalty": maybe(st.floats(-3, 3)),
    "frequency_penalty": maybe(st.floats(-3, 3)),
    "logit_bias": maybe(st.dictionaries(st.sampled_from(["1", "42"]), st.integers(-200, 200), max_size=2)),
    "n": maybe(st.integers(0, 3)),
    "stream": maybe(st.booleans()),
    "stream_options": maybe(st.sampled_from([{"include_usage": True}, {"include_usage": False}, {}])),
    "script": maybe(st.lists(step, max_size=3)),
    "user": maybe(text),
    "logprobs": maybe(st.booleans()),
    "store": maybe(st.booleans()),
    "functions": any_json,
}


@st.composite
def _chat_body(draw: st.DrawFn, models: list[str]) -> dict[str, Any]:
    body = {"model": draw(maybe(st.sampled_from(models))), "messages": draw(maybe(conversation))}
    for name in draw(st.lists(st.sampled_from(sorted(OPTIONAL_FIELDS)), max_size=4, unique=True)):
        body[name] = draw(OPTIONAL_FIELDS[name])
    return body


def chat_bodies(models: list[str]) -> st.SearchStrategy[Any]:
    """Chat completion bodies for ``models``: mostly right, with up to 4 optional fields,
    each field maybe anything; and now and then any JSON at all."""
    return maybe(_chat_body(models))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_bodies(["scripted", "llama", "auto", "smol", "gpt-4o"]), st.booleans())
def test_any_body_is_a_plan_or_an_error_with_a_code(body: Any, keys: bool) -> None:
    data = json.dumps(body).encode()
    try:
        plan = _plan.parse_chat(data, engine_of, keys, {"scripted": 4096})
    except BridgeError as e:
        assert e.code in ("invalid_request", "invalid_schema") and e.http_status == 400, e
        return
    assert isinstance(plan, ChatPlan) and plan.engine


# ---- the documents ----


def test_docs_http_says_every_new_code_option_and_field() -> None:
    doc = (ROOT / "docs" / "http.md").read_text()
    for code, status in HTTP_ONLY.items():
        assert re.search(rf"^\| `{code}` \| {status} \| no \| .+ \|$", doc, re.M), code
    for name in (*VALID, "top_k", "min_p", "seed", "too_deep"):
        assert f"`{name}`" in doc, name
    for option in ("--api-key", "--api-key-file", "OAM_API_KEY", "--allow-host", "--allow-origin", "--body-timeout"):
        assert f"`{option}" in doc, option
    assert "GET /health" in doc and "Content-Type: application/json" in doc
    assert "## Threat model" in doc
