"""JSON-RPC 2.0 without I/O (h11's shape): bytes of one line in, typed messages out; results,
errors and events in, encoded lines out.

- ``parse_line`` decodes a line once: envelope checks, the id rule, the method's typed params.
  It never raises: what is wrong becomes an ``Invalid`` item carrying its error.
- ``Connection`` holds the connection state and is the only gate. Two kinds of illegal
  move, as in h11 (its Remote- and LocalProtocolError): the *peer's* request that its state
  does not allow is refused with a ``BridgeError`` (``not_initialized``, ``shutting_down`` or
  ``invalid_request``), answered on the wire; *our own* illegal transition (``closed ->
  ready``, say) raises ``StateError``, a bug in the bridge, never the peer's doing. Which
  methods each state allows and where each method moves it come from the method registry
  (``bridge/core/_methods.py``); which state may follow which is ``CONNECTION_TRANSITIONS``.
- ``error_from`` is the one exception-to-wire boundary: a ``BridgeError`` keeps its code; any
  other exception is our bug, logged with its traceback and answered ``internal_error`` with
  the exception's type name only.

Connection state machine::

    uninitialized -> ready -> shutting_down -> closed
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from bridge.core import _messages as m
from bridge.core._methods import ALLOWED_METHODS, MOVES, PARAMS, ConnectionState
from bridge.errors import BridgeError
from bridge.hosts._json import nesting_ok

log = logging.getLogger("oam_bridge.protocol")

Id = str | int | float | None

# state -> the states it may move to. Closing is idempotent: stdin EOF, a signal and ``exit``
# may each close the connection, in any order.
CONNECTION_TRANSITIONS: Final[dict[ConnectionState, frozenset[ConnectionState]]] = {
    "uninitialized": frozenset({"ready", "closed"}),
    "ready": frozenset({"shutting_down", "closed"}),
    "shutting_down": frozenset({"closed"}),
    "closed": frozenset({"closed"}),
}
# state -> the error any method it does not allow (ALLOWED_METHODS, from the registry) gets,
# whatever its params; in a state not listed (ready), a refused method's params are checked
# first, then it gets invalid_request
_REFUSALS: Final[dict[ConnectionState, tuple[str, str]]] = {
    "uninitialized": ("not_initialized", "send initialize first"),
    "shutting_down": ("shutting_down", "the bridge is shutting down; send exit"),
    "closed": ("shutting_down", "the bridge is shutting down; send exit"),
}


class StateError(RuntimeError):
    """The bridge itself asked the connection for a transition its table does not allow: a bug
    in the bridge (h11's LocalProtocolError), never the peer's doing. Not a ``BridgeError``:
    should it reach the wire, ``error_from`` answers it ``internal_error`` and logs it."""

    def __init__(self, state: ConnectionState, new: ConnectionState) -> None:
        super().__init__(f"connection is {state}; cannot become {new}")
        self.state = state
        self.new = new


@dataclass(slots=True)
class Call:
    """A request (``has_id``) or a notification, with its params decoded to the method's type
    (or the error that decoding met, reported only once the call passes the state gate)."""

    id: Id
    has_id: bool
    method: str
    params: msgspec.Struct | None
    params_error: BridgeError | None = None


@dataclass(slots=True)
class Invalid:
    """A message that is not a valid request; answered with ``error`` when ``has_id``
    (invalid messages without a usable id are answered with id null, as the spec says)."""

    id: Id
    error: BridgeError
    has_id: bool = True


Item = Call | Invalid


@dataclass(slots=True)
class Parsed:
    items: list[Item]
    batch: bool
    size: int  # bytes of the line

    @property
    def calls(self) -> list[Call]:
        return [i for i in self.items if isinstance(i, Call)]


def _whole_floats_as_ints(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _whole_floats_as_ints(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_whole_floats_as_ints(v) for v in obj]
    return obj


def _valid_id(id_: Any) -> bool:
    if id_ is None or isinstance(id_, str):
        return True
    if isinstance(id_, bool):
        return False
    return isinstance(id_, int) or (isinstance(id_, float) and id_.is_integer())


def decode_params(method: str, params: dict[str, Any]) -> msgspec.Struct:
    """``params`` as the method's typed params; raises ``invalid_params``.

    Clients whose JSON has only doubles (Godot, JavaScript) send 2.0 for 2: a whole-number
    float is accepted where an integer goes, and nothing looser."""
    typ = PARAMS[method]
    try:
        return msgspec.convert(params, typ)
    except msgspec.ValidationError as e:
        message = str(e)
    try:
        return msgspec.convert(_whole_floats_as_ints(params), typ)
    except msgspec.ValidationError:
        pass
    # Raised outside the handlers: no exception context whose frames hold ``params``.
    raise BridgeError("invalid_params", message, reason="validation")


def _parse_one(obj: Any) -> Item:
    if not isinstance(obj, dict):
        return Invalid(None, BridgeError("invalid_message", "a message must be a JSON object", reason="not_object"))
    has_id = "id" in obj
    id_ = obj.get("id")
    if has_id and not _valid_id(id_):
        return Invalid(None, BridgeError("invalid_message", "id must be a string, an integer or null", reason="bad_id"))
    if obj.get("jsonrpc") != "2.0":
        return Invalid(id_, BridgeError("invalid_message", 'jsonrpc must be "2.0"', reason="bad_version"))
    method = obj.get("method")
    if not isinstance(method, str):
        return Invalid(id_, BridgeError("invalid_message", "method must be a string", reason="bad_method"))
    params = obj.get("params", {})
    if isinstance(params, list):
        err = BridgeError("invalid_params", "params must be an object (named parameters)", reason="positional_params")
        return Invalid(id_, err, has_id)
    if not isinstance(params, dict):
        return Invalid(id_, BridgeError("invalid_message", "params must be an object", reason="bad_params"))
    if method not in PARAMS:
        return Invalid(id_, BridgeError("method_not_found", f"unknown method {method!r}", method=method), has_id)
    try:
        return Call(id_, has_id, method, decode_params(method, params))
    except BridgeError as e:
        # without its traceback, whose frames hold the decoded params (megabytes, maybe)
        return Call(id_, has_id, method, None, e.with_traceback(None))


def parse_line(line: bytes, max_nesting_depth: int = 100) -> Parsed:
    """One line (a message or a batch) as typed items. Never raises."""
    try:
        msg = msgspec.json.decode(line)
    except RecursionError:
        return Parsed(
            [Invalid(None, BridgeError("invalid_message", "message nested too deeply", reason="too_deep"))],
            False,
            len(line),
        )
    except msgspec.DecodeError as e:
        return Parsed(
            [Invalid(None, BridgeError("parse_error", f"not valid JSON: {e}", reason="parse_error"))], False, len(line)
        )
    # a line with fewer brackets than the depth limit cannot nest that deep: skip the walk
    brackets = line.count(b"[") + line.count(b"{") if len(line) > max_nesting_depth else 0
    if brackets >= max_nesting_depth and not nesting_ok(msg, max_nesting_depth):
        err = BridgeError("invalid_message", f"message nested deeper than {max_nesting_depth}", reason="too_deep")
        return Parsed([Invalid(None, err)], False, len(line))
    if isinstance(msg, list):
        if not msg:
            return Parsed(
                [Invalid(None, BridgeError("invalid_message", "empty batch", reason="empty_batch"))], False, len(line)
            )
        return Parsed([_parse_one(o) for o in msg], True, len(line))
    return Parsed([_parse_one(msg)], False, len(line))


def error_from(exc: BaseException, what: str) -> BridgeError:
    """The one boundary between exceptions and the wire."""
    if isinstance(exc, BridgeError):
        return exc
    log.error("internal error in %s", what, exc_info=exc)
    return BridgeError("internal_error", f"internal error: {type(exc).__name__}")


# ---- encoding ----

_encoder = msgspec.json.Encoder()
# JSON allows these raw inside strings, but readers that split on Unicode line breaks
# (Python's splitlines, some JSON line readers) would cut a line in two.
_LINE_BREAKS: Final = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


def encode_line(obj: Any) -> bytes:
    """One protocol line: compact JSON, Unicode line breaks escaped, ``\\n`` at the end."""
    out = _encoder.encode(obj)
    # Each search costs about as much as the encode itself: a line that is all ASCII (one
    # fast pass) has none of these breaks, and they all begin with one of two byte pairs.
    if not out.isascii() and (b"\xe2\x80" in out or b"\xc2\x85" in out):
        for raw, escaped in _LINE_BREAKS:
            out = out.replace(raw, escaped)
    return out + b"\n"


def response(id_: Id, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def error_response(id_: Id, err: BridgeError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": err.to_wire()}


def event_line(event: m.Event) -> bytes:
    return encode_line({"jsonrpc": "2.0", "method": m.EVENT_NAMES[type(event)], "params": event})


def reply_line(parsed: Parsed, replies: list[dict[str, Any]]) -> bytes | None:
    """The response line for a parsed line's replies: an array for a batch (none for a batch
    of notifications), the one reply otherwise."""
    if not replies:
        return None
    return encode_line(replies if parsed.batch else replies[0])


class Connection:
    """The connection's state and the gate every call passes."""

    def __init__(self) -> None:
        self.state: ConnectionState = "uninitialized"

    def gate(self, call: Call) -> msgspec.Struct:
        """The call's params if the call may run now; raises the ``BridgeError`` to answer
        otherwise (the peer's illegal request)."""
        allowed = call.method in ALLOWED_METHODS[self.state]
        if not allowed and (refusal := _REFUSALS.get(self.state)) is not None:
            raise BridgeError(*refusal)
        if call.params_error is not None:
            raise call.params_error
        if not allowed:
            raise BridgeError("invalid_request", f"{call.method} is not allowed once the connection is {self.state}")
        assert call.params is not None
        return call.params

    def moved_by(self, method: str) -> None:
        """Apply the state change a successful ``method`` makes (``StateError`` if the state
        cannot make it: a call that passed ``gate`` always can)."""
        new = MOVES.get(method)
        if new is not None:
            self.move(new)

    def move(self, new: ConnectionState) -> None:
        """Become ``new``; ``StateError`` if the table does not allow it from here."""
        if new not in CONNECTION_TRANSITIONS[self.state]:
            raise StateError(self.state, new)
        self.state = new
