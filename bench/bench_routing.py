"""Routing a turn's first step: which method picks the right first action (a tool, or none)
for a player's line, beside the bundled model's own choice, measured in the same run.

Sets: the seeds' tavern set (bench/quality/exchanges.json, ``routing``: 8 lines) and the
healer, ferryman and quest-giver sets of bench/quality/routing_sets.json (written before any
method was tuned), reported apart. Methods, each with the tools' descriptions alone and with
their ``examples`` too, all scored by the bridge's rule (bridge/core/agent/_routing.py,
``route_line``: the best tool text against the answer examples):

- ``wordllama``: ``WordLlama.load`` pointed at its package folder, downloads disabled;
- ``static``: the same vectors read by the bridge's own loader (``StaticEmbedder``);
- ``bm25``: BM25 over the same texts (a small implementation below);
- ``gguf``: the bundled GGUF's own embeddings (llama-cpp-python, ``embedding=True``: a second
  context on the model);
- ``model``: the bundled model choosing itself, through the bridge (``auto`` and
  ``tool_or_answer``, temperature 0, routing ``model``), beside the bridge's ``semantic``.

Per method: load seconds and resident memory added, microseconds per line (embed the line
and route it; the tool tables embedded beforehand).

Usage::

    python bench/bench_routing.py             # everything
    python bench/bench_routing.py --no-model  # the embeddings only (seconds)
    python bench/bench_routing.py --show      # every line's pick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bridge.core.agent import _routing as r  # noqa: E402
from bridge.engines.base import ToolSpec  # noqa: E402

Line = tuple[str, str | None]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for row in f:
            if row.startswith("VmRSS:"):
                return int(row.split()[1]) / 1024
    return 0.0


def load_sets() -> dict[str, tuple[list[dict[str, Any]], list[Line], dict[str, Any]]]:
    """name -> (tools as JSON, lines, persona)."""
    ex = json.load(open(os.path.join(ROOT, "bench", "quality", "exchanges.json")))
    own = json.load(open(os.path.join(ROOT, "bench", "quality", "routing_sets.json")))
    route = ex["routing"]
    spec = ex["personas"][route["npc"]]
    tavern_tools = [
        {
            "name": n,
            "description": ex["tools"][n]["description"],
            "parameters": ex["tools"][n]["parameters"],
            "examples": own["tavern_examples"].get(n, []),
        }
        for n in spec["tools"]
    ]
    sets = {"tavern": (tavern_tools, [(x["prompt"], x["right"]) for x in route["lines"]], spec["persona"])}
    for name, s in own["sets"].items():
        sets[name] = (s["tools"], [(x["prompt"], x["right"]) for x in s["lines"]], s["persona"])
    return sets


def specs(tools: list[dict[str, Any]], examples: bool) -> list[ToolSpec]:
    return [
        ToolSpec(
            name=t["name"],
            description=t["description"],
            parameters=t["parameters"],
            examples=t.get("examples", []) if examples else [],
        )
        for t in tools
    ]


# ---- BM25 over the same texts ----

_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if len(w) > 1 or w in ("i",)]


class BM25:
    def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.docs = [Counter(words(d)) for d in docs]
        self.lens = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lens) / max(1, len(self.lens))
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.k1, self.b = k1, b

    def scores(self, query: str) -> list[float]:
        q = words(query)
        out = []
        for d, n in zip(self.docs, self.lens, strict=True):
            s = 0.0
            for w in q:
                f = d.get(w, 0)
                if f:
                    s += self.idf[w] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * n / self.avg))
            out.append(s)
        return out


def bm25_route(tools: list[ToolSpec], line: str) -> r.Route:
    owners: list[str | None] = []
    texts: list[str] = []
    for t in tools:
        mine = r.tool_texts(t)
        owners += [t.name] * len(mine)
        texts += mine
    owners += [None] * len(r.ANSWER_EXAMPLES)
    texts += list(r.ANSWER_EXAMPLES)
    best: dict[str | None, float] = {}
    for o, s in zip(owners, BM25(texts).scores(line), strict=True):
        best[o] = max(best.get(o, 0.0), s)
    answer = best.pop(None, 0.0)
    name = max(best, key=lambda k: best[k])
    return r.Route(name, best[name]) if best[name] > answer and best[name] > 0 else r.Route(None, answer)


# ---- the GGUF's own embeddings ----


class GgufEmbedder:
    def __init__(self) -> None:
        from bridge.engines.llama import default_model_path
        from bridge.engines.llama._model import load_model, silence_llama_logs

        silence_llama_logs()
        self.llm = load_model(
            False, model_path=default_model_path(), embedding=True, n_ctx=512, n_threads=1, verbose=False
        )

    def words(self, text: str) -> r.Vectors:
        """The whole text as one row (a sentence embedding): the routing rule is then cosine."""
        row = np.array(self.llm.embed(text), dtype=np.float32)
        if row.ndim == 2:  # no pooling: the mean of the tokens
            row = row.mean(axis=0)
        return r._normalize(row[None, :])


class WordLlamaEmbedder:
    def __init__(self) -> None:
        from pathlib import Path

        from wordllama import WordLlama

        folder = r.wordllama_folder()
        assert folder is not None
        self.wl = WordLlama.load(cache_dir=Path(folder), disable_download=True)

    def words(self, text: str) -> r.Vectors:
        """wordllama's own vectors (not centred), word by word."""
        out: r.Vectors = self.wl.embed(r.content_words(text) or [text], norm=True)
        return out


# ---- scoring ----


def score_embedder(
    emb: r.Embedder, sets: dict[str, Any], examples: bool, show: bool, label: str
) -> tuple[dict[str, tuple[int, int]], float]:
    """Per set (right, lines), and the microseconds per line (embed the line, route it)."""
    out = {}
    costs = []
    for name, (tools, lines, _) in sets.items():
        table = r.build_table(emb, specs(tools, examples))
        right = 0
        for line, want in lines:
            got = r.route_line(table, line, emb)
            right += got.picked == want
            if show:
                print(f"  [{label}] {name}: {line!r} -> {got.picked} {got.score:.2f} (want {want})")
        out[name] = (right, len(lines))
        reps = 20 if isinstance(emb, GgufEmbedder) else 300
        t0 = time.perf_counter()
        for _ in range(reps):
            for line, _want in lines:
                r.route_line(table, line, emb)
        costs.append((time.perf_counter() - t0) / (reps * len(lines)))
    return out, 1e6 * sum(costs) / len(costs)


def score_fn(
    fn: Callable[[list[ToolSpec], str], r.Route], sets: dict[str, Any], examples: bool
) -> tuple[dict[str, tuple[int, int]], float]:
    out = {}
    costs = []
    for name, (tools, lines, _) in sets.items():
        ts = specs(tools, examples)
        out[name] = (sum(fn(ts, line).picked == want for line, want in lines), len(lines))
        t0 = time.perf_counter()
        for _ in range(100):
            for line, _want in lines:
                fn(ts, line)
        costs.append((time.perf_counter() - t0) / (100 * len(lines)))
    return out, 1e6 * sum(costs) / len(costs)


def model_choice(sets: dict[str, Any], show: bool) -> dict[str, dict[str, tuple[int, int]]]:
    """The bundled model's own first action through the bridge (routing ``model``), and the
    bridge's ``semantic`` route in the same turns' place, per toolChoice."""
    import trio

    from bridge import EngineRegistry, Service
    from bridge.messages import (
        GenerationOptions,
        NpcConfig,
        NpcRef,
        Persona,
        RespondParams,
        SubmitParams,
        ToolCallRequested,
        TurnCompleted,
    )

    results: dict[str, dict[str, tuple[int, int]]] = {}

    async def main() -> None:
        async with Service.running(EngineRegistry(default="llama")) as svc:
            n = 0
            for choice in ("auto", "tool_or_answer"):
                for policy in ("model", "semantic"):
                    row = results.setdefault(f"model: {choice}, routing {policy}", {})
                    for name, (tools, lines, persona) in sets.items():
                        right = 0
                        for line, want in lines:
                            n += 1
                            npc = f"n{n}"
                            await svc.create(
                                NpcConfig(
                                    npc_id=npc,
                                    persona=Persona(name=persona["name"], role=persona["role"]),
                                    tools=specs(tools, True),
                                    options=GenerationOptions(temperature=0.0),
                                    routing=policy,
                                )
                            )
                            turn = svc.respond(
                                RespondParams(npc_id=npc, prompt=line, tool_choice=choice, max_tool_rounds=1)
                            )
                            first = None
                            async for ev in svc.events(turn.turn_id):
                                if isinstance(ev, ToolCallRequested):
                                    first = first or ev.name
                                    svc.submit(SubmitParams(npc_id=npc, call_id=ev.call_id, output={"ok": True}))
                                if isinstance(ev, TurnCompleted) and show:
                                    print(f"  [{choice}/{policy}] {name}: {line!r} -> {first} (want {want})")
                            right += first == want
                            svc.delete(NpcRef(npc_id=npc))
                        row[name] = (right, len(lines))

    trio.run(main)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--no-gguf", action="store_true")
    ap.add_argument("--show", action="store_true")
    args = ap.parse_args()
    out = os.fdopen(os.dup(1), "w")  # llama.cpp's log silencing may move fd 1
    sets = load_sets()
    rows: list[tuple[str, dict[str, tuple[int, int]], str, str, str]] = []

    def load(make: Callable[[], Any]) -> tuple[Any, str, str]:
        before, t0 = rss_mb(), time.perf_counter()
        obj = make()
        return obj, f"{time.perf_counter() - t0:.2f}", f"{rss_mb() - before:.0f}"

    emb, secs, mem = load(lambda: r.StaticEmbedder(r.wordllama_folder() or ""))
    for ex in (False, True):
        res, us = score_embedder(emb, sets, ex, args.show, f"static{'+ex' if ex else ''}")
        rows.append((f"static (bridge's loader){' + examples' if ex else ''}", res, f"{us:.0f}", secs, mem))
    wl, secs, mem = load(WordLlamaEmbedder)
    for ex in (False, True):
        res, us = score_embedder(wl, sets, ex, False, "wordllama")
        rows.append((f"wordllama load(){' + examples' if ex else ''}", res, f"{us:.0f}", secs, mem))
    for ex in (False, True):
        res, us = score_fn(bm25_route, sets, ex)
        rows.append((f"bm25{' + examples' if ex else ''}", res, f"{us:.0f}", "0", "0"))
    if not args.no_gguf:
        g, secs, mem = load(GgufEmbedder)
        for ex in (False, True):
            res, us = score_embedder(g, sets, ex, args.show, "gguf")
            rows.append((f"gguf embeddings{' + examples' if ex else ''}", res, f"{us:.0f}", secs, mem))
    if not args.no_model:
        for label, res in model_choice(sets, args.show).items():
            rows.append((label, res, "-", "-", "-"))
    names = list(sets)
    table = [
        "\n## Routing: right first action per set (tavern: the seeds' set; others: held out)\n",
        "| method | " + " | ".join(names) + " | held-out total | µs/line | load s | +RSS MB |",
        "|---|" + "---|" * (len(names) + 4),
    ]
    for label, res, us, secs, mem in rows:
        held = [res[n] for n in names if n != "tavern"]
        hr, hn = sum(a for a, _ in held), sum(b for _, b in held)
        cells = " | ".join(f"{res[n][0]}/{res[n][1]}" for n in names)
        table.append(f"| {label} | {cells} | {hr}/{hn} ({100 * hr / hn:.0f}%) | {us} | {secs} | {mem} |")
    print("\n".join(table), file=out, flush=True)


if __name__ == "__main__":
    main()
