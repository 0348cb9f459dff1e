"""What ``--record`` costs, beside the same bridge without it, in the same run.

1. Events per second of one long streamed scripted turn (``bench_protocol.py``'s measure),
   turns of the two bridges alternating, 5 each.
   The bridge's CPU time per event beside it: on a shared, loaded machine the rate is noisy,
   what the recording thread adds to the process's work is not.
2. Round trip of a trivial request (``npc/list``), p50, the two bridges alternating in blocks.

Usage: python bench/bench_record.py [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_protocol import bridge, pct, stream_rate  # noqa: E402


def cpu_s(pid: int) -> float:
    """User and system seconds of a process, all threads (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    quick = "--quick" in sys.argv
    words = 20_000 if quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "session.jsonl")
        peers = {"plain": bridge(), "--record": bridge("--record", path)}
        rates: dict[str, list[float]] = {k: [] for k in peers}
        cpu: dict[str, list[float]] = {k: [] for k in peers}
        for k in range(5):
            for label, b in peers.items():
                before = cpu_s(b.p.pid)
                rates[label].append(stream_rate(b, f"bard{k}", words))
                cpu[label].append((cpu_s(b.p.pid) - before) / words * 1e6)
        rtt: dict[str, list[float]] = {k: [] for k in peers}
        for _ in range(10):
            for label, b in peers.items():
                for _ in range(100 if quick else 300):
                    t = time.perf_counter()
                    b.call("npc/list")
                    rtt[label].append((time.perf_counter() - t) * 1e6)
        for b in peers.values():
            b.close()
        size = os.path.getsize(path)
    print(f"events per second, one streamed turn of {words} deltas (fullText false), 5 turns each, interleaved")
    med = {label: statistics.median(xs) for label, xs in rates.items()}
    for label, xs in rates.items():
        print(f"  {label:9s} median {med[label]:9,.0f}   range {min(xs):,.0f}-{max(xs):,.0f}")
    print(f"  --record / plain: {med['--record'] / med['plain']:.2f}x   (recording: {size / 1e6:.1f} MB)")
    print("the bridge's CPU time (user + system, all its threads) per event, microseconds")
    for label, xs in cpu.items():
        print(f"  {label:9s} median {statistics.median(xs):6.2f}   range {min(xs):.2f}-{max(xs):.2f}")
    print(f"  --record / plain: {statistics.median(cpu['--record']) / statistics.median(cpu['plain']):.2f}x")
    print("round trip of npc/list, microseconds, interleaved blocks")
    for label, xs in rtt.items():
        print(f"  {label:9s} p50 {pct(xs, 0.5):7.1f}   p99 {pct(xs, 0.99):7.1f}")
    print(f"  --record / plain p50: {pct(rtt['--record'], 0.5) / pct(rtt['plain'], 0.5):.2f}x")


if __name__ == "__main__":
    main()
