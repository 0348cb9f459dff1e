"""Stable error codes: one table of records (``ERROR_KINDS``), from which every per-code table
is derived. The dispatcher, the hosts and protocol.md all read it; every engine client's own
copy is checked against it by tests/unit/test_error_table.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

# JSON-RPC 2.0's own codes (section 5.1 of the specification).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """Everything keyed by one stable string code.

    ``number``: the JSON-RPC error's ``code`` (application codes lie outside the reserved range
    -32768..-32000). ``retryable``: sent as ``data.retryable``. ``http_status``: the status
    ``oam serve`` answers with (its body carries the string code too). ``exit_status``: the
    ``oam`` command line's exit status. ``meaning``: protocol.md's "meaning" column, word
    for word."""

    code: str
    number: int
    retryable: bool
    http_status: int
    exit_status: int
    meaning: str


# HTTP: 499 is "client closed request" (the client went away). Exit statuses: 0 is success,
# 1 an error with no code of its own, 2 a usage error (argparse's own); 130 is the shell's
# Ctrl-C convention.
ERROR_KINDS: Final[tuple[ErrorKind, ...]] = (
    # code, JSON-RPC number, retryable, HTTP status, exit status, meaning
    ErrorKind("model_unavailable", -31001, False, 503, 3, "the engine or model cannot run here (the reason says why)"),
    ErrorKind("guardrail_violation", -31002, False, 422, 4, "the model's safety guardrails blocked the content"),
    ErrorKind("refusal", -31003, False, 422, 5, "the model refused"),
    ErrorKind("context_size_exceeded", -31004, False, 400, 6, "the prompt does not fit even after trimming"),
    ErrorKind("rate_limited", -31005, True, 429, 7, "the model is rate-limited; back off"),
    ErrorKind("unsupported_language", -31006, False, 422, 8, "language or locale unsupported by the model"),
    ErrorKind(
        "invalid_schema", -31007, False, 400, 9, "a tool's parameters or a turn's schema is not a valid JSON Schema"
    ),
    ErrorKind("tool_failed", -31008, False, 502, 10, "a tool failed in a way the model could not recover from"),
    ErrorKind("cancelled", -31009, False, 499, 130, "the turn was cancelled"),
    ErrorKind("busy", -31010, True, 503, 11, "the NPC's turn queue is full"),
    ErrorKind("invalid_request", -31011, False, 400, 12, "the request is not allowed now (e.g. `initialize` twice)"),
    ErrorKind("generation_failed", -31012, True, 500, 13, "the model failed, or its answer broke the schema"),
    ErrorKind("unknown_npc", -31020, False, 404, 14, "no NPC with that id"),
    ErrorKind(
        "unknown_tool_call", -31021, False, 404, 14, "no pending tool call with that id (unknown or already resolved)"
    ),
    ErrorKind("not_initialized", -31022, False, 409, 1, "send `initialize` first"),
    ErrorKind("overloaded", -31023, True, 503, 11, "too many pending requests; retry later"),
    ErrorKind("message_too_large", -31024, False, 413, 12, "the line exceeds `limits.maxLineBytes`"),
    ErrorKind("npc_exists", -31025, False, 409, 12, "an NPC with that id already exists"),
    ErrorKind("shutting_down", -31026, False, 503, 1, "after `shutdown`, only `exit` is accepted"),
    ErrorKind("limit_reached", -31027, False, 422, 15, "a configured limit is reached (`data.limit`, e.g. `maxNpcs`)"),
    # JSON-RPC's own, with string codes so every error carries data.code
    ErrorKind("parse_error", PARSE_ERROR, False, 400, 12, "the line is not JSON"),
    ErrorKind(
        "invalid_message", INVALID_REQUEST, False, 400, 12, "not a valid JSON-RPC request (`data.reason` says why)"
    ),
    ErrorKind("method_not_found", METHOD_NOT_FOUND, False, 404, 12, "unknown method"),
    ErrorKind("invalid_params", INVALID_PARAMS, False, 400, 12, "params of the wrong shape or type, or unknown fields"),
    ErrorKind(
        "internal_error",
        INTERNAL_ERROR,
        False,
        500,
        1,
        "a bug in the bridge (logged on stderr with its traceback; the message names the exception type only);"
        " also a `turn/failed` code",
    ),
)

# string code -> its record
KINDS: Final[dict[str, ErrorKind]] = {k.code: k for k in ERROR_KINDS}

# Derived views, in the table's order. ERROR_CODES's shape (code -> (number, retryable)) is the
# one every engine client's copy mirrors: keep it.
ERROR_CODES: Final[dict[str, tuple[int, bool]]] = {k.code: (k.number, k.retryable) for k in ERROR_KINDS}
HTTP_STATUS: Final[dict[str, int]] = {k.code: k.http_status for k in ERROR_KINDS}
EXIT_CODES: Final[dict[str, int]] = {k.code: k.exit_status for k in ERROR_KINDS}


class BridgeError(Exception):
    """A failure with a stable string code; the dispatcher turns it into a JSON-RPC error."""

    def __init__(self, code: str, message: str, **data: Any) -> None:
        kind = KINDS.get(code)
        if kind is None:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.kind = kind
        self.message = message
        self.data = data

    @property
    def rpc_code(self) -> int:
        return self.kind.number

    @property
    def http_status(self) -> int:
        return self.kind.http_status

    @property
    def exit_code(self) -> int:
        return self.kind.exit_status

    @property
    def retryable(self) -> bool:
        return self.kind.retryable

    def to_wire(self) -> dict[str, Any]:
        return {
            "code": self.rpc_code,
            "message": self.message,
            "data": {"code": self.code, "retryable": self.retryable, **self.data},
        }

    def to_event(self) -> dict[str, Any]:
        """For ``turn/failed``: code, message, retryable, and ``data`` when the error carries
        figures a game acts on (``EVENT_DATA``: when to retry, how big the prompt was)."""
        out: dict[str, Any] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        data = {k: self.data[k] for k in EVENT_DATA if isinstance(self.data.get(k), int)}
        if data:
            out["data"] = data
        return out


# ``data`` fields ``turn/failed`` passes on (integers): ``retryAfterMs`` (rate_limited: the
# engine said when to try again), ``promptTokens`` and ``contextSize`` (context_size_exceeded).
EVENT_DATA = ("retryAfterMs", "promptTokens", "contextSize")
