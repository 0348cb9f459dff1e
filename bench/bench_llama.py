"""Bench LlamaEngine.stream_step vs llama-cpp-python direct; returning-NPC TTFT; RSS."""
import resource
import statistics as st
import time

import trio

from bridge.engines.base import GenerationOptions, Message, StepRequest, TextChunk
from bridge.engines.llama import LlamaEngine

MAX = 48
RUNS = 3


def req(npc, text):
    return StepRequest(npc, "You are a gate guard in a medieval town. " * 8, [Message("user", text)], [],
                       "disallowed", None, GenerationOptions(max_tokens=MAX, temperature=0), 0)


async def engine_run(e, r):
    t0 = time.perf_counter(); ttft = None; n = 0
    async for c in e.stream_step(r):
        if isinstance(c, TextChunk) and ttft is None:
            ttft = time.perf_counter() - t0
        if hasattr(c, "usage"):
            n = c.usage.output_tokens
    return ttft, n / (time.perf_counter() - t0)


def direct_run(llm, prompt_tokens):
    llm.reset()
    t0 = time.perf_counter(); ttft = None; n = 0
    for tok in llm.generate(prompt_tokens, temp=0.0, reset=True):
        if ttft is None:
            ttft = time.perf_counter() - t0
        n += 1
        if n >= MAX or tok == llm.token_eos():
            break
    return ttft, n / (time.perf_counter() - t0)


async def main():
    e = LlamaEngine()
    llm = e._llm
    r = req("bench", "Good morning! Who goes there?")
    toks = e._tokens(e._render(r.instructions, r.messages, []))
    eng, dire = [], []
    for i in range(RUNS):
        e.forget("bench"); e._resident = None; llm.reset()
        eng.append(await engine_run(e, req(f"b{i}", "Good morning! Who goes there?")))
        dire.append(direct_run(llm, toks))
    et, ets = st.median(x[0] for x in eng), st.median(x[1] for x in eng)
    dt, dts = st.median(x[0] for x in dire), st.median(x[1] for x in dire)
    print(f"engine: ttft {et*1000:.1f} ms, {ets:.1f} tok/s | direct: ttft {dt*1000:.1f} ms, {dts:.1f} tok/s"
          f" | tok/s ratio {ets/dts:.2f}, ttft ratio {et/dt:.2f}")
    cold, warm = [], []
    for i in range(RUNS):
        a = f"npcA{i}"
        msgs = [Message("user", "I am Alice. Tell me about the castle gate and its history, please.")]
        ra = StepRequest(a, "You are a gate guard in a medieval town. " * 8, msgs, [], "disallowed", None,
                         GenerationOptions(max_tokens=8, temperature=0), 0)
        e._resident = None; llm.reset()  # truly cold: nothing in the KV cache
        cold.append((await engine_run(e, ra))[0])
        rbob = StepRequest(f"npcB{i}", "You are Bob, a fishmonger at the docks. " * 8,
                           [Message("user", "Bob here, something else entirely.")], [], "disallowed", None,
                           ra.options, 0)
        await engine_run(e, rbob)  # different prefix: evicts A's tokens from the live context
        rb = StepRequest(a, ra.instructions, msgs + [Message("assistant", "Hm."), Message("user", "And?")], [],
                         "disallowed", None, ra.options, 1)
        warm.append((await engine_run(e, rb))[0])
    print(f"returning NPC ttft {st.median(warm)*1000:.1f} ms vs cold {st.median(cold)*1000:.1f} ms"
          f" (ratio {st.median(warm)/st.median(cold):.2f})")
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MiB")
    await e.aclose()


if __name__ == "__main__":
    trio.run(main)
