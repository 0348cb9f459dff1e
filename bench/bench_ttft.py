"""The worst first word of N NPCs asking at once (issue 12), the bridge against llama-server,
round by round with the order alternated, and where the bridge's time goes.

``bench_batch.py`` runs the bridge, llama-server and the remote engine in that order in each
repeat; this bench runs only the bridge (llama engine) and llama-server, the bridge first in
even rounds and llama-server first in odd ones, so that neither side always follows the
other, and it times the bridge's ``llama_decode`` calls in the bridge process itself (the
bridge subprocess is this script in ``--as-bridge`` mode: ``llama_cpp.llama_decode`` wrapped
to log each call's start, end, rows and sequences, then ``python -m bridge``). Per round it
prints both worst times to first token and their ratio, and the bridge's split: the time in
the decodes that read prompt rows, how many rows, and the rest (requests, admission,
sampling, writing). Then the paired median of the ratios with its range and bootstrap 90%
interval. Same NPCs, prompts and settings as ``bench_batch`` (its helpers are used; round
numbers never repeat, so no side finds a prompt cached); llama-server is asked for
``--tokens`` each (only first words are compared).

Usage: python bench/bench_ttft.py [--n 8] [--rounds 20] [--tokens 64] [--threads T] [--ctx 2048]
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def as_bridge(trace: str, args: list[str]) -> None:
    """Runs ``python -m bridge ARGS`` with every ``llama_decode`` logged to ``trace``."""
    import llama_cpp

    decode = llama_cpp.llama_decode
    log = open(trace, "a", buffering=1)

    def timed(ctx: Any, batch: Any) -> int:
        t = time.monotonic()
        rc = decode(ctx, batch)
        seqs = {batch.seq_id[i][0] for i in range(batch.n_tokens)}
        log.write(f"{t:.6f} {time.monotonic():.6f} {batch.n_tokens} {len(seqs)}\n")
        return int(rc)

    llama_cpp.llama_decode = timed
    sys.argv = ["bridge", *args]
    runpy.run_module("bridge", run_name="__main__")


def main() -> None:
    import statistics as st

    import bench_batch as bb
    import trio

    from bridge.engines.llama import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8, help="NPCs asking at once")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per side")
    ap.add_argument("--tokens", type=int, default=64, help="maxTokens per NPC")
    ap.add_argument("--threads", type=int, default=0, help="decode threads, both sides (default cores - 1)")
    ap.add_argument("--ctx", type=int, default=2048, help="the bridge's --llama-ctx, llama-server's -c / N")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores - 1)
    n = args.n
    binary, version = bb.llama_server_binary()
    print(
        f"N = {n} NPCs at once, {args.rounds} rounds a side, order alternated; llama-server from llama-cpp-python "
        f"{version}'s llama.cpp, -np {n} -cb -t {threads} -tb {cores}; bridge --llama-threads {threads} "
        f"--llama-batch-threads {cores}; "
        f"context {args.ctx} per NPC; greedy",
        flush=True,
    )
    trace = tempfile.NamedTemporaryFile(prefix="oam-ttft-", suffix=".log", delete=False).name
    bridge = bb.Bridge(
        ["--engine", "llama", "--llama-ctx", str(args.ctx), "--llama-threads", str(threads)]
        + ["--llama-batch-threads", str(cores)],
        launcher=[bb.PY, os.path.abspath(__file__), "--as-bridge", trace],
    )
    server = bb.LlamaServer(binary, default_model_path(), n, args.ctx, threads, cores)
    sides = {"bridge": bb.Side("bridge"), "server": bb.Side("llama-server")}
    split: list[tuple[float, int]] = []  # per round: the bridge's prompt decode seconds, rows
    try:
        bridge.warm("llama")
        trio.run(bb.server_warm, server)
        rnd = 1000
        for r in range(args.rounds):
            rnd += 2
            order = ("bridge", "server") if r % 2 == 0 else ("server", "bridge")
            for side in order:
                if side == "server":
                    sides["server"].rounds.append(trio.run(bb.server_round, server, rnd + 1, [args.tokens] * n))
                    continue
                open(trace, "w").close()
                a = bridge.round("llama", rnd, [args.tokens] * n)
                sides["bridge"].rounds.append(a)
                with open(trace) as f:
                    calls = [line.split() for line in f]
                # a decode of more rows than NPCs reads a prompt chunk; the speakers' tokens
                # are decoded apart, one row per NPC
                prompt = [(float(t0), float(t1), int(rows)) for t0, t1, rows, seqs in calls if int(rows) > int(seqs)]
                split.append((sum(t1 - t0 for t0, t1, _ in prompt), sum(rows for _, _, rows in prompt)))
            b, s = max(sides["bridge"].rounds[-1].ttft), max(sides["server"].rounds[-1].ttft)
            secs, rows = split[-1]
            print(
                f"{r:3d} {'bridge first' if r % 2 == 0 else 'server first'}: "
                f"worst TTFT bridge {b:.3f} s (prompt decodes "
                f"{secs:.3f} s for {rows} rows, the rest {b - secs:.3f} s), llama-server {s:.3f} s; ratio {b / s:.3f}",
                flush=True,
            )
    finally:
        bridge.close()
        server.close()
        os.unlink(trace)
    print(
        f"\nworst time to first token, bridge / llama-server, paired by round (median [range, 90% interval]): "
        f"{bb.paired(sides['bridge'], sides['server'], lambda q: max(q.ttft))}"
    )
    print(
        f"medians: bridge {sides['bridge'].med(lambda q: max(q.ttft)):.3f} s, llama-server "
        f"{sides['server'].med(lambda q: max(q.ttft)):.3f} s; the bridge's prompt decodes "
        f"{st.median(x for x, _ in split):.3f} s for {st.median(y for _, y in split):.0f} rows, "
        f"{1e3 * st.median(x / y for x, y in split if y):.2f} ms a row; outside them before the last first word "
        f"{st.median(max(a.ttft) - x for a, (x, _) in zip(sides['bridge'].rounds, split, strict=True)):.3f} s"
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--as-bridge":
        as_bridge(sys.argv[2], sys.argv[3:])
    else:
        main()
