"""The game's frame while NPCs talk (issue 33): a synthetic game loop in its own process works
a fixed amount (about 8 ms on a quiet core) in every 16.7 ms frame on one thread and records
how long each frame's work took, while the bridge serves 1, 4 and 8 NPCs talking; beside the
same loop with nothing else running, and beside llama-server ``-np N -cb`` with its default
threads, in the same run.

The loop's work is calibrated once, alone, before anything starts, and is the same in every
run: a frame whose work took longer lost its core to something else, which a game sees as a
hitch. Per side and N it prints the p50 and p99 of the frames' work time (the game's "frame
time" before it waits for the next frame), the p99 of the frame interval (16.7 ms unless a
frame overran), and for the NPCs the aggregate tokens/s and worst first word (medians over
rounds; each round is N NPCs asking at once, ``bench_batch.py``'s round, llama-server asked
for as many tokens per NPC as the bridge generated, ``--ignore-eos``).

Sides: ``alone`` (the loop, nothing else), ``bridge`` (``oam-bridge --engine llama`` at its
default threads: the usable cores but one), ``llama-server`` (``-np N -cb`` and nothing about
threads: its defaults, ``-t`` the cores and ``-tb`` the same). The order of the bridge and
llama-server alternates with N. llama-server is built once, as for ``bench_batch.py``.

Usage::

    python bench/bench_frame.py                  # N = 1, 4, 8; 3 rounds each
    python bench/bench_frame.py --n 8 --rounds 5
    python bench/bench_frame.py --bridge-args "--llama-threads 2"   # the bridge on every core
    python bench/bench_frame.py --no-server      # the loop alone and the bridge

Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics as st
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_batch as bb  # noqa: E402

PY = sys.executable
FRAME_S = 1 / 60


# -- the game loop (its own process: python bench/bench_frame.py --loop UNITS) ----------------


def work(units: int) -> int:
    """The frame's work: a fixed amount of pure-Python arithmetic on one thread."""
    x = 0
    for i in range(units):
        x = (x + i * i) % 1000003
    return x


def loop_main(units: int) -> None:
    """Frames until stdin closes, then one JSON line on stdout: per frame its start
    (``time.perf_counter``: CLOCK_MONOTONIC, the same clock as the parent's) and its work's
    seconds."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    frames: list[tuple[float, float]] = []
    due = time.perf_counter()
    while not stop.is_set():
        t0 = time.perf_counter()
        work(units)
        frames.append((t0, time.perf_counter() - t0))
        due += FRAME_S
        late = time.perf_counter() - due
        if late > 0:
            due = time.perf_counter()  # a frame that overran: the next starts now, as a game's would
        else:
            time.sleep(-late)
    sys.stdout.write(json.dumps(frames) + "\n")


def calibrate(target_s: float) -> int:
    """Units of ``work`` that take ``target_s`` on this machine now (median of 15 tries)."""
    units = 20000
    for _ in range(20):
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            work(units)
            times.append(time.perf_counter() - t0)
        took = st.median(times)
        if abs(took - target_s) / target_s < 0.02:
            break
        units = max(1000, int(units * target_s / took))
    return units


class Loop:
    """The game loop's process."""

    def __init__(self, units: int) -> None:
        self.p = subprocess.Popen(
            [PY, os.path.abspath(__file__), "--loop", str(units)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> list[tuple[float, float]]:
        out, _ = self.p.communicate(timeout=60)
        return [tuple(f) for f in json.loads(out)]  # type: ignore[misc]


# -- sides -------------------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    work: list[float] = field(default_factory=list)  # seconds, per frame in the window
    interval: list[float] = field(default_factory=list)
    rounds: list[bb.Round] = field(default_factory=list)

    def add_frames(self, frames: list[tuple[float, float]], t0: float, t1: float) -> None:
        inside = [f for f in frames if t0 <= f[0] <= t1]
        self.work += [w for _, w in inside]
        self.interval += [b[0] - a[0] for a, b in zip(inside, inside[1:], strict=False)]


def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loop", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--n", default="1,4,8", help="NPC counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of N NPCs asking at once, per side and N")
    ap.add_argument("--tokens", type=int, default=64, help="maxTokens per NPC")
    ap.add_argument("--ctx", type=int, default=2048, help="context per NPC (the bridge's --llama-ctx is N times it)")
    ap.add_argument("--work-ms", type=float, default=8.0, help="the loop's work per frame, calibrated alone")
    ap.add_argument("--alone-s", type=float, default=15.0, help="seconds of the loop alone, per N")
    ap.add_argument("--bridge-args", default="", help="more arguments for the bridge (e.g. --llama-threads 2)")
    ap.add_argument("--no-server", action="store_true", help="leave llama-server out")
    ap.add_argument("--bridge-nice", type=int, default=0, help="start the bridge under nice -n N (0: as is)")
    args = ap.parse_args()
    if args.loop is not None:
        loop_main(args.loop)
        return
    ns = [int(x) for x in args.n.split(",")]
    from bridge.engines.llama import default_model_path
    from bridge.engines.llama._engine import default_threads, usable_cores

    model = default_model_path()
    binary, version = (None, None) if args.no_server else bb.llama_server_binary()
    units = calibrate(args.work_ms / 1000)
    print(
        f"{usable_cores()} usable cores; bridge: oam-bridge --engine llama {args.bridge_args or ''}"
        f"(default threads {default_threads()}); "
        + ("" if args.no_server else f"llama-server from llama-cpp-python {version}'s llama.cpp, default threads; ")
        + f"loop: {units} units of work a frame (~{args.work_ms:g} ms alone), 60 frames/s; "
        f"{args.rounds} rounds of N NPCs asking at once, maxTokens {args.tokens}, greedy",
        flush=True,
    )
    bridge_argv = ["--engine", "llama", "--llama-ctx", str(args.ctx * max(ns)), *shlex.split(args.bridge_args)]
    launcher = ["nice", "-n", str(args.bridge_nice), PY, "-m", "bridge"] if args.bridge_nice else None
    bridge = bb.Bridge(bridge_argv, launcher=launcher)
    bridge.warm("llama")
    status = next(e for e in bridge.call("engine/status", {})["engines"] if e["name"] == "llama")
    print(f"bridge threads {status.get('threads')}, batch threads {status.get('batchThreads')}", flush=True)
    rnd = 0
    try:
        for k, n in enumerate(ns):
            alone = Result("loop alone")
            loop = Loop(units)
            time.sleep(1)
            t0 = time.perf_counter()
            time.sleep(args.alone_s)
            alone.add_frames(loop.stop(), t0, time.perf_counter())
            if args.no_server:
                results = [alone, bridge_side(bridge, units, n, args, rnd)]
            elif k % 2 == 0:
                ours = bridge_side(bridge, units, n, args, rnd)
                theirs = server_side(binary or "", model, units, n, args, rnd, ours)
                results = [alone, ours, theirs]
            else:  # llama-server first: its NPCs ask for maxTokens (no bridge round to match yet)
                theirs = server_side(binary or "", model, units, n, args, rnd, None)
                results = [alone, bridge_side(bridge, units, n, args, rnd), theirs]
            rnd += 2 * args.rounds
            report(n, results)
    finally:
        bridge.close()


def bridge_side(bridge: bb.Bridge, units: int, n: int, args: argparse.Namespace, rnd: int) -> Result:
    """The loop beside the bridge serving ``args.rounds`` rounds of N NPCs."""
    res = Result("bridge, default threads")
    loop = Loop(units)
    time.sleep(1)
    t0 = time.perf_counter()
    for i in range(args.rounds):
        res.rounds.append(bridge.round("llama", rnd + i + 1, [args.tokens] * n))
    res.add_frames(loop.stop(), t0, time.perf_counter())
    return res


def server_side(
    binary: str, model: str, units: int, n: int, args: argparse.Namespace, rnd: int, bridge: Result | None
) -> Result:
    """The loop beside llama-server (its defaults) serving the same rounds: each NPC asked
    for the tokens it generated through the bridge (``bridge``), else ``args.tokens``."""
    res = Result("llama-server -np N, defaults")
    server = bb.LlamaServer(binary, model, n, args.ctx, None, None)  # its default threads
    try:
        trio.run(bb.server_warm, server)
        loop = Loop(units)
        time.sleep(1)
        t0 = time.perf_counter()
        for i in range(args.rounds):
            want = [max(1, t) for t in bridge.rounds[i].tokens] if bridge else [args.tokens] * n
            # other round numbers than the bridge's: no prompt is in llama-server's slots already
            res.rounds.append(trio.run(bb.server_round, server, rnd + args.rounds + i + 1, want))
        res.add_frames(loop.stop(), t0, time.perf_counter())
    finally:
        server.close()
    return res


def report(n: int, results: list[Result]) -> None:
    base = results[0]
    p99_alone = bb.pct(base.work, 0.99)
    print(f"\nN = {n} NPCs talking (frame work: ms; ratio: p99 against the loop alone)")
    print(
        f"{'side':<30}{'frames':>7}{'work p50':>10}{'work p99':>10}{'ratio':>7}{'interval p99':>14}"
        f"{'NPC tok/s':>11}{'worst 1st word s':>18}"
    )
    for r in results:
        tok = f"{st.median(x.tok_s for x in r.rounds):.1f}" if r.rounds else "-"
        first = f"{st.median(max(x.ttft) for x in r.rounds):.2f}" if r.rounds else "-"
        print(
            f"{r.label:<30}{len(r.work):>7}{ms(st.median(r.work)):>10}{ms(bb.pct(r.work, 0.99)):>10}"
            f"{bb.pct(r.work, 0.99) / p99_alone:>7.2f}{ms(bb.pct(r.interval, 0.99)):>14}{tok:>11}{first:>18}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
