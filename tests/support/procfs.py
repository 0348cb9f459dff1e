"""A process measured from ``/proc``: its CPU time, its resident memory, and when it has
gone idle (blocked, e.g. on a full stdout)."""

from __future__ import annotations

import trio


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def wait_idle(pid: int, quiet: float = 0.3, limit: float = 6.0) -> None:
    """Return once the process has used no CPU for ``quiet`` seconds: it is blocked (on a
    full stdout, here). Gives up silently after ``limit`` seconds."""
    with trio.move_on_after(limit):
        last, since = cpu_ticks(pid), trio.current_time()
        while trio.current_time() - since < quiet:
            await trio.sleep(0.05)
            now = cpu_ticks(pid)
            if now != last:
                last, since = now, trio.current_time()
