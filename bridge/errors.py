"""Stable error codes: one table, used by the dispatcher and documented in protocol.md."""

from __future__ import annotations

from typing import Any, Final

# JSON-RPC 2.0's own codes (section 5.1 of the specification).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

# string code -> (JSON-RPC error code, retryable). Application codes lie outside the
# reserved range -32768..-32000.
ERROR_CODES: dict[str, tuple[int, bool]] = {
    "model_unavailable": (-31001, False),
    "guardrail_violation": (-31002, False),
    "refusal": (-31003, False),
    "context_size_exceeded": (-31004, False),
    "rate_limited": (-31005, True),
    "unsupported_language": (-31006, False),
    "invalid_schema": (-31007, False),
    "tool_failed": (-31008, False),
    "cancelled": (-31009, False),
    "busy": (-31010, True),
    "invalid_request": (-31011, False),
    "generation_failed": (-31012, True),
    "unknown_npc": (-31020, False),
    "unknown_tool_call": (-31021, False),
    "not_initialized": (-31022, False),
    "overloaded": (-31023, True),
    "message_too_large": (-31024, False),
    "npc_exists": (-31025, False),
    "shutting_down": (-31026, False),
    "limit_reached": (-31027, False),
    # JSON-RPC's own, with string codes so every error carries data.code
    "parse_error": (PARSE_ERROR, False),
    "invalid_message": (INVALID_REQUEST, False),
    "method_not_found": (METHOD_NOT_FOUND, False),
    "invalid_params": (INVALID_PARAMS, False),
    "internal_error": (INTERNAL_ERROR, False),
}

# string code -> HTTP status, for the OpenAI-compatible server (``oam serve``): the body
# carries the string code too. 499 is "client closed request" (the client went away).
HTTP_STATUS: dict[str, int] = {
    "model_unavailable": 503,
    "guardrail_violation": 422,
    "refusal": 422,
    "context_size_exceeded": 400,
    "rate_limited": 429,
    "unsupported_language": 422,
    "invalid_schema": 400,
    "tool_failed": 502,
    "cancelled": 499,
    "busy": 503,
    "invalid_request": 400,
    "generation_failed": 500,
    "unknown_npc": 404,
    "unknown_tool_call": 404,
    "not_initialized": 409,
    "overloaded": 503,
    "message_too_large": 413,
    "npc_exists": 409,
    "shutting_down": 503,
    "limit_reached": 422,
    "parse_error": 400,
    "invalid_message": 400,
    "method_not_found": 404,
    "invalid_params": 400,
    "internal_error": 500,
}

# string code -> exit status of the ``oam`` command line. 0 is success, 1 an error with no
# code, 2 a usage error (argparse's own); 130 is the shell's Ctrl-C convention.
EXIT_CODES: dict[str, int] = {
    "model_unavailable": 3,
    "guardrail_violation": 4,
    "refusal": 5,
    "context_size_exceeded": 6,
    "rate_limited": 7,
    "unsupported_language": 8,
    "invalid_schema": 9,
    "tool_failed": 10,
    "cancelled": 130,
    "busy": 11,
    "invalid_request": 12,
    "generation_failed": 13,
    "unknown_npc": 14,
    "unknown_tool_call": 14,
    "not_initialized": 1,
    "overloaded": 11,
    "message_too_large": 12,
    "npc_exists": 12,
    "shutting_down": 1,
    "limit_reached": 15,
    "parse_error": 12,
    "invalid_message": 12,
    "method_not_found": 12,
    "invalid_params": 12,
    "internal_error": 1,
}


class BridgeError(Exception):
    """A failure with a stable string code; the dispatcher turns it into a JSON-RPC error."""

    def __init__(self, code: str, message: str, **data: Any) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @property
    def rpc_code(self) -> int:
        return ERROR_CODES[self.code][0]

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.code]

    @property
    def retryable(self) -> bool:
        return ERROR_CODES[self.code][1]

    def to_wire(self) -> dict[str, Any]:
        return {
            "code": self.rpc_code,
            "message": self.message,
            "data": {"code": self.code, "retryable": self.retryable, **self.data},
        }

    def to_event(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}
