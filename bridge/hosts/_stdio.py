"""Claiming the process's stdio once, at start-up.

fd 1 is duplicated into a private fd that only the protocol writer uses, then fd 1 is
pointed at stderr: anything that prints (Python, llama.cpp, Swift) lands in the log, never
in the protocol stream. The real stdin is read through a duplicate too.
"""

from __future__ import annotations

import errno
import os
import sys
import time

import trio


class ClaimedStdio:
    def __init__(self) -> None:
        self.in_fd = os.dup(0)
        self.out_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr


_POLL_SLICE_S = 20e-6  # at most this long between scheduler passes while polling


class PollingFdStream(trio.abc.ReceiveStream):
    """Reads a non-blocking fd like ``trio.lowlevel.FdStream``, but for ``poll_s`` after
    data last arrived it polls the fd between scheduler passes before sleeping in epoll.

    A request that comes soon after the last one (a game's burst, a pipelining client) is
    read at once instead of after an epoll wake-up, which costs tens of microseconds when the
    kernel wakes the bridge on another core. Idle, it sleeps in epoll as before; the poll is
    bounded by the window, and other tasks run at every pass."""

    def __init__(self, fd: int, poll_s: float) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._poll_s = poll_s
        self._last = -poll_s
        self._reads = 0

    def fileno(self) -> int:
        return self._fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._fd < 0:
            raise trio.ClosedResourceError
        # A full scheduler pass costs more than handling a request: take one every few reads
        # (and whenever we wait), and otherwise only honour cancellation.
        self._reads += 1
        if self._reads % 8 == 0:
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        yielded = time.perf_counter()
        while True:
            try:
                data = os.read(self._fd, max_bytes or 65536)
            except BlockingIOError:
                now = time.perf_counter()
                if now - self._last >= self._poll_s:
                    await trio.lowlevel.wait_readable(self._fd)
                elif now - yielded >= _POLL_SLICE_S:  # let the other tasks run, then poll on
                    await trio.lowlevel.checkpoint()
                    yielded = time.perf_counter()
                continue
            except OSError as exc:
                if exc.errno == errno.EBADF or self._fd < 0:
                    raise trio.ClosedResourceError from None
                raise trio.BrokenResourceError from exc
            self._last = time.perf_counter()
            return data

    async def aclose(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
        await trio.lowlevel.checkpoint()


class ThreadReceiveStream(trio.abc.ReceiveStream):
    """Reads an fd in a worker thread: the path for platforms without ``FdStream``
    (Windows). The blocked read is abandoned on cancel; the fd is closed once."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await trio.to_thread.run_sync(os.read, self._fd, max_bytes or 65536, abandon_on_cancel=True)

    async def aclose(self) -> None:
        pass


class ThreadSendStream(trio.abc.SendStream):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        def write_all() -> None:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]

        try:
            await trio.to_thread.run_sync(write_all)
        except BrokenPipeError:
            raise trio.BrokenResourceError from None

    async def wait_send_all_might_not_block(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def open_streams(
    stdio: ClaimedStdio, threads: bool, poll_us: int = 0
) -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
    if threads or not hasattr(trio.lowlevel, "FdStream"):
        return ThreadReceiveStream(stdio.in_fd), ThreadSendStream(stdio.out_fd)
    recv: trio.abc.ReceiveStream
    if poll_us > 0:
        recv = PollingFdStream(stdio.in_fd, poll_us / 1e6)
    else:
        recv = trio.lowlevel.FdStream(stdio.in_fd)
    return recv, trio.lowlevel.FdStream(stdio.out_fd)
