"""The native engine (Swift library behind the C ABI, scripted model) against the Python
scripted engine, same run: events per second of one long streamed step, round trip of a
short step, and resident memory over 10,000 create / step / destroy cycles.

Usage: python bench/bench_native.py [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time

import trio

from bridge.engines import native
from bridge.engines.base import GenerationOptions, Message, StepRequest, TextChunk
from bridge.engines.scripted import ScriptedEngine


def request(prompt: str = "hi") -> StepRequest:
    return StepRequest("bench", "", [Message(role="user", content=prompt)], [], "disallowed", None, GenerationOptions(), 0)


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS"))


async def events_per_second(engine: object, words: int) -> float:
    t = time.perf_counter()
    n = 0
    async for chunk in engine.stream_step(request()):  # type: ignore[attr-defined]
        n += isinstance(chunk, TextChunk)
    assert n >= words, n
    return n / (time.perf_counter() - t)


async def round_trip_us(engine_factory: object, n: int) -> float:
    xs = []
    for _ in range(n):
        eng = engine_factory()  # type: ignore[operator]
        t = time.perf_counter()
        async for _chunk in eng.stream_step(request()):
            pass
        xs.append((time.perf_counter() - t) * 1e6)
        await eng.aclose()
    return statistics.median(xs)


async def main() -> None:
    quick = "--quick" in sys.argv
    ok, reason = native.availability()
    if not ok:
        raise SystemExit(f"native engine unavailable: {reason}")
    words = 5_000 if quick else 20_000
    script = [{"text": "la " * words}]
    py, nat = [], []
    for _ in range(3):
        py.append(await events_per_second(ScriptedEngine(script=script), words))
        e = native.NativeEngine(script=script)
        nat.append(await events_per_second(e, words))
        await e.aclose()
    p, q = statistics.median(py), statistics.median(nat)
    print(f"events per second, one step of {words} text chunks: python scripted {p:,.0f}; native {q:,.0f}; native/python {q / p:.2f} (target >= 0.80)")
    n = 200 if quick else 1000
    rp = await round_trip_us(lambda: ScriptedEngine(script=[{"text": "Hello there."}]), n)
    rn = await round_trip_us(lambda: native.NativeEngine(script=[{"text": "Hello there."}]), n)
    print(f"round trip of a short step (create, stream, close), median: python {rp:.0f} us; native {rn:.0f} us")
    cycles = 2_000 if quick else 10_000
    for _ in range(200):  # warm-up: allocator pools, thread stacks
        e = native.NativeEngine(script=[{"text": "hi"}])
        async for _c in e.stream_step(request()):
            pass
        await e.aclose()
    before = rss_kib()
    samples = []
    for i in range(cycles):
        e = native.NativeEngine(script=[{"text": "hello there friend"}])
        async for _c in e.stream_step(request()):
            pass
        await e.aclose()
        if i % (cycles // 5) == 0:
            samples.append(rss_kib())
    after = rss_kib()
    print(f"resident memory over {cycles:,} create/step/destroy cycles: {before:,} KiB -> {after:,} KiB ({after - before:+,} KiB); samples {samples}")


if __name__ == "__main__":
    trio.run(main)
