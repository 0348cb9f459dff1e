"""Bridge CPU per turn by history length, through the real ``oam-bridge`` subprocess.

For each length (0, 100, 1,000, 10,000 turns) NPCs are restored (``npc/restore``) from a
synthetic save of that many turns on the scripted engine, then play turns; the bridge's
CPU time (utime + stime from ``/proc/PID/stat``) over a batch of turns, divided by the
turns, is one sample. Before every batch the NPCs are restored again, so the history stays
at its length (a batch adds 20 turns per NPC). Printed: the median of the batches, beside
the length-0 figure measured in the same run, as a ratio (goal: within 2x). Long histories
do not fit the scripted engine's 4,096-token window: those turns also trim.

Usage::

    python bench/bench_history.py
    python bench/bench_history.py --lengths 0,100,1000 --batches 3 --root OTHER_CHECKOUT

A batch that takes longer than ``--max-seconds`` (default 60) stops the run for that length
and the longer ones (the report shows ``>``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def save(npc_id: str, turns: int) -> dict[str, Any]:
    return {
        "version": 1,
        "config": {"npcId": npc_id, "instructions": "You are Greta, the tavern keeper. Be brief."},
        "turns": [
            [
                {"role": "user", "content": f"Good evening, Greta. What news on day {i}?"},
                {"role": "assistant", "content": f"Quiet, traveller. Day {i} brought rain and two merchants."},
            ]
            for i in range(turns)
        ],
    }


class Bridge:
    def __init__(self, root: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        }
        self.p = subprocess.Popen(
            [sys.executable, "-m", "bridge", "--engine", "scripted"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=root,
            env=env,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ids = 0

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, msgs: list[dict[str, Any]]) -> list[int]:
        assert self.p.stdin is not None
        ids = []
        for m in msgs:
            self.ids += 1
            m["id"] = self.ids
            ids.append(self.ids)
        self.p.stdin.write(b"".join(json.dumps({"jsonrpc": "2.0", **m}).encode() + b"\n" for m in msgs))
        self.p.stdin.flush()
        return ids

    def wait(self, ids: list[int], terminals: int, deadline: float) -> dict[int, Any]:
        """Read until every id has its response and ``terminals`` turns have ended."""
        results: dict[int, Any] = {}
        ended = 0
        while len(results) < len(ids) or ended < terminals:
            line = self.lines.get(timeout=max(0.001, deadline - time.perf_counter()))
            if not line:
                raise EOFError("the bridge closed stdout")
            msg = json.loads(line)
            if "method" in msg:
                if msg["method"] in ("turn/completed", "turn/failed"):
                    ended += 1
                    if msg["method"] == "turn/failed":
                        raise RuntimeError(f"turn failed: {msg['params']['error']}")
            elif msg.get("id") in ids:
                if "error" in msg:
                    raise RuntimeError(f"request {msg['id']} failed: {msg['error']}")
                results[msg["id"]] = msg["result"]
        return results

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def measure(b: Bridge, length: int, npcs: int, rounds: int, batches: int, max_s: float) -> list[float]:
    """CPU milliseconds per turn, one figure per batch."""
    names = [f"h{length}_{i}" for i in range(npcs)]
    out = []
    for _ in range(batches + 1):  # the first batch warms up
        deadline = time.perf_counter() + max_s
        ids = b.send([{"method": "npc/restore", "params": {"save": save(n, length)}} for n in names])
        b.wait(ids, 0, deadline)
        before = cpu_s(b.p.pid)
        deadline = time.perf_counter() + max_s
        for r in range(rounds):
            ids = b.send(
                [{"method": "npc/respond", "params": {"npcId": n, "prompt": f"And today, round {r}?"}} for n in names]
            )
            b.wait(ids, len(names), deadline)
        out.append((cpu_s(b.p.pid) - before) / (rounds * npcs) * 1000)
    return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="0,100,1000,10000")
    ap.add_argument("--npcs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20, help="turns per NPC per batch")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=60)
    ap.add_argument(
        "--root", default=ROOT, help="source tree whose bridge package is started (default: this repository)"
    )
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    b = Bridge(os.path.abspath(args.root))
    b.wait(b.send([{"method": "initialize", "params": {"protocolVersion": 1}}]), 0, time.perf_counter() + 30)
    print(
        f"bridge CPU per turn (median of {args.batches} batches of {args.rounds * args.npcs} turns; {args.npcs} NPCs; "
        "scripted engine)"
    )
    print(f"{'history':>10}  {'CPU/turn':>10}  {'vs 0':>7}  {'batches (ms)':s}")
    base: float | None = None
    for length in lengths:
        try:
            samples = measure(b, length, args.npcs, args.rounds, args.batches, args.max_seconds)
        except (queue.Empty, EOFError, RuntimeError) as e:
            why = f"> {args.max_seconds:.0f} s per batch" if isinstance(e, queue.Empty) else str(e)
            print(f"{length:>10,}  {'-':>10}  {'-':>7}  stopped: {why}")
            break
        med = statistics.median(samples)
        if base is None:
            base = med
        ratio = med / base if base else float("nan")
        goal = "" if length == lengths[0] else ("  within 2x" if ratio <= 2 else "  OVER 2x")
        print(
            f"{length:>10,}  {med:>7.3f} ms  {ratio:>6.2f}x  {', '.join(f'{x:.3f}' for x in samples)}{goal}   "
            f"RSS {rss_mib(b.p.pid):.0f} MiB",
            flush=True,
        )
    b.close()


if __name__ == "__main__":
    main()
