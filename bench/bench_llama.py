"""The llama engine through the real ``oam-bridge`` subprocess, beside llama-cpp-python called
directly on the same model, prompt and settings, in the same run.

1. Time to first token and decode tokens/s: bridge (respond -> first ``turn/textDelta`` at
   the client) against direct ``Llama.generate`` (call -> first token), greedy, same tokens.
2. An NPC returning after another NPC spoke: its time to first token against its cold first
   turn (400-token persona), through the bridge.
3. Resident memory of the bridge with 1, 10 and 100 NPCs on one model, each after a turn.
4. Cancel: from leaving a step's stream to its generation thread releasing the model.

Usage: python bench/bench_llama.py [--quick]
"""

from __future__ import annotations

import json
import os
import statistics as st
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import trio  # noqa: E402

from bridge.engines.base import GenerationOptions, Message, StepRequest, TextChunk  # noqa: E402
from bridge.engines.llama import LlamaEngine  # noqa: E402

CTX = 2048
MAX = 48
GUARD = "You are Brann, the gate guard of Eldmoor, a medieval town. You are gruff but fair. "


class Bridge:
    def __init__(self) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "bridge", "--engine", "llama", "--llama-ctx", str(CTX)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            bufsize=0,
        )
        self.ids = 0
        self.call("initialize", {"protocolVersion": 1})

    def send(self, method: str, params: dict) -> int:
        self.ids += 1
        self.p.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}).encode() + b"\n"
        )
        return self.ids

    def line(self) -> dict:
        return json.loads(self.p.stdout.readline())

    def call(self, method: str, params: dict) -> dict:
        i = self.send(method, params)
        while True:
            msg = self.line()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def turn(self, npc: str, prompt: str) -> tuple[float, float, int]:
        """(seconds to the first delta, decode tokens/s, output tokens)"""
        t0 = time.perf_counter()
        self.send("npc/respond", {"npcId": npc, "prompt": prompt, "fullText": False})
        first = None
        while True:
            msg = self.line()
            m = msg.get("method")
            if m == "turn/textDelta" and first is None:
                first = time.perf_counter()
            elif m == "turn/completed":
                end = time.perf_counter()
                out = msg["params"]["usage"]["outputTokens"]
                return first - t0, (out - 1) / (end - first), out
            elif m == "turn/failed":
                raise RuntimeError(msg["params"])

    def rss_mib(self) -> float:
        with open(f"/proc/{self.p.pid}/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=30)


def direct(llm, tokens: list[int]) -> tuple[float, float, int]:
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    t0 = time.perf_counter()
    first = None
    n = 0
    for tok in llm.generate(tokens, temp=0.0, reset=True):
        if llm.token_eos() == tok:
            break
        n += 1
        if first is None:
            first = time.perf_counter()
        if n >= MAX:
            break
    end = time.perf_counter()
    return first - t0, (n - 1) / (end - first), n


def cancel_latency_ms(eng: LlamaEngine) -> float:
    """Leave a step at its first text delta; time until its thread gives the model back."""
    req = StepRequest(
        "c",
        "You are a bard.",
        [Message("user", "Sing me a long song.")],
        [],
        "disallowed",
        None,
        GenerationOptions(max_tokens=200, temperature=0),
        0,
    )

    async def run() -> float:
        stream = eng.stream_step(req)
        async for c in stream:
            if isinstance(c, TextChunk):
                break
        t0 = time.perf_counter()
        await stream.aclose()  # what the agent's aclosing does on cancel
        await trio.to_thread.run_sync(eng._gen.lock.acquire)
        eng._gen.lock.release()
        return (time.perf_counter() - t0) * 1e3

    return trio.run(run)


def main() -> None:
    quick = "--quick" in sys.argv
    runs = 3 if quick else 7
    eng = LlamaEngine(n_ctx=CTX)  # the direct side: same model file, threads and prompt rendering
    llm = eng._llm
    print(f"threads: {eng.threads[0]} generating, {eng.threads[1]} reading the prompt (both sides)")
    lat = [cancel_latency_ms(eng) for _ in range(runs)]
    print(
        f"cancel: leaving a step -> its thread releases the model, median {st.median(lat):.1f} ms, "
        f"max {max(lat):.1f} ms"
        " (about one decode step)"
    )
    b = Bridge()
    bt, bs, dt, ds = [], [], [], []
    for i in range(runs):  # interleaved; each run a new persona, so neither side has it cached
        instr = f"Shift {i}. " + GUARD * 3
        msgs = [Message("user", "Good morning! Who goes there?")]
        b.call(
            "npc/create",
            {"npcId": f"g{i}", "instructions": instr, "options": {"temperature": 0, "maxTokens": MAX, "seed": 1}},
        )
        ttft, tps, out_b = b.turn(f"g{i}", msgs[0].content)
        bt.append(ttft)
        bs.append(tps)
        d_ttft, d_tps, out_d = direct(llm, eng._tokens(eng._renderer.render(instr, msgs, [])))
        dt.append(d_ttft)
        ds.append(d_tps)
        if out_b != out_d:
            print(f"  note: run {i} produced {out_b} tokens through the bridge, {out_d} direct")
    print(
        f"time to first token (median of {runs}): bridge {st.median(bt) * 1e3:.1f} ms, "
        f"direct {st.median(dt) * 1e3:.1f} ms,"
        f" added {(st.median(bt) - st.median(dt)) * 1e3:+.1f} ms (target <= +5 ms)"
    )
    print(
        f"decode tokens/s (median of {runs}): bridge {st.median(bs):.1f}, direct {st.median(ds):.1f},"
        f" ratio {st.median(bs) / st.median(ds):.3f} (target >= 0.97)"
    )

    persona = (
        "You are Alice, the castle's old archivist. "
        + "You remember every king, every siege and every feast of the last century. " * 25
    )
    cold, back = [], []
    for i in range(runs):
        a, o = f"alice{i}", f"bob{i}"
        b.call(
            "npc/create",
            {
                "npcId": a,
                "instructions": f"Day {i}. " + persona,
                "options": {"temperature": 0, "maxTokens": 4, "seed": 1},
            },
        )
        b.call(
            "npc/create",
            {
                "npcId": o,
                "instructions": f"Day {i}. You are Bob the fishmonger. " + "You sell herring and gossip. " * 40,
                "options": {"temperature": 0, "maxTokens": 4, "seed": 1},
            },
        )
        cold.append(b.turn(a, "Tell me about the gate.")[0])
        b.turn(o, "Fresh fish today?")  # another NPC speaks: its prompt replaces Alice's in the context
        back.append(b.turn(a, "And the tower?")[0])
    persona_tokens = b.call("tokens/count", {"npcId": f"alice{runs - 1}", "text": ""})["promptTokens"]
    print(
        f"returning NPC after another spoke (persona ~{persona_tokens} tokens): "
        f"first token {st.median(back) * 1e3:.0f} ms"
        f" vs its cold first turn {st.median(cold) * 1e3:.0f} ms, "
        f"ratio {st.median(back) / st.median(cold):.2f} (target <= 0.2)"
    )
    b.close()

    b = Bridge()
    seen = 0
    marks = {}
    for n in (1, 10, 100):
        for i in range(seen, n):
            b.call(
                "npc/create",
                {
                    "npcId": f"v{i}",
                    "instructions": f"You are villager number {i}. " + "You farm turnips. " * 10,
                    "options": {"temperature": 0, "maxTokens": 2, "seed": 1},
                },
            )
            b.turn(f"v{i}", "Hello!")
        seen = n
        marks[n] = b.rss_mib()
    print(
        "bridge resident memory with NPCs on one model (each after one turn): "
        + ", ".join(f"{n} NPCs {mib:.0f} MiB" for n, mib in marks.items())
    )
    b.close()


if __name__ == "__main__":
    main()
