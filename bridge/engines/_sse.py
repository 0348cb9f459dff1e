"""Reading what an OpenAI-compatible server sends, with bounds (the openai engine's private
helpers): the body's content encoding undone in bounded pieces, the body cut into SSE lines
(CR, LF or CRLF end a line, nothing else), each line at most ``LINE_MAX_BYTES``, and each
``data:`` event checked against the shape of a ``chat.completion.chunk``.

A server that breaks one of these raises ``StreamProblem`` with a stable ``reason`` and a
message naming what was wrong; the engine turns it into ``generation_failed``."""

from __future__ import annotations

import re
import zlib
from typing import Annotated, Any

import msgspec

# The bridge's default ``limits.maxLineBytes`` (bridge/core/_messages.py): the limits the game
# sees do not reach the engines, so one SSE line (one event) is bounded by the same default.
LINE_MAX_BYTES = 4 * 1024 * 1024
PIECE_BYTES = 64 * 1024  # most bytes one decompressed piece of a body holds
MAX_COUNT = 2**53  # token counts past this are not counts

_EOL = re.compile(rb"\r\n|\r|\n")


class StreamProblem(Exception):
    """What the server sent is not what the protocol allows: ``reason`` is a stable token
    (``malformed_event``, ``malformed_stream``, ``stream_line_too_long``), ``detail`` says what."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class LineReader:
    """Bytes in, SSE lines out (without their ends). A line ends at CR, LF or CRLF only
    (the SSE specification): U+2028, U+2029 and U+0085 are text, whatever ``str.splitlines``
    thinks. A CRLF split between two reads is one line end. A line longer than ``max_bytes``
    raises ``stream_line_too_long`` as soon as it is, so memory stays bounded."""

    def __init__(self, max_bytes: int = LINE_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._after_cr = False  # the last read ended with CR: a LF first in the next is its CRLF

    def feed(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        if self._after_cr and data[:1] == b"\n":
            data = data[1:]
        out: list[bytes] = []
        start = 0
        for m in _EOL.finditer(data):
            piece = data[start : m.start()]
            if self._buf:
                self._buf += piece
                piece = bytes(self._buf)
                self._buf.clear()
            self._check(len(piece))
            out.append(piece)
            start = m.end()
        self._after_cr = start == len(data) and data.endswith(b"\r")
        rest = data[start:]
        if rest:
            self._check(len(self._buf) + len(rest))
            self._buf += rest
        return out

    def end(self) -> bytes | None:
        """The last line, when the body ended without its line end (None: there is none)."""
        if not self._buf:
            return None
        line = bytes(self._buf)
        self._buf.clear()
        return line

    def _check(self, n: int) -> None:
        if n > self.max_bytes:
            self._buf.clear()
            raise StreamProblem("stream_line_too_long", f"a stream line longer than {self.max_bytes} bytes")


class BodyDecoder:
    """Undoes the body's ``Content-Encoding`` (none, ``gzip`` or ``deflate``; the engine asks
    for none, and a server that compresses anyway is still read) in pieces of at most
    ``PIECE_BYTES``, so a small compressed body cannot expand into memory at once."""

    def __init__(self, content_encoding: str) -> None:
        enc = content_encoding.strip().lower()
        self._raw_fallback = False
        if enc in ("", "identity"):
            self._z: Any = None
        elif enc in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif enc == "deflate":  # zlib-wrapped as the specification says, or raw as some send
            self._z = zlib.decompressobj()
            self._raw_fallback = True
        else:
            raise StreamProblem("malformed_stream", f"a body whose Content-Encoding {enc[:40]!r} is not supported")

    def feed(self, data: bytes) -> list[bytes]:
        if self._z is None:
            return [data] if data else []
        out: list[bytes] = []
        while data:
            try:
                piece = self._z.decompress(data, PIECE_BYTES)
            except zlib.error as e:
                if not self._raw_fallback:
                    raise StreamProblem("malformed_stream", f"a compressed body that is corrupt ({e})") from None
                self._z, self._raw_fallback = zlib.decompressobj(-zlib.MAX_WBITS), False
                continue
            self._raw_fallback = False
            data = self._z.unconsumed_tail
            if piece:
                out.append(piece)
            elif self._z.eof:
                break  # bytes after the end of the compressed stream: ignored
        return out


# ---- the events of a streamed chat completion ----

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]


class FunctionPiece(msgspec.Struct):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None  # Ollama sends an object


class CallPiece(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: FunctionPiece | None = None


class Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[CallPiece] | None = None


class Choice(msgspec.Struct):
    index: int | None = None
    delta: Delta | None = None
    finish_reason: str | None = None


class TokenDetails(msgspec.Struct):
    cached_tokens: Count | None = None


class EventUsage(msgspec.Struct):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_tokens_details: TokenDetails | None = None


class Event(msgspec.Struct):
    """One ``data:`` event: fields the engine does not read are ignored, those it reads
    must have their documented types (``null`` allowed wherever a server may send it)."""

    choices: list[Choice] | None = None
    usage: EventUsage | None = None
    error: Any = None  # llama-server and vLLM report mid-stream errors so


_EVENT = msgspec.json.Decoder(Event)


def parse_event(data: bytes) -> Event:
    """A ``data:`` line's value as an ``Event``; ``malformed_event`` naming what is wrong
    when it is not JSON, not an object, or a field the engine reads has the wrong type."""
    try:
        try:
            return _EVENT.decode(data)
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:  # a server that cut a character: read the rest
                return _EVENT.decode(data.decode("utf-8", "replace").encode())
            raise
    except msgspec.ValidationError as e:
        raise StreamProblem("malformed_event", f"an event of the wrong shape ({e})") from None
    except msgspec.DecodeError as e:
        raise StreamProblem("malformed_event", f"an event that is not JSON ({e})") from None
    except RecursionError:
        raise StreamProblem("malformed_event", "an event nested too deeply") from None


def first_model(body: bytes) -> str | None:
    """The first model id of a ``GET /models`` answer, None when it has none or is not the
    documented ``{"data": [{"id": ...}, ...]}``."""
    try:
        obj = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    data = obj.get("data") if isinstance(obj, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    model = first.get("id") if isinstance(first, dict) else None
    return model if isinstance(model, str) and model else None
