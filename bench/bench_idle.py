"""The NPC the player talks to, beside idle NPCs (issue 12): how fast it speaks.

A town's NPCs speak at the same moment, then each comes back with a short line, so all of
them sit in the llama engine's pool with their histories (``--idle``, default 7, each about
``--lore`` tokens long). Then the player talks to Pia, a line at a time (5 short lines, greedy,
48 tokens each). llama.cpp scans every row's attention mask over all the KV cells up to the
highest one in use, so the idle NPCs' cells slow each token Pia says until they leave the
pool and her cells move to its start (``Scheduler._tidy`` and ``Scheduler._pack`` in
``bridge/engines/llama/_batch.py``).

Measured in lines 3 to 5 (by then the engine has had two lines to tidy): Pia's tokens per
second (output tokens over the time from her first word to the end of the line, median of
the lines) and the median ``llama_decode`` time of her lone tokens. Each side runs in a
child process with its own engine (``LlamaEngine(n_parallel=8)``, the default threads);
with ``--baseline REV`` the same scenario runs on another git revision (a ``git worktree``
in a temporary folder), alternating sides, so the baseline is measured in the same run.

Usage: python bench/bench_idle.py [--baseline REV] [--repeat 4] [--idle 7] [--lore 520]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = [
    "What herbs do you sell?",
    "Which one helps a cough?",
    "How much is it?",
    "Where do you gather them?",
    "Thank you, and good day!",
]
LORE = (
    "The town of Brack sits where two rivers meet; its bridges, mills and markets are old, and every "
    "street has a story. "
)


def child(idle: int, lore_tokens: int) -> None:
    """One scenario on the ``bridge`` package of the current directory; prints a JSON line."""
    sys.path.insert(0, os.getcwd())
    import llama_cpp
    import trio

    from bridge.engines import llama
    from bridge.engines.base import GenerationOptions, Message, StepDone, StepRequest, TextChunk

    lone: list[float] = []
    recording = [False]
    decode = llama_cpp.llama_decode

    def timed(ctx: object, batch: llama_cpp.llama_batch) -> int:
        t = time.perf_counter()
        rc = int(decode(ctx, batch))
        if recording[0] and batch.n_tokens == 1:
            lone.append(time.perf_counter() - t)
        return rc

    llama_cpp.llama_decode = timed

    def request(npc: str, instructions: str, messages: list[Message], n: int) -> StepRequest:
        return StepRequest(
            npc_id=npc,
            instructions=instructions,
            messages=messages,
            tools=[],
            tool_mode="auto",
            schema=None,
            options=GenerationOptions(temperature=0, max_tokens=n),
            step_index=0,
        )

    async def say(engine: llama.LlamaEngine, r: StepRequest) -> tuple[float, int]:
        """(seconds from the first word to the end, output tokens)"""
        first = None
        async for c in engine.stream_step(r):
            if isinstance(c, TextChunk) and first is None:
                first = time.perf_counter()
            elif isinstance(c, StepDone):
                return time.perf_counter() - (first or time.perf_counter()), c.usage.output_tokens
        raise RuntimeError("no StepDone")

    async def main() -> None:
        engine = llama.LlamaEngine(n_parallel=8)
        try:
            repeat = max(1, lore_tokens // 24)
            instructions = [f"Day {i}. " + LORE * repeat + f"You are villager {i}." for i in range(idle)]
            pia = "You are Pia, the herbalist of Brack."
            messages = [Message("user", "Hello, who are you?")]
            async with trio.open_nursery() as n:
                for i in range(idle):
                    n.start_soon(say, engine, request(f"v{i}", instructions[i], [Message("user", "Hi")], 4))
                n.start_soon(say, engine, request("pia", pia, messages, 4))
            for i in range(idle):  # each comes back with a short line: resident after it
                await say(engine, request(f"v{i}", instructions[i], [Message("user", "Hi")], 4))
            sched = engine._gen.scheduler
            resident = sum(len(s.tokens) for s in sched.slots if s.npc and s.npc != "pia")
            speeds = []
            for k, line in enumerate(LINES):
                messages = [*messages, Message("assistant", "I am Pia."), Message("user", line)]
                recording[0] = k >= 2
                seconds, out = await say(engine, request("pia", pia, messages, 48))
                if k >= 2 and seconds > 0:
                    speeds.append(max(0, out - 1) / seconds)
            left = sum(len(s.tokens) for s in sched.slots if s.npc and s.npc != "pia")
            print(
                json.dumps(
                    {"tok_s": st.median(speeds), "lone_ms": 1000 * st.median(lone), "resident": resident, "left": left}
                ),
                flush=True,
            )
        finally:
            await engine.aclose()

    trio.run(main)


def run_side(root: str, idle: int, lore: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", "--idle", str(idle), "--lore", str(lore)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="git revision to measure beside this tree")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--idle", type=int, default=7, help="idle NPCs in the pool (at most 7)")
    ap.add_argument("--lore", type=int, default=520, help="about how many tokens each idle NPC holds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.idle, args.lore)
        return
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from bench_batch import add_worktree, remove_worktree

    sides = {"this tree": ROOT}
    worktree = None
    try:
        if args.baseline:
            worktree = add_worktree(args.baseline)
            sides[f"@{args.baseline[:12]}"] = worktree
        results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        order = list(sides)
        for r in range(args.repeat):
            for name in order if r % 2 == 0 else order[::-1]:
                res = run_side(sides[name], args.idle, args.lore)
                results[name].append(res)
                print(
                    f"  round {r + 1} {name}: {res['tok_s']:.1f} tok/s, lone token {res['lone_ms']:.2f} ms, "
                    f"idle NPCs' tokens in the pool {res['resident']:.0f} -> {res['left']:.0f}",
                    flush=True,
                )
        print(f"\nPia's lines 3-5 beside {args.idle} idle NPCs of ~{args.lore} tokens, medians of {args.repeat}")
        print(f"{'side':<24}{'tok/s':>8}{'lone token ms':>15}")
        med = {
            name: (st.median(r["tok_s"] for r in rs), st.median(r["lone_ms"] for r in rs))
            for name, rs in results.items()
        }
        for name, (tok_s, lone) in med.items():
            print(f"{name:<24}{tok_s:>8.1f}{lone:>15.2f}")
        if worktree is not None:
            (a, la), (b, lb) = med.values()
            print(f"  this tree / baseline: tok/s {a / b:.2f}, lone token time {la / lb:.2f}")
    finally:
        if worktree is not None:
            remove_worktree(worktree)


if __name__ == "__main__":
    main()
