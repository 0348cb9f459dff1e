"""Claiming the process's stdio once, at start-up.

fd 1 is duplicated into a private fd that only the protocol writer uses, then fd 1 is
pointed at stderr: anything that prints (Python, llama.cpp, Swift) lands in the log, never
in the protocol stream. The real stdin is read through a duplicate too.
"""

from __future__ import annotations

import os
import sys

import trio


class ClaimedStdio:
    def __init__(self) -> None:
        self.in_fd = os.dup(0)
        self.out_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr


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


def open_streams(stdio: ClaimedStdio, threads: bool) -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
    if threads or not hasattr(trio.lowlevel, "FdStream"):
        return ThreadReceiveStream(stdio.in_fd), ThreadSendStream(stdio.out_fd)
    return trio.lowlevel.FdStream(stdio.in_fd), trio.lowlevel.FdStream(stdio.out_fd)
