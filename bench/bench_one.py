"""One NPC at the llama.cpp limit (issue 33): the bridge's decoding speed beside ``llama-bench``.

Two sides, interleaved:

- **bridge**: the real ``oam-bridge --engine llama --llama-threads T`` subprocess; a fresh NPC
  (about 100 prompt tokens, one of ``bench_batch``'s personas, greedy) answers one question.
  Decoding tokens/s = (output tokens - 1) / (its ``turn/completed`` - its first
  ``turn/textDelta``), at the client: sampling, the line's shaping, the events and the pipe
  are all in it.
- **llama-bench**: llama.cpp's own benchmark, built from the llama.cpp vendored in the
  installed llama-cpp-python's sdist (``bench_batch.llama_cpp_tool``), ``-t T -p 0 -n OUT
  -d PROMPT``: as many tokens as the NPC generated, from the same depth (the NPC's prompt
  tokens; attention costs more per token the deeper it starts: ``tg64`` from an empty
  context is 8-10% faster than from 128 tokens in), with flash attention on and off; the
  faster of the two is the limit.

Each llama-bench run sits between two bridge turns and is compared with their mean: the
shared VM's speed moves by a third within a minute, and a figure taken seconds before and one
seconds after bracket the run. Printed: per run both figures and their ratio, then the median
ratio and its range (the goal: >= 0.97). llama-bench is built with ``GGML_NATIVE=ON`` for this
machine's CPU; the bridge runs the portable build's best variant for it (``engine/status``
``cpuVariant``).

At the end: llama-bench's ``tg`` from an empty context (``-d 0``) beside the NPC's depth, the
figure the issue first compared against; and where the bridge's time per token goes, from a
second bridge whose ``llama_decode`` calls are logged (``bench_ttft.py --as-bridge``; not the
measured one, as the log costs a little per token): the median time inside a one-token
``llama_decode`` and between two of them (the step's sampling, its line, its events).

Usage: python bench/bench_one.py [--repeat 9] [--threads T] [--tokens 96]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)

import bench_batch as bb  # noqa: E402
import bench_ttft  # noqa: E402

from bridge.engines.llama._model import default_model_path  # noqa: E402

PERSONA = 6  # Lysa the bard: asked for a story, she speaks until maxTokens


def bridge_turn(bridge: bb.Bridge, rnd: int, tokens: int) -> tuple[float, int, int]:
    """(decoding tokens/s, output tokens, prompt tokens) of one fresh NPC's answer, at the client."""
    npc = f"one{rnd}"
    instructions, question = bb.npc_prompt(PERSONA, rnd)
    bridge.call(
        "npc/create",
        {
            "npcId": npc,
            "engine": "llama",
            "instructions": instructions,
            "options": {"temperature": 0, "maxTokens": tokens, "seed": 1},
        },
    )
    _, data = bridge.request("npc/respond", {"npcId": npc, "prompt": question, "fullText": False})
    assert bridge.p.stdin is not None
    bridge.p.stdin.write(data)
    first = None
    while True:
        msg = bridge.line()
        method = msg.get("method")
        if "error" in msg:
            raise RuntimeError(f"npc/respond: {msg['error']}")
        if method == "turn/textDelta" and first is None:
            first = time.perf_counter()
        elif method == "turn/completed":
            end = time.perf_counter()
            usage = msg["params"]["usage"]
            assert first is not None
            out = int(usage["outputTokens"])
            return (out - 1) / (end - first), out, int(usage["inputTokens"])
        elif method == "turn/failed":
            raise RuntimeError(f"turn failed: {msg['params']}")


def split(trace: str) -> tuple[float, float]:
    """(median ms inside a one-token ``llama_decode``, median ms between two of them) in
    the trace of one turn."""
    with open(trace) as f:
        calls = [(float(t0), float(t1)) for t0, t1, rows, _ in (line.split() for line in f) if rows == "1"]
    inside = [1e3 * (t1 - t0) for t0, t1 in calls]
    between = [1e3 * (b0 - a1) for (_, a1), (b0, _) in zip(calls, calls[1:], strict=False)]
    return st.median(inside), st.median(between)


def llama_bench(
    binary: str, model: str, threads: int, tokens: int, depths: str, reps: int
) -> dict[tuple[str, int], float]:
    """tokens/s of ``llama-bench -n tokens -d depths`` by (flash attention ``on``/``off``, depth)."""
    out = subprocess.run(
        [
            binary,
            "-m",
            model,
            "-t",
            str(threads),
            "-p",
            "0",
            "-n",
            str(tokens),
            "-d",
            depths,
            "-fa",
            "on,off",
            "-r",
            str(reps),
            "-o",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {("on" if r["flash_attn"] else "off", int(r["n_depth"])): float(r["avg_ts"]) for r in json.loads(out)}


def where_the_time_goes(threads: int, tokens: int, turns: int = 3) -> tuple[list[float], list[float]]:
    """Per turn of a bridge whose ``llama_decode`` calls are logged (``bench_ttft.py
    --as-bridge``; apart from the measured bridge, as the log costs a little per token): the
    median ms inside a one-token decode and between two."""
    trace = tempfile.NamedTemporaryFile(prefix="oam-one-", suffix=".log", delete=False).name
    bridge = bb.Bridge(
        ["--engine", "llama", "--llama-threads", str(threads)],
        launcher=[bb.PY, bench_ttft.__file__, "--as-bridge", trace],
    )
    inside, between = [], []
    try:
        bridge_turn(bridge, 0, tokens)
        for rnd in range(1, turns + 1):
            open(trace, "w").close()
            bridge_turn(bridge, 100 + rnd, tokens)
            ms_in, ms_between = split(trace)
            inside.append(ms_in)
            between.append(ms_between)
    finally:
        bridge.close()
        os.unlink(trace)
    return inside, between


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=9, help="llama-bench runs, each between two bridge turns")
    ap.add_argument("--threads", type=int, default=0, help="decode threads, both sides (default cores - 1)")
    ap.add_argument("--tokens", type=int, default=96, help="the NPC's maxTokens")
    args = ap.parse_args()
    threads = args.threads or max(1, (os.cpu_count() or 2) - 1)
    binary, version = bb.llama_cpp_tool("llama-bench")
    model = default_model_path()
    bridge = bb.Bridge(["--engine", "llama", "--llama-threads", str(threads)])
    turns: list[tuple[float, int, int]] = []
    ratios: list[float] = []

    def turn(rnd: int) -> None:
        turns.append(bridge_turn(bridge, rnd, args.tokens))

    try:
        bridge_turn(bridge, 0, args.tokens)  # warm: the model's pages, the first compute graph
        status = bridge.call("engine/status", {})
        llama = next(e for e in status["engines"] if e["name"] == "llama")
        print(
            f"one NPC, {threads} thread(s); llama-cpp-python {version}; the bridge on the portable "
            f"build's {llama['cpuVariant']} variant, llama-bench built for this CPU (GGML_NATIVE)",
            flush=True,
        )
        print(
            "tokens/s: the bridge at the client, the mean of its turns just before and after each llama-bench "
            "run (from the NPC's depth, flash attention on and off: the faster is the limit)"
        )
        print(f"{'run':>6} {'out':>4} {'depth':>5} {'bridge':>7} {'fa on':>7} {'fa off':>7} {'ratio':>6}")
        turn(1)
        for rnd in range(1, args.repeat + 1):
            tok_s, out, depth = turns[-1]
            bench = llama_bench(binary, model, threads, out, str(depth), 1)
            turn(rnd + 1)
            mean = (tok_s + turns[-1][0]) / 2
            ratios.append(mean / max(bench[("on", depth)], bench[("off", depth)]))
            print(
                f"{rnd:>6} {out:>4} {depth:>5} {mean:>7.1f} {bench[('on', depth)]:>7.1f} "
                f"{bench[('off', depth)]:>7.1f} {ratios[-1]:>6.3f}",
                flush=True,
            )
        tok_s, out, depth = turns[-1]
        both = llama_bench(binary, model, threads, out, f"{depth},0", 3)
        turn(args.repeat + 2)
    finally:
        bridge.close()
    inside, between = where_the_time_goes(threads, args.tokens)
    print(
        f"bridge / llama-bench at the NPC's depth (the faster flash-attention setting): median "
        f"{st.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} runs "
        f"(goal >= 0.97)"
    )
    deep = max(both[("on", depth)], both[("off", depth)])
    empty = max(both[("on", 0)], both[("off", 0)])
    print(
        f"llama-bench from {depth} tokens in / from an empty context, one run after: {deep:.1f} / {empty:.1f} "
        f"tokens/s ({deep / empty:.3f}); the bridge's turns around it / the empty context's: "
        f"{(tok_s + turns[-1][0]) / 2 / empty:.3f}"
    )
    print(
        f"the bridge per token ({len(inside)} turns of a bridge that logs its decodes): {st.median(inside):.2f} "
        f"ms inside llama_decode, {st.median(between):.3f} ms between two "
        f"({100 * st.median(between) / (st.median(inside) + st.median(between)):.1f}%)"
    )


if __name__ == "__main__":
    main()
