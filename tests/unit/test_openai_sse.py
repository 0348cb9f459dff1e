"""The openai engine's stream reading in process (bridge/engines/_sse.py): SSE lines end at
CR, LF or CRLF only, wherever the reads split them, and are bounded; a compressed body is
undone in bounded pieces; events are checked against the shape of a chat.completion.chunk.
Through the real process against misbehaving servers: tests/process/test_openai_hostile_server.py."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engines import openai
from bridge.engines._sse import PIECE_BYTES, BodyDecoder, LineReader, StreamProblem, first_model, parse_event
from bridge.engines.base import GenerationOptions, StepRequest
from bridge.engines.openai import OUTPUT_MAX_CHARS, OUTPUT_MIN_CHARS, output_cap

# text without CR or LF, rich in what str.splitlines also splits on
LINE_TEXT = st.text(
    st.one_of(
        st.sampled_from(["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "é", "a", " ", ":"]),
        st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(LINE_TEXT, max_size=12),
    ends=st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=12, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=20),
    last_unended=st.booleans(),
)
def test_lines_end_at_cr_lf_or_crlf_only_wherever_the_reads_split(
    lines: list[str], ends: list[str], cuts: list[int], last_unended: bool
) -> None:
    ends = ends[: len(lines)]
    for i in range(len(lines) - 1):  # a CR then an empty line's LF is a CRLF: one line end, as meant
        if ends[i] == "\r" and lines[i + 1] == "" and ends[i + 1] != "\r":
            ends[i] = "\r\n"
    body = "".join(line + end for line, end in zip(lines, ends, strict=True))
    if last_unended:
        body += "tail\u2028"
    data = body.encode()
    points = sorted({min(c, len(data)) for c in cuts})
    reader = LineReader(1 << 20)
    got: list[bytes] = []
    for a, b in zip([0, *points], [*points, len(data)], strict=True):
        got += reader.feed(data[a:b])
    last = reader.end()
    assert [g.decode() for g in got] == lines
    assert last == ("tail\u2028".encode() if last_unended else None)


def test_a_crlf_split_between_reads_is_one_line_end_and_a_lone_cr_is_one_too() -> None:
    reader = LineReader()
    assert reader.feed(b"a\r") == [b"a"]
    assert reader.feed(b"") == []
    assert reader.feed(b"\nb\r") == [b"b"]
    assert reader.feed(b"c\n\n") == [b"c", b""]
    assert reader.feed(b"\r") == [b""]
    assert reader.feed(b"\r\n") == [b""]


def test_a_line_past_the_bound_fails_as_soon_as_it_is_past() -> None:
    reader = LineReader(10)
    assert reader.feed(b"0123456789\n") == [b"0123456789"]
    reader.feed(b"01234")
    with pytest.raises(StreamProblem) as e:
        reader.feed(b"567890")
    assert e.value.reason == "stream_line_too_long"
    with pytest.raises(StreamProblem):
        LineReader(10).feed(b"x" * 11 + b"\n")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw"])
def test_a_compressed_body_is_undone_in_bounded_pieces(encoding: str) -> None:
    plain = b"data: " + b"x" * (50 * PIECE_BYTES) + b"\n"  # 3 MiB of one byte: ~3 KiB compressed
    if encoding == "gzip":
        packed = gzip.compress(plain)
    elif encoding == "deflate":
        packed = zlib.compress(plain)
    else:
        z = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = z.compress(plain) + z.flush()
    dec = BodyDecoder(encoding.split("-")[0])
    pieces = [p for i in range(0, len(packed), 1000) for p in dec.feed(packed[i : i + 1000])]
    assert all(len(p) <= PIECE_BYTES for p in pieces)
    assert b"".join(pieces) == plain


def test_an_unknown_or_corrupt_encoding_is_a_malformed_stream() -> None:
    with pytest.raises(StreamProblem) as e:
        BodyDecoder("br")
    assert e.value.reason == "malformed_stream"
    with pytest.raises(StreamProblem):
        BodyDecoder("gzip").feed(b"not gzip at all")
    assert BodyDecoder("identity").feed(b"abc") == [b"abc"]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b'{"choices":[{"index":0,"delta":"text"}]}', "$.choices[0].delta"),
        (b'{"choices":5}', "$.choices"),
        (b'{"choices":[{"delta":[1]}]}', "$.choices[0].delta"),
        (b'{"choices":[{"delta":{"tool_calls":5}}]}', "$.choices[0].delta.tool_calls"),
        (b'{"usage":{"prompt_tokens":"many"}}', "$.usage.prompt_tokens"),
        (b'{"usage":{"prompt_tokens":1e400}}', "$.usage.prompt_tokens"),
        (b'{"usage":{"completion_tokens":-1}}', "$.usage.completion_tokens"),
        (b'{"usage":{"prompt_tokens":100000000000000000000}}', "$.usage.prompt_tokens"),
        (b'{"choices":[{"finish_reason":{"a":1}}]}', "$.choices[0].finish_reason"),
        (b'{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":[1]}}]}}]}', "arguments"),
        (b"[1]", "object"),
        (b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"choices":', "not JSON"),
        (b'{"choices":[{"delta":{"content":"\\ud800"}}]}', "not JSON"),
    ],
)
def test_an_event_of_the_wrong_shape_is_malformed_and_says_where(data: bytes, says: str) -> None:
    with pytest.raises(StreamProblem) as e:
        parse_event(data)
    assert e.value.reason == "malformed_event" and says in e.value.detail, e.value.detail


def test_events_servers_really_send_are_read() -> None:
    ev = parse_event(
        '{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant",'
        '"content":"a\u2028b","tool_calls":null,"reasoning_content":null},"logprobs":null,"finish_reason":null}],'
        '"usage":null}'.encode()
    )
    assert ev.choices and ev.choices[0].delta and ev.choices[0].delta.content == "a\u2028b"
    ev = parse_event(
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":null,"prompt_tokens_details":{"cached_tokens":2}}}'
    )
    call = ev.choices[0].delta.tool_calls[0]  # type: ignore[index,union-attr]
    assert call.function is not None and call.function.arguments == {"a": 1}
    assert ev.usage is not None and ev.usage.prompt_tokens == 3 and ev.usage.prompt_tokens_details is not None
    # a server that cut a character: the rest is read
    assert parse_event(b'{"choices":[{"delta":{"content":"a\xe2\x80"}}]}').choices is not None


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (b'{"data":[{"id":"m1"},{"id":"m2"}]}', "m1"),
        (b"[1, 2]", None),
        (b'{"data": 5}', None),
        (b'{"data": [{"id": 5}]}', None),
        (b'{"data": [' * 50_000, None),
        (b"\xff\xfe", None),
    ],
)
def test_the_first_model_of_a_models_list(body: bytes, model: str | None) -> None:
    assert first_model(body) == model


@pytest.mark.parametrize(
    ("max_tokens", "cap"),
    [(None, OUTPUT_MAX_CHARS), (1, OUTPUT_MIN_CHARS), (1000, 32_000), (1_000_000, OUTPUT_MAX_CHARS)],
)
def test_the_output_cap_follows_max_tokens(max_tokens: int | None, cap: int) -> None:
    req = StepRequest(
        npc_id="n",
        instructions="",
        messages=[],
        tools=[],
        tool_mode="allowed",
        schema=None,
        options=GenerationOptions(max_tokens=max_tokens),
        step_index=0,
    )
    assert output_cap(req) == cap


# ---- Retry-After on a 429 ----


@pytest.mark.parametrize(
    ("header", "ms"),
    [
        ("2", 2000),
        (" 0 ", 0),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30_000),  # a date: from now
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0),  # past: at once
        ("Thu, 22 Oct 2015 07:28:30 GMT", None),  # more than a day off
        ("soon", None),
        ("-5", None),
        (None, None),
    ],
)
def test_retry_after_is_seconds_or_a_date(header: str | None, ms: int | None) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert openai.retry_after_ms(header, now=now) == ms


def test_a_429_carries_the_servers_retry_after_as_data() -> None:
    err = openai._status_error(429, "slow down", "http://x/v1", "3")
    assert err.code == "rate_limited" and err.to_event()["data"] == {"retryAfterMs": 3000}
    assert "data" not in openai._status_error(429, "slow down", "http://x/v1").to_event()
