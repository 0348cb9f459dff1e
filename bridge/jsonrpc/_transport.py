"""Moving bytes: the one writer of the protocol stream, and the bounded queue between
reading and processing. No protocol knowledge beyond "a line".

The ``Writer`` is the only owner of the output: every line, response or event, goes through
``put``, and bytes reach the stream strictly in ``put`` order. A response is written at once
when nothing is queued or being written (saving a task switch on a request's round trip); a
partial write queues the rest, and nothing is written directly again until the writer task
has sent it. Events are always queued (``direct=False``): the events of one scheduler pass
(a streamed turn's chunks, many NPCs streaming) then leave in one write instead of one
system call each.
"""

from __future__ import annotations

import errno
import logging
import os
import select
from collections import deque
from collections.abc import Callable

import trio

log = logging.getLogger("oam_bridge.transport")


class Writer:
    """Lines out, in order, bounded in bytes.

    ``max_bytes`` bounds what is queued or being written: ``wait_room`` waits while it is
    reached (a game that stops reading slows the turns down). ``put`` never waits: callers that
    must not block (a terminal event in shielded code) may pass the bound; they are few and
    small. After ``close`` the writer sends what is queued, then ends; ``abandon`` drops it.

    ``tap``, if given, is shown the bytes as they are written (whole lines, many per call, in
    order: the session recording); it must not block. A line written in part is shown once,
    whole."""

    def __init__(
        self,
        send: trio.abc.SendStream,
        max_bytes: int,
        fd: int | None = None,
        tap: Callable[[bytes], None] | None = None,
    ) -> None:
        self._send = send
        self._fd = fd  # a non-blocking fd behind ``send``, for direct writes
        self._tap = tap
        self._tapped = 0  # bytes at the head of ``_chunks`` that ``tap`` has already seen
        self.max_bytes = max_bytes
        self._chunks: deque[bytes] = deque()
        self._queued = 0  # bytes queued or being written
        self._busy = False  # the writer task holds bytes it has not finished writing
        self._wakeup = trio.Event()
        self._room = trio.Event()
        self._room.set()
        self._closed = False
        self.broken = False  # the peer closed its end
        self.dropped_bytes = 0
        self.drained = trio.Event()  # the writer task has ended

    @property
    def queued_bytes(self) -> int:
        return self._queued

    def has_room(self) -> bool:
        return self._queued < self.max_bytes

    async def wait_room(self) -> None:
        while self._queued >= self.max_bytes and not self.broken and not self._closed:
            if self._room.is_set():
                self._room = trio.Event()
            await self._room.wait()

    def put(self, line: bytes, direct: bool = True) -> None:
        """Queue ``line``; with ``direct``, write it at once if nothing is ahead of it."""
        if self._closed or self.broken:
            self.dropped_bytes += len(line)
            return
        if direct and self._fd is not None and not self._chunks and not self._busy:
            if self._tap is not None:
                self._tap(line)
            try:
                n = os.write(self._fd, line)
            except BlockingIOError:
                n = 0
            except OSError as e:
                if e.errno in (errno.EPIPE, errno.EBADF, errno.ECONNRESET):
                    self._peer_gone()
                    self.dropped_bytes += len(line)
                    return
                raise
            if n == len(line):
                return
            line = line[n:]
            if self._tap is not None:
                self._tapped = len(line)
        self._chunks.append(line)
        self._queued += len(line)
        if self._queued >= self.max_bytes:
            self._room = trio.Event() if self._room.is_set() else self._room
        self._wakeup.set()

    def close(self) -> None:
        """No more lines: the writer ends once what is queued is written."""
        self._closed = True
        self._wakeup.set()

    def abandon(self) -> int:
        """Drop what is still queued; returns the bytes dropped."""
        dropped = self._queued  # queued, and any write in progress, which is cancelled next
        self._chunks.clear()
        self._tapped = 0
        self.dropped_bytes += dropped
        self._closed = True
        self._wakeup.set()
        return dropped

    def _peer_gone(self) -> None:
        if not self.broken:
            log.warning("protocol output closed by the peer")
        self.broken = True
        self._room.set()
        self._wakeup.set()  # the writer task ends: nothing it holds can be written

    async def watch_peer(self, every_s: float) -> None:
        """Notice the peer closing its end while nothing is being written (an idle bridge
        would otherwise learn it at its next write, maybe never): every ``every_s``, poll the
        fd for an error or a hang-up (a pipe whose reader closed reports ``POLLERR``). Only
        with an fd, where ``poll`` exists (not on Windows)."""
        if self._fd is None or not hasattr(select, "poll"):
            return
        poller = select.poll()
        poller.register(self._fd, 0)  # no events asked: POLLERR, POLLHUP and POLLNVAL come anyway
        while not self.broken and not self.drained.is_set():
            if poller.poll(0):
                self._peer_gone()
                return
            await trio.sleep(every_s)

    async def run(self) -> None:
        """The writer task: sends queued bytes, many lines per write. Ends once closed and
        written, or when the peer is gone."""
        try:
            while True:
                while not self._chunks:
                    if self._closed or self.broken:
                        return
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                data = b"".join(self._chunks)
                self._chunks.clear()
                if self._tap is not None:
                    fresh, self._tapped = data[self._tapped :] if self._tapped else data, 0
                    if fresh:
                        self._tap(fresh)
                self._busy = True
                try:
                    await self._send.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._peer_gone()
                    self.dropped_bytes += len(data)
                    return
                finally:
                    self._busy = False
                    self._queued -= len(data)
                    if self._queued < self.max_bytes:
                        self._room.set()
        finally:
            self._room.set()
            self.drained.set()


class PendingLines:
    """Lines read but not processed yet, bounded in count and bytes.

    ``soft_full``: past ``max_lines`` or ``max_bytes`` new requests are answered ``overloaded``
    (notifications are still kept: they may change state). ``hard_full``: at twice the byte
    bound the reader stops reading until the processor catches up (backpressure on the game's
    pipe), so even a flood of notifications keeps memory bounded without losing one."""

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._items: deque[tuple[object, int]] = deque()
        self._bytes = 0
        self._nonempty = trio.Event()
        self._below_hard = trio.Event()
        self._below_hard.set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def soft_full(self) -> bool:
        return len(self._items) >= self.max_lines or self._bytes >= self.max_bytes

    def hard_full(self) -> bool:
        return self._bytes >= 2 * self.max_bytes

    def put(self, item: object, size: int) -> None:
        self._items.append((item, size))
        self._bytes += size
        if self.hard_full():
            self._below_hard = trio.Event() if self._below_hard.is_set() else self._below_hard
        self._nonempty.set()

    def close(self) -> None:
        self._closed = True
        self._nonempty.set()

    def drain(self) -> list[object]:
        """Every item still queued, taken out (the bridge leaves before processing them)."""
        items = [item for item, _ in self._items]
        self._items.clear()
        self._bytes = 0
        self._below_hard.set()
        return items

    async def wait_below_hard(self) -> None:
        while self.hard_full():
            if self._below_hard.is_set():
                self._below_hard = trio.Event()
            await self._below_hard.wait()

    async def get(self) -> object | None:
        """The next item; ``None`` once closed and empty."""
        while not self._items:
            if self._closed:
                return None
            self._nonempty = trio.Event()
            await self._nonempty.wait()
        item, size = self._items.popleft()
        self._bytes -= size
        if not self.hard_full():
            self._below_hard.set()
        return item
