"""The native engine (Swift library behind the C ABI, scripted model) against the Python
scripted engine, same run, same script, same chunking (both cut `\\S+\\s*|\\s+`):

1. engine level: events per second of one long streamed step through `stream_step`
   (medians of several interleaved runs, and the native/python ratio);
2. end to end: events per second of one long streamed turn (fullText false) through the
   real `oam-bridge` subprocess, `--engine native` against `--engine scripted`, counting
   turn/textDelta lines at the client (as bench_protocol.py does);
3. how fast a cancel reaches a waiting step (trio cancel; oam_step_cancel from a thread);
4. round trip of a short step, and resident memory over 10,000 create / step / destroy
   cycles (2,000 with --quick).

Usage: python bench/bench_native.py [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_protocol import Peer  # noqa: E402

from bridge.engines import native  # noqa: E402
from bridge.engines.base import GenerationOptions, Message, StepRequest, TextChunk  # noqa: E402
from bridge.engines.scripted import ScriptedEngine  # noqa: E402


def request(prompt: str = "hi") -> StepRequest:
    return StepRequest(
        "bench", "", [Message(role="user", content=prompt)], [], "disallowed", None, GenerationOptions(), 0
    )


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS"))


async def events_per_second(engine: object, words: int) -> float:
    t = time.perf_counter()
    n = 0
    async for chunk in engine.stream_step(request()):  # type: ignore[attr-defined]
        n += isinstance(chunk, TextChunk)
    dt = time.perf_counter() - t
    assert n == words, n  # same chunking on both engines
    return n / dt


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


def turn_rate(b: Peer, npc: str, words: int) -> float:
    """textDelta lines per second at the client for one turn of `words` deltas."""
    b.call("npc/create", {"npcId": npc, "script": [{"text": "la " * words}]})
    t = time.perf_counter()
    b.send(
        {
            "jsonrpc": "2.0",
            "id": "go",
            "method": "npc/respond",
            "params": {"npcId": npc, "prompt": "sing", "fullText": False},
        }
    )
    deltas = 0
    while True:
        line = b.line()
        if b'"turn/textDelta"' in line:
            deltas += 1
        elif b'"turn/completed"' in line or b'"turn/failed"' in line:
            break
    rate = deltas / (time.perf_counter() - t)
    assert deltas == words, (npc, deltas)
    b.call("npc/delete", {"npcId": npc})
    return rate


def end_to_end(words: int, runs: int) -> tuple[list[float], list[float]]:
    """Both bridges alive at once, turns interleaved, so machine load hits both alike."""
    peers = {}
    for engine in ("scripted", "native"):
        peers[engine] = Peer([sys.executable, "-m", "bridge", "--engine", engine])
        peers[engine].call("initialize", {"protocolVersion": 1})
        turn_rate(peers[engine], "warmup", words // 10)
    rates: dict[str, list[float]] = {"scripted": [], "native": []}
    for k in range(runs):
        for engine, b in peers.items():
            rates[engine].append(turn_rate(b, f"bard{k}", words))
    for b in peers.values():
        b.close()
    return rates["scripted"], rates["native"]


async def cancel_latency_ms() -> float:
    """A trio cancel of a step waiting in a blocking pull: time until stream_step returns."""
    e = native.NativeEngine(script=[{"text": "one two three", "chunkMs": 2000}])
    cancelled_at = 0.0
    with trio.CancelScope() as scope:

        async def cancel_soon() -> None:
            nonlocal cancelled_at
            await trio.sleep(0.05)
            cancelled_at = time.perf_counter()
            scope.cancel()

        async with trio.open_nursery() as n:
            n.start_soon(cancel_soon)
            async for _c in e.stream_step(request()):
                pass
    elapsed = time.perf_counter() - cancelled_at
    await e.aclose()
    return elapsed * 1000


def cancel_wakes_pull_ms() -> float:
    import threading

    ffi, lib = native.load()
    eng = lib.oam_engine_create(b'{"script":[{"text":"slow","delayMs":5000}]}', ffi.NULL)
    step = lib.oam_step_start(eng, b'{"messages":[]}', ffi.NULL)
    out = ffi.new("oam_batch **")
    sent = [0.0]

    def cancel() -> None:
        sent[0] = time.perf_counter()
        lib.oam_step_cancel(step)

    threading.Timer(0.02, cancel).start()
    lib.oam_step_pull(step, -1, out)
    woke = time.perf_counter()
    lib.oam_step_free(step)
    lib.oam_engine_destroy(eng)
    return (woke - sent[0]) * 1000


async def main() -> None:
    quick = "--quick" in sys.argv
    ok, reason = native.availability()
    if not ok:
        raise SystemExit(f"native engine unavailable: {reason}")

    words = 20_000
    runs = 7 if quick else 15
    script = [{"text": "la " * words}]
    py, nat = [], []
    for _ in range(2):  # warm-up
        await events_per_second(ScriptedEngine(script=script), words)
        await events_per_second(native.NativeEngine(script=script), words)
    for _ in range(runs):  # interleaved, so machine load hits both alike
        py.append(await events_per_second(ScriptedEngine(script=script), words))
        e = native.NativeEngine(script=script)
        nat.append(await events_per_second(e, words))
        await e.aclose()
    p, q = statistics.median(py), statistics.median(nat)
    print(f"engine level, one step of {words:,} text chunks, median of {runs}:")
    print(f"  python scripted (baseline) {p:12,.0f} events/s")
    print(f"  native                     {q:12,.0f} events/s   native/python {q / p:.2f}  (target >= 0.80)")

    e2e_words = 20_000 if quick else 100_000
    e2e_runs = 3 if quick else 7
    e2e_s, e2e_n = end_to_end(e2e_words, e2e_runs)
    rs, rn = statistics.median(e2e_s), statistics.median(e2e_n)
    print(
        f"end to end through the oam-bridge subprocess, one turn of {e2e_words:,} deltas (fullText false), "
        f"median of {e2e_runs}:"
    )
    print(f"  --engine scripted (baseline) {rs:10,.0f} textDelta lines/s")
    print(
        f"  --engine native              {rn:10,.0f} textDelta lines/s   "
        f"native/scripted {rn / rs:.2f}  (target >= 0.80)"
    )

    lat = [await cancel_latency_ms() for _ in range(5 if quick else 20)]
    print(
        f"cancel reaching a step that waits between chunks (trio cancel -> stream_step returns), "
        f"median {statistics.median(lat):.1f} ms, max {max(lat):.1f} ms (poll interval {native.POLL_MS} ms)"
    )
    wake = [cancel_wakes_pull_ms() for _ in range(5 if quick else 20)]
    print(
        "oam_step_cancel from another thread waking a blocked oam_step_pull(-1): "
        f"median {statistics.median(wake):.2f} ms"
    )

    n = 200 if quick else 1000
    rp = await round_trip_us(lambda: ScriptedEngine(script=[{"text": "Hello there."}]), n)
    rn2 = await round_trip_us(lambda: native.NativeEngine(script=[{"text": "Hello there."}]), n)
    print(f"round trip of a short step (stream only), median: python {rp:.0f} us; native {rn2:.0f} us")

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
    print(
        f"resident memory over {cycles:,} create/step/destroy cycles: {before:,} KiB -> {after:,} KiB "
        f"({after - before:+,} KiB); samples {samples}"
    )

    # the same with a threaded producer (delayMs) and a cancelled step, which take the
    # blocking-pull and cancel paths
    async def threaded_cycle() -> None:
        e = native.NativeEngine(
            script=[{"text": "hello there friend", "delayMs": 1}, {"text": "x " * 100, "chunkMs": 1}]
        )
        async for _c in e.stream_step(request()):
            pass
        with trio.move_on_after(0.002):
            async for _c in e.stream_step(request()):
                pass
        await e.aclose()

    for _ in range(50):
        await threaded_cycle()
    before = rss_kib()
    samples = []
    n = cycles // 5
    for i in range(n):
        await threaded_cycle()
        if i % (n // 5) == 0:
            samples.append(rss_kib())
    after = rss_kib()
    print(
        f"resident memory over {n:,} threaded + cancelled step cycles: {before:,} KiB -> {after:,} KiB "
        f"({after - before:+,} KiB); samples {samples}"
    )


if __name__ == "__main__":
    trio.run(main)
