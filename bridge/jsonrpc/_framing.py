"""Bytes to lines, with a size bound. No I/O: feed bytes in, take lines out."""

from __future__ import annotations

from typing import Final

DEFAULT_MAX_LINE_BYTES: Final = 4 * 1024 * 1024


class LineTooLong:
    """Marker returned in place of a line that exceeded the bound (its bytes were dropped)."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __repr__(self) -> str:
        return f"LineTooLong({self.size})"


class LineFramer:
    """Splits a byte stream at ``\\n``; strips a trailing ``\\r``; skips blank lines.

    A line longer than ``max_line_bytes`` is discarded as it arrives (memory stays bounded)
    and reported once as ``LineTooLong``; reading resynchronises at the next newline.
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._discarding = 0  # bytes dropped of the current oversize line, 0 if none

    def feed(self, data: bytes | bytearray) -> list[bytes | LineTooLong]:
        out: list[bytes | LineTooLong] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._take_partial(data[start:])
                return out
            piece = data[start:nl]
            start = nl + 1
            if self._discarding:
                out.append(LineTooLong(self._discarding + len(piece)))
                self._discarding = 0
                continue
            if len(self._buf) + len(piece) > self.max_line_bytes:
                out.append(LineTooLong(len(self._buf) + len(piece)))
                self._buf.clear()
                continue
            if self._buf:
                self._buf += piece
                line = bytes(self._buf)
                self._buf.clear()
            else:
                line = bytes(piece)
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.strip():
                out.append(line)

    def _take_partial(self, rest: bytes | bytearray) -> None:
        if not rest:
            return
        if self._discarding:
            self._discarding += len(rest)
        elif len(self._buf) + len(rest) > self.max_line_bytes:
            self._discarding = len(self._buf) + len(rest)
            self._buf.clear()
        else:
            self._buf += rest

    def eof(self) -> list[bytes | LineTooLong]:
        """A final line without a newline still counts."""
        if self._discarding:
            size, self._discarding = self._discarding, 0
            return [LineTooLong(size)]
        line = bytes(self._buf).rstrip(b"\r")
        self._buf.clear()
        return [line] if line.strip() else []
