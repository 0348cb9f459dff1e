"""The bridge's log on stderr: one line per record, whatever a message carries.

A message or its arguments may hold text the bridge did not write (a model path, an NPC id, an
engine's error): a newline in it would start a line of its own that reads as another record
(``oam-bridge ERROR ...``). The formatter escapes control characters in the message as
``\\n``, ``\\r``, ``\\t``, ``\\xNN`` or ``\\uNNNN`` (C0, DEL, C1, and the Unicode line and paragraph
separators), and indents every line of a traceback, so each record's first line is the only
one that starts with ``oam-bridge``.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

FORMAT = "oam-bridge %(levelname)s %(name)s: %(message)s"
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_controls(text: str) -> str:
    """``text`` with its control characters escaped: one line, however it came."""
    return _CONTROLS.sub(_escape, text)


def _indented(text: str) -> str:
    return "\n".join("    " + escape_controls(line) for line in text.split("\n"))


class EscapingFormatter(logging.Formatter):
    """Messages escaped (``escape_controls``), tracebacks and stacks indented line by line."""

    def format(self, record: logging.LogRecord) -> str:
        cached = record.exc_text  # another handler's traceback text, not indented: not ours
        record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _indented(super().formatStack(stack_info))


def configure(level: str, program: str = "oam-bridge") -> None:
    """Log records at ``level`` and above to stderr, one escaped line each (and a traceback's
    indented lines), each opening with ``program`` (``oam-bridge``, ``oam``, ``oam serve``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter(FORMAT.replace("oam-bridge", program, 1)))
    logging.basicConfig(level=level.upper(), handlers=[handler])


__all__ = ["EscapingFormatter", "configure", "escape_controls"]
