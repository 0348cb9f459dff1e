"""The replay's loader and matcher on untrusted recordings (issue 32, items 3, 4 and 12), in
process: a hypothesis fuzz of ``Recording`` over random record shapes, mutated real records and
random bytes (every file either loads within the recorded bounds or is refused with one line
naming its line; nothing else is raised), and the matcher's rule for a recording cut short.
``OAM_REPLAY_FUZZ_EXAMPLES`` sets the fuzz's length (default 1500; the attack pass ran more)."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.hosts.replay import (
    MAX_DEPTH,
    MAX_DROPPED_BYTES,
    RECORDED_SIGNALS,
    Matcher,
    Recording,
    RecordingError,
    bridge_argv,
)

EXAMPLES = int(os.environ.get("OAM_REPLAY_FUZZ_EXAMPLES", "1500"))
PATH = "fuzz.jsonl"
LIMIT = 64  # the header's maxLineBytes: small, so the fuzz reaches the bounds
HEADER: dict[str, Any] = {
    "oamRecording": 1,
    "bridgeVersion": "0.1.0",
    "options": {"engine": "scripted", "max_line_bytes": LIMIT},
}
INIT = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
REAL = [  # records as the recorder writes them, for the fuzz to mutate
    {"t": 0.1, "dir": "in", "read": 1, "line": INIT[:60]},
    {"t": 0.1, "dir": "in", "read": 1, "tooLong": 100},
    {"t": 0.2, "dir": "out", "msg": {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 1}}},
    {
        "t": 0.3,
        "dir": "out",
        "msg": {"jsonrpc": "2.0", "method": "turn/textDelta", "params": {"turnId": "turn_0123456789ab", "seq": 0}},
    },
    {
        "t": 0.3,
        "dir": "out",
        "msg": {"jsonrpc": "2.0", "method": "turn/completed", "params": {"turnId": "turn_0123456789ab", "seq": 1}},
    },
    {"t": 0.4, "dir": "out", "msg": [{"jsonrpc": "2.0", "id": 2, "result": {}}]},
    {"t": 0.5, "dir": "in", "eof": True},
    {"t": 0.5, "dir": "in", "signal": 15},
    {"t": 0.5, "dir": "in", "parentGone": True},
    {"end": True, "t": 0.6, "npcs": {"g": {"engine": "llama", "model": None, "options": {}}}, "droppedLines": 0},
]
KEYS = ["t", "dir", "read", "line", "tooLong", "eof", "signal", "parentGone", "msg", "end", "npcs", "droppedLines"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)
special = st.sampled_from(
    [
        "in",
        "out",
        True,
        False,
        15,
        2,
        9,
        19,
        0,
        -1,
        LIMIT,
        LIMIT + 1,
        MAX_DROPPED_BYTES,
        MAX_DROPPED_BYTES + 1,
        10**30,
        "x" * LIMIT,
        "x" * (LIMIT + 1),
        "a\nb",
        "\udcff",
        "turn_0123456789ab",
        INIT,
    ]
)
values = json_values | special


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode("utf-8", "surrogatepass")  # lone surrogates too, as bytes a file can hold


def deep(depth: int, inside: bytes = b"") -> bytes:
    return b"[" * depth + inside + b"]" * depth


def mutate(record: dict[str, Any], drop: list[str], add: dict[str, Any]) -> bytes:
    return dumps({**{k: v for k, v in record.items() if k not in drop}, **add})


lines = st.one_of(
    st.builds(
        mutate,
        st.sampled_from(REAL),
        st.lists(st.sampled_from(KEYS), max_size=2),
        st.dictionaries(st.sampled_from(KEYS), values, max_size=2),
    ),
    st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), values, max_size=6).map(dumps),
    json_values.map(dumps),
    st.integers(1, 5000).map(lambda d: b'{"dir":"out","msg":' + deep(d) + b"}"),
    st.integers(1, 5000).map(lambda d: b'{"t":0,"dir":"in","read":1,"line":"' + deep(d) + b'"}'),
    st.binary(max_size=80),
    st.sampled_from(REAL).map(lambda r: dumps(r)[: len(dumps(r)) // 2]),  # a line cut in half
)
headers = st.one_of(
    st.just(dumps(HEADER)),
    st.builds(lambda k, v: dumps({**HEADER, k: v}), st.sampled_from(["options", "script", "oamRecording"]), values),
    st.builds(
        lambda k, v: dumps({**HEADER, "options": {**HEADER["options"], k: v}}),
        st.sampled_from(["engine", "model", "max_line_bytes", "llama_ctx", "openai_grammar", "openai_timeout"]),
        values,
    ),
    st.binary(max_size=40),
)


def depth_of(obj: Any) -> int:
    best, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        best = max(best, d)
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return best


def check_loaded(rec: Recording) -> None:
    """What a loaded recording promises the replay: the recorded bounds held, every shape
    usable without another check."""
    limit = rec.header.max_line_bytes
    dropped = 0
    for step in rec.steps:
        if step.end is not None:
            assert len(step.end) == 1
            ((kind, value),) = step.end.items()
            assert kind in ("eof", "signal", "parentGone")
            assert value in RECORDED_SIGNALS if kind == "signal" else value is True
            continue
        assert step.lines
        for _, line in step.lines:
            if isinstance(line, bytes):
                assert len(line) <= limit and b"\n" not in line
            else:
                assert line > limit
                dropped += line
    assert dropped <= MAX_DROPPED_BYTES
    for e in rec.expected:
        msg = e.msg()
        assert isinstance(msg, (dict, list)) and depth_of(msg) <= MAX_DEPTH
    for w in rec.warnings():
        assert isinstance(w, str) and "\n" not in w
    argv = bridge_argv(rec.header, "script.json")
    assert all(isinstance(a, str) and "\x00" not in a for a in argv)
    if rec.header.script is not None:
        json.dumps(rec.header.script)  # as the replay writes it for the bridge
    matcher = Matcher(rec.expected, rec.finished_turns)
    matcher.cut_short = rec.cut_short
    for step in rec.steps:  # as the replay sends them
        for _, line in step.lines:
            if isinstance(line, bytes):
                matcher.sent(line)
    for e in rec.expected:  # a bridge that answers what was recorded
        matcher.feed(bytes(e.raw), e.line)
    matcher.first_missing(1) if not all(matcher.matched) or matcher.held() else None


def load(data: bytes) -> Recording | RecordingError:
    try:
        return Recording._read(PATH, io.BytesIO(data))
    except RecordingError as e:
        return e


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(header=headers, body=st.lists(lines, max_size=8), newline_at_end=st.booleans())
def test_any_file_loads_within_the_recorded_bounds_or_is_refused_in_one_line(
    header: bytes, body: list[bytes], newline_at_end: bool
) -> None:
    data = b"\n".join([header, *(x.replace(b"\n", b" ") for x in body)]) + (b"\n" if newline_at_end else b"")
    got = load(data)
    if isinstance(got, RecordingError):
        text = str(got)
        assert text.startswith(f"{PATH}: line ") and "\n" not in text, text
    else:
        check_loaded(got)


@settings(max_examples=max(EXAMPLES // 3, 100), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=400))
def test_random_bytes_never_raise_anything_but_a_recording_error(data: bytes) -> None:
    got = load(dumps(HEADER) + b"\n" + data)
    if isinstance(got, RecordingError):
        assert "\n" not in str(got)
    else:
        check_loaded(got)


# ---- the bounds, exactly ----


@pytest.mark.parametrize(
    ("record", "loads"),
    [
        ({"dir": "in", "read": 1, "line": "x" * LIMIT}, True),
        ({"dir": "in", "read": 1, "line": "x" * (LIMIT + 1)}, False),
        ({"dir": "in", "read": 1, "line": "\udcff" * LIMIT}, True),  # a byte that is not UTF-8 is one byte
        ({"dir": "in", "read": 1, "tooLong": LIMIT}, False),
        ({"dir": "in", "read": 1, "tooLong": LIMIT + 1}, True),
        ({"dir": "in", "read": 1, "tooLong": MAX_DROPPED_BYTES}, True),
        ({"dir": "in", "read": 1, "tooLong": MAX_DROPPED_BYTES + 1}, False),
        ({"dir": "out", "msg": json.loads(deep(MAX_DEPTH))}, True),
        ({"dir": "out", "msg": json.loads(deep(MAX_DEPTH + 1))}, False),
    ],
)
def test_the_recorded_bounds(record: dict[str, Any], loads: bool) -> None:
    got = load(dumps(HEADER) + b"\n" + dumps(record) + b"\n")
    assert isinstance(got, Recording) is loads, got


def test_the_dropped_lines_of_one_recording_are_bounded_together() -> None:
    half = {"dir": "in", "read": 1, "tooLong": MAX_DROPPED_BYTES // 2 + 1}
    got = load(dumps(HEADER) + b"\n" + dumps(half) + b"\n" + dumps({**half, "read": 2}) + b"\n")
    assert isinstance(got, RecordingError) and ": line 3: " in str(got)


def test_a_header_without_max_line_bytes_bounds_by_the_bridges_default() -> None:
    got = load(dumps({"oamRecording": 1}) + b"\n" + dumps({"dir": "in", "read": 1, "tooLong": 4 * 1024 * 1024}) + b"\n")
    assert isinstance(got, RecordingError) and "not over the recorded maxLineBytes 4194304" in str(got)


# ---- a recording cut short: the matcher's rule ----


def event(turn: str, seq: int, method: str = "turn/textDelta") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": {"turnId": turn, "seq": seq}}


def started(turn: str) -> dict[str, Any]:
    """``npc/respond``'s answer: the replay maps the turn's id from it."""
    return {"jsonrpc": "2.0", "id": f"respond-{turn[-1]}", "result": {"turnId": turn}}


def recording(*msgs: Any, trailer: bool) -> Recording:
    body = [dumps({"dir": "out", "msg": m}) for m in (started(A), started(B), *msgs)]
    if trailer:
        body.append(dumps({"end": True, "npcs": {}, "droppedLines": 0}))
    got = load(b"\n".join([dumps(HEADER), *body]) + b"\n")
    assert isinstance(got, Recording)
    return got


def play(rec: Recording, *actual: Any) -> list[str]:
    """The divergences of a replay whose bridge wrote ``actual`` (its turn ids are this run's)."""
    m = Matcher(rec.expected, rec.finished_turns)
    m.cut_short = rec.cut_short
    lines = [json.dumps(a).replace(A, A_NOW).replace(B, B_NOW).encode() for a in (started(A), started(B), *actual)]
    return [d.kind for line in lines if (d := m.feed(line, 1)) is not None]


A, B = "turn_aaaaaaaaaaaa", "turn_bbbbbbbbbbbb"  # as recorded
A_NOW, B_NOW = "turn_cccccccccccc", "turn_eeeeeeeeeeee"  # as the replay's bridge made them up


def test_cut_short_a_line_after_the_end_of_a_turn_still_streaming_is_no_divergence() -> None:
    rec = recording(event(A, 0), event(B, 0), event(B, 1), trailer=False)
    assert rec.cut_short and rec.finished_turns == set()
    assert play(rec, event(A, 0), event(A, 1), event(A, 2), event(B, 0), event(B, 1)) == []


def test_with_a_trailer_the_same_line_is_a_divergence() -> None:
    rec = recording(event(A, 0), event(B, 0), event(B, 1), trailer=True)
    assert play(rec, event(A, 0), event(A, 1)) == ["unexpected"]


def test_cut_short_an_extra_event_of_a_turn_whose_end_is_recorded_is_a_divergence() -> None:
    rec = recording(event(A, 0), event(A, 2, "turn/completed"), event(B, 0), trailer=False)
    assert rec.finished_turns == {A}
    assert play(rec, event(A, 0), event(A, 1)) == ["unexpected"]


def test_cut_short_a_line_answered_differently_is_still_a_divergence() -> None:
    rec = recording(event(A, 0), trailer=False)
    changed = {**event(A, 0), "params": {"turnId": A, "seq": 0, "delta": "x"}}
    assert play(rec, changed) == ["differs"]


def test_a_game_line_with_bytes_that_are_not_utf8_loads_as_the_recorder_wrote_it() -> None:
    record = json.dumps({"t": 0, "dir": "in", "read": 1, "line": b"not json \xff".decode("utf-8", "surrogateescape")})
    assert "\\udcff" in record  # how the recorder writes it; msgspec alone refuses a lone surrogate
    got = load(dumps(HEADER) + b"\n" + record.encode() + b"\n")
    assert isinstance(got, Recording) and got.steps[0].lines == [(2, b"not json \xff")]


def test_a_line_cut_in_half_at_the_end_is_left_out_but_one_in_the_middle_is_refused() -> None:
    whole = dumps({"dir": "out", "msg": event(A, 0)})
    ok = load(dumps(HEADER) + b"\n" + whole + b"\n" + whole[:20])
    assert isinstance(ok, Recording) and ok.cut_line == 3 and len(ok.expected) == 1
    bad = load(dumps(HEADER) + b"\n" + whole[:20] + b"\n" + whole + b"\n")
    assert isinstance(bad, RecordingError) and ": line 2: not JSON" in str(bad)


def test_a_record_after_the_trailer_is_refused() -> None:
    trailer = dumps({"end": True, "npcs": {}, "droppedLines": 0})
    got = load(dumps(HEADER) + b"\n" + trailer + b"\n" + dumps({"dir": "in", "eof": True}) + b"\n")
    assert isinstance(got, RecordingError) and ": line 3: a record after the trailer" in str(got)
