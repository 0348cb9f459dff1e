"""Routing a turn's first step: whether the player's line calls for one of the NPC's tools,
and which, decided by the bridge from what the line means (``routing: "semantic"``) instead
of by the model (``"model"``).

Small models choose tools badly (the bundled SmolLM2 never calls one under ``auto``, and
forced, picks the first tool for nearly every line), yet they fill a named tool's arguments
well. So the bridge compares the line with each tool's description and ``examples`` and with
lines that call for no tool (``ANSWER_EXAMPLES``), word by word on static word embeddings
(wordllama's 256-d vectors) plus BM25 (bench/bench_routing.py has the measurements), and
forces the step to the best tool or to no tool. ``auto`` routes this way on engines that say their
model chooses badly (``weak_tool_choice``), and leaves the choice to the model elsewhere.

The embedder loads once per process (about 16 MB), in a worker thread; each distinct tool
set is embedded once (``TableCache``, shared by the NPCs that have the same tools).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from bridge.core._messages import RoutingPolicy
from bridge.core.agent._arguments import closed_values, enum_pins, same_word, words
from bridge.engines.base import ToolSpec

Vectors = NDArray[np.float32]
Resolved = Literal["model", "semantic"]

# Lines that call for no tool: small talk, questions about the NPC, greetings and thanks. They
# compete with the tools' own texts: a line nearer to these than to any tool is answered in words.
ANSWER_EXAMPLES = (
    "Hello there!",
    "Good evening to you.",
    "How are you today?",
    "What's your name?",
    "Who are you?",
    "Tell me about yourself.",
    "Where are you from?",
    "Thank you very much.",
    "Goodbye, see you soon.",
    "Nice weather, isn't it?",
    "What do you think of this town?",
    "Any news lately?",
    "You seem busy today.",
    "I'm just passing through.",
)
# A tool wins when its best text is at least THRESHOLD similar to the line and more similar than
# every answer example; similarity is word-aligned cosine plus BM25_WEIGHT times BM25
# (bench/bench_routing.py: 7/8 tavern, 26/30 on the held-out sets, with tools' examples).
THRESHOLD = 0.0
BM25_WEIGHT = 0.3


@dataclass(frozen=True, slots=True)
class Route:
    """The bridge's choice for a first step: a tool's name, or None (answer in words), and the
    winner's similarity to the line."""

    picked: str | None
    score: float


class Embedder(Protocol):
    def words(self, text: str) -> Vectors:
        """One unit-length row per content word of ``text`` (at least one row)."""
        ...


def _normalize(rows: Vectors) -> Vectors:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out: Vectors = (rows / np.where(norms == 0, 1, norms)).astype(np.float32)
    return out


_WORD = re.compile(r"[a-z0-9']+")
STOPWORDS = frozenset(
    "a an the i i'm i'd i'll me my you you're your to of and or for in on at is are was be it it's that this do"
    " does did have has can could would will please some any with from about by what how there so".split()
)


def content_words(text: str) -> list[str]:
    """The words that carry meaning (all of them when every one is a stop word)."""
    every = _WORD.findall(text.lower())
    return [w for w in every if w not in STOPWORDS] or every


class StaticEmbedder:
    """wordllama's static token embeddings (l2_supercat, 256 dimensions), read straight from
    the files in its wheel: a word is the mean of its tokens' vectors, less the table's mean
    (static vectors all lean one way; centred, unrelated words are near orthogonal). Loading
    it this way instead of through ``wordllama.WordLlama.load`` keeps the half-precision table
    (16 MB, not 32 MB), never reaches the network, and does not import wordllama's package
    (whose import configures the root logger)."""

    def __init__(self, folder: str) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizers", "l2_supercat_tokenizer_config.json"))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._table = load_file(os.path.join(folder, "weights", "l2_supercat_256.safetensors"))["embedding.weight"]
        self._mean = self._table.astype(np.float32).mean(axis=0)

    def words(self, text: str) -> Vectors:
        ws = content_words(text)
        out = np.zeros((max(1, len(ws)), self._table.shape[1]), dtype=np.float32)
        if ws:
            for i, enc in enumerate(self._tokenizer.encode_batch([" " + w for w in ws], add_special_tokens=False)):
                if enc.ids:
                    out[i] = self._table[enc.ids].astype(np.float32).mean(axis=0) - self._mean
        return _normalize(out)


_loaded: list[Embedder | None] = []
_loading = threading.Lock()


def wordllama_folder() -> str | None:
    """The folder of the installed wordllama package (found without importing it), or None. A
    frozen build (packaging/) carries just the two files routing reads, in its own folder."""
    bundle: str | None = getattr(sys, "_MEIPASS", None)
    if bundle is not None and os.path.isdir(os.path.join(bundle, "wordllama", "weights")):
        return os.path.join(bundle, "wordllama")
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def default_embedder() -> Embedder | None:
    """The process's embedder, loaded on first use (blocking: call it in a worker thread), or
    None when wordllama is not installed (then ``auto`` leaves routing to the model)."""
    with _loading:
        if not _loaded:
            folder = wordllama_folder()
            _loaded.append(StaticEmbedder(folder) if folder is not None else None)
        return _loaded[0]


def embedder_ready() -> Embedder | None:
    """The embedder if it has been loaded (never blocks), else None."""
    return _loaded[0] if _loaded else None


def resolve_policy(requested: RoutingPolicy, weak_tool_choice: bool, available: bool = True) -> Resolved:
    """``auto``: the bridge routes where the engine's model chooses tools badly, the model
    decides elsewhere. Without an embedder, the model decides."""
    if not available:
        return "model"
    if requested == "auto":
        return "semantic" if weak_tool_choice else "model"
    return requested


_SENTENCE = re.compile(r"(?<=[.!?:;])\s+")
_FULL_STOP = re.compile(r"(?<=[.!?])\s+")


def tool_texts(tool: ToolSpec) -> list[str]:
    """What a tool is compared on: its name in words, each sentence of its description, the
    values its arguments allow (``enum``) and its examples."""
    texts = [tool.name.replace("_", " ").replace("-", " ")]
    texts += [s for s in _SENTENCE.split(tool.description.strip()) if s]
    props = tool.parameters.get("properties")
    for spec in props.values() if isinstance(props, dict) else ():
        values = spec.get("enum") if isinstance(spec, dict) else None
        if isinstance(values, list) and values:
            texts.append(" ".join(str(v) for v in values))
    texts += [e for e in tool.examples if e.strip()]
    return texts


def _bm25_words(text: str) -> list[str]:
    """BM25's words: every word but single letters (its IDF weighs the common ones down)."""
    return [w for w in _WORD.findall(text.lower()) if len(w) > 1 or w == "i"]


class Bm25:
    """BM25 over short texts: the words two texts share, rarer words counting more."""

    def __init__(
        self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75, tokens: Callable[[str], list[str]] = _bm25_words
    ) -> None:
        self._tokens = tokens
        docs = [tokens(t) for t in texts]
        lens = [len(d) for d in docs]
        avg = sum(lens) / max(1, len(lens))
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for i, d in enumerate(docs):
            counts: dict[str, int] = {}
            for w in d:
                counts[w] = counts.get(w, 0) + 1
            for w, f in counts.items():
                self._postings.setdefault(w, []).append((i, f * (k1 + 1) / (f + k1 * (1 - b + b * lens[i] / avg))))
        n = len(docs)
        self._idf = {w: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for w, p in self._postings.items()}
        self._n = n

    def scores(self, text: str) -> Vectors:
        out = np.zeros(self._n, dtype=np.float32)
        for w in self._tokens(text):
            idf = self._idf.get(w)
            if idf is not None:
                for i, tf in self._postings[w]:
                    out[i] += idf * tf
        return out


class RouteTable:
    """The tools' texts and the answer examples, embedded word by word: text ``i`` belongs to
    ``owners[i]`` (a tool's name, or None for an answer example) and has the rows
    ``starts[i]:starts[i + 1]`` of ``words``."""

    __slots__ = ("owners", "words", "starts", "counts", "bm25", "tools")

    def __init__(self, owners: list[str | None], rows: list[Vectors], bm25: Bm25, tools: list[str]) -> None:
        self.owners = owners
        self.words = np.concatenate(rows)
        self.counts = np.array([len(r) for r in rows])
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.bm25 = bm25
        self.tools = tools

    def similarities(self, line: str, embedder: Embedder) -> Vectors:
        """Each text's similarity to ``line``: how well each word of one finds its nearest
        word in the other, both ways, averaged; plus ``BM25_WEIGHT`` times BM25."""
        q = embedder.words(line)
        sims = q @ self.words.T  # (line words, all text words)
        line_side = np.maximum.reduceat(sims, self.starts, axis=1).mean(axis=0)
        text_side = np.add.reduceat(sims.max(axis=0), self.starts) / self.counts
        out: Vectors = 0.5 * (line_side + text_side) + BM25_WEIGHT * self.bm25.scores(line)
        return out


def build_table(embedder: Embedder, tools: Sequence[ToolSpec], answers: Sequence[str] = ANSWER_EXAMPLES) -> RouteTable:
    owners: list[str | None] = []
    texts: list[str] = []
    for t in tools:
        mine = tool_texts(t)
        owners += [t.name] * len(mine)
        texts += mine
    owners += [None] * len(answers)
    texts += list(answers)
    return RouteTable(owners, [embedder.words(t) for t in texts], Bm25(texts), [t.name for t in tools])


def route_line(table: RouteTable, line: str, embedder: Embedder, threshold: float = THRESHOLD) -> Route:
    """The tool with the text most similar to the line, if that text is at least
    ``threshold`` similar and more similar than every answer example; else no tool."""
    best: dict[str | None, float] = {}
    for owner, s in zip(table.owners, table.similarities(line, embedder).tolist(), strict=True):
        if s > best.get(owner, -9.0):
            best[owner] = s
    answer = best.pop(None, -9.0)
    tools = [k for k in best if k is not None]
    if not tools:
        return Route(None, round(answer, 4))
    name = max(tools, key=lambda k: best[k])
    if best[name] >= threshold and best[name] > answer:
        return Route(name, round(best[name], 4))
    return Route(None, round(answer, 4))


ToolsKey = tuple[tuple[str, str, str, tuple[str, ...]], ...]


def tools_key(tools: Sequence[ToolSpec]) -> ToolsKey:
    return tuple((t.name, t.description, repr(t.parameters.get("properties")), tuple(t.examples)) for t in tools)


class TableCache:
    """Route tables by tool set (names, descriptions, argument values, examples), the least
    recently used dropped past ``size``: NPCs with the same tools share one."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._tables: OrderedDict[ToolsKey, RouteTable] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tools: Sequence[ToolSpec]) -> RouteTable | None:
        key = tools_key(tools)
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
            return table

    def build(self, embedder: Embedder, tools: Sequence[ToolSpec]) -> RouteTable:
        """The table for ``tools``, embedded now if it is not cached (blocking: a thread)."""
        table = self.get(tools)
        if table is None:
            table = build_table(embedder, tools)
            with self._lock:
                self._tables[tools_key(tools)] = table
                while len(self._tables) > self._size:
                    self._tables.popitem(last=False)
        return table


TABLES = TableCache()


def route(embedder: Embedder, tools: Sequence[ToolSpec], line: str) -> Route:
    """Route ``line`` among ``tools`` (blocking: a worker thread)."""
    return route_line(TABLES.build(embedder, tools), line, embedder)


def warm(tools: Sequence[ToolSpec]) -> None:
    """Load the embedder and embed ``tools`` now (npc/create, in a worker thread), so that
    the NPC's first turn pays only for its line."""
    embedder = default_embedder()
    if embedder is not None and tools:
        TABLES.build(embedder, tools)


# ---- closed arguments by meaning ----
#
# Under ``semantic`` a closed argument the line's words do not name may still be pinned by
# what the line means: "Do you have anything for snake venom?" names no remedy, but the tool's
# description says "an antidote for poison or venom". Each value is compared with the line on
# its own words and on its glosses (the clauses of the tool's and the argument's descriptions
# that mention it and no other value, and an ``anyOf``/``oneOf`` entry's ``description`` or
# ``title``); the best value is pinned when it is at least MEANING_FLOOR similar and
# MEANING_MARGIN ahead of the next. Static word vectors do not read negation ("I lost the
# package" is near "done"): a game gives such values descriptions
# (``{"const": "failed", "description": "lost, gave up, or someone died"}``).
MEANING_FLOOR = 0.2
MEANING_MARGIN = 0.08
_CLAUSE = re.compile(r"[,:;.()]")


def value_glosses(tool: ToolSpec, arg: str, schema: object, values: Sequence[str]) -> dict[str, list[str]]:
    """Per value of a closed argument, the texts it is compared on: itself and its glosses."""
    out = {v: [v] for v in values}
    spec = schema if isinstance(schema, dict) else {}
    for alt in spec.get("anyOf", spec.get("oneOf", [])) or []:
        if isinstance(alt, dict) and alt.get("const") in out:
            out[alt["const"]] += [str(alt[k]) for k in ("description", "title") if isinstance(alt.get(k), str)]
    described = [tool.description, spec.get("description") if isinstance(spec.get("description"), str) else ""]
    for clause in (c.strip() for text in described for c in _CLAUSE.split(str(text))):
        said = words(clause)
        mentions = [v for v in values if _mentions(said, v)]
        if len(mentions) == 1 and clause.lower() != mentions[0].lower():
            out[mentions[0]].append(clause)
    return out


def _mentions(said: list[str], value: str) -> bool:
    meaning = content_words(value)
    return any(any(same_word(w, m) for w in said) for m in meaning)


def _aligned(a: Vectors, b: Vectors) -> float:
    sims = a @ b.T
    return float(0.5 * (sims.max(axis=1).mean() + sims.max(axis=0).mean()))


def meaning_pins(embedder: Embedder, tools: Sequence[ToolSpec], line: str) -> dict[str, dict[str, str]]:
    """Per tool, the closed argument values the line means though its words name none
    (blocking: a worker thread). Arguments whose values the line names are left to
    ``_arguments.enum_pins``."""
    if not line.strip():
        return {}
    named = enum_pins(line, tools)
    q = embedder.words(line)
    out: dict[str, dict[str, str]] = {}
    for tool in tools:
        props = tool.parameters.get("properties")
        for arg, schema in props.items() if isinstance(props, dict) else ():
            values = closed_values(schema)
            if not values or len(values) < 2 or arg in named.get(tool.name, {}):
                continue
            glosses = value_glosses(tool, arg, schema, values)
            scores = sorted(
                ((max(_aligned(q, _VALUE_ROWS.rows(embedder, t)) for t in texts), v) for v, texts in glosses.items()),
                reverse=True,
            )
            (best, value), (second, _) = scores[0], scores[1]
            if best >= MEANING_FLOOR and best - second >= MEANING_MARGIN:
                out.setdefault(tool.name, {})[arg] = value
    return out


# ---- lore without a tool call ----
#
# Under ``semantic`` the bridge does not offer ``recall`` (the small model never calls it): it
# compares the player's line with each lore entry it can see (its key, and each sentence of its
# first LORE_TEXT_CHARS characters) on the same scores as routing, and the entries at least
# LORE_THRESHOLD similar, the most similar first, join the facts, within LORE_MAX_ENTRIES entries
# and LORE_MAX_CHARS characters (tests/model/test_llama_lore.py measures it on the bundled model).
LORE_THRESHOLD = 0.75
LORE_MAX_ENTRIES = 3
LORE_MAX_CHARS = 600
LORE_TEXT_CHARS = 1000
LORE_HEADER = "What you remember that bears on this:"
# BM25 on lore leaves out question words too (a lore sentence's "who" is no answer to "who ...?").
LORE_STOPWORDS = STOPWORDS | frozenset("who whom whose when where why which anyone anything someone tell".split())


def lore_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in LORE_STOPWORDS]


def lore_texts(key: str, value: str) -> list[str]:
    """What a lore entry is compared on: its key in words, and each sentence of its start."""
    texts = [key.replace("_", " ").replace("-", " ")]
    texts += [s for s in _SENTENCE.split(value[:LORE_TEXT_CHARS].strip()) if s]
    return texts


class LoreTable:
    """One view's lore, embedded sentence by sentence (``RouteTable`` with lore keys as owners)."""

    __slots__ = ("table",)

    def __init__(self, embedder: Embedder, lore: dict[str, str]) -> None:
        owners: list[str | None] = []
        texts: list[str] = []
        for key, value in lore.items():
            mine = lore_texts(key, value)
            owners += [key] * len(mine)
            texts += mine
        # The answer examples too, owned by no entry: a background that keeps BM25's weights
        # of common words about the same however few entries the NPC sees.
        owners += [None] * len(ANSWER_EXAMPLES)
        texts += ANSWER_EXAMPLES
        self.table = RouteTable(
            owners, [_LORE_ROWS.rows(embedder, t) for t in texts], Bm25(texts, tokens=lore_words), []
        )

    def scores(self, line: str, embedder: Embedder) -> dict[str, float]:
        """Each entry's similarity to ``line``: that of its most similar text."""
        best: dict[str, float] = {}
        for owner, s in zip(self.table.owners, self.table.similarities(line, embedder).tolist(), strict=True):
            if owner is not None and s > best.get(owner, -9.0):
                best[owner] = s
        return best

    def best_sentence(self, line: str, embedder: Embedder, key: str, value: str) -> str:
        """The sentence of entry ``key`` (its text ``value``) most similar to ``line``, whole
        and with a capital: a part after ";" or ":" is no sentence to open a line with."""
        rows = [i for i, owner in enumerate(self.table.owners) if owner == key][1:]  # its key's text aside
        if not rows:
            return ""
        sims = self.table.similarities(line, embedder)
        best = max(rows, key=lambda i: float(sims[i]))
        part = lore_texts(key, value)[best - rows[0] + 1]
        whole = next((w for w in _FULL_STOP.split(value[:LORE_TEXT_CHARS].strip()) if part in w), part)
        return whole[:1].upper() + whole[1:]


class _RowCache:
    """Embedded texts, the least recently used dropped past ``size``: a new world revision
    embeds only the lore that changed."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._rows: OrderedDict[str, Vectors] = OrderedDict()
        self._lock = threading.Lock()

    def rows(self, embedder: Embedder, text: str) -> Vectors:
        with self._lock:
            got = self._rows.get(text)
            if got is not None:
                self._rows.move_to_end(text)
                return got
        got = embedder.words(text)
        with self._lock:
            self._rows[text] = got
            while len(self._rows) > self._size:
                self._rows.popitem(last=False)
        return got


_LORE_ROWS = _RowCache()
_VALUE_ROWS = _RowCache(1024)


class _LoreTables:
    """Lore tables by the entries they hold (few distinct sets: NPCs that see the same lore
    share one), the least recently used dropped past ``size``."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._tables: OrderedDict[tuple[tuple[str, str], ...], LoreTable] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, embedder: Embedder, lore: dict[str, str]) -> LoreTable:
        key = tuple((k, v[:LORE_TEXT_CHARS]) for k, v in lore.items())
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                return table
        table = LoreTable(embedder, lore)
        with self._lock:
            self._tables[key] = table
            while len(self._tables) > self._size:
                self._tables.popitem(last=False)
        return table


LORE_TABLES = _LoreTables()


def retrieve_lore(
    embedder: Embedder,
    lore: dict[str, str],
    line: str,
    threshold: float = LORE_THRESHOLD,
    max_entries: int = LORE_MAX_ENTRIES,
) -> list[tuple[str, float]]:
    """The lore entries (key, score) at least ``threshold`` similar to ``line``, the most
    similar first, at most ``max_entries`` (blocking: a worker thread). ``lore``: key to the
    entry's text, only what the NPC can see."""
    if not lore or not line.strip():
        return []
    scores = LORE_TABLES.get(embedder, lore).scores(line, embedder)
    ranked = sorted(((k, s) for k, s in scores.items() if s >= threshold), key=lambda ks: (-ks[1], ks[0]))
    return [(k, round(s, 4)) for k, s in ranked[:max_entries]]


# A line that asks about what lore holds ("Who kept the lighthouse?", "Tell me about the
# mill"): the NPC's line opens with the best entry's sentence that answers it (``lore_lead``).
_ASKS = re.compile(
    r"\?\s*$|^\s*(?:tell|say|explain|describe|what|who|whom|whose|where|when|why|how|which|is|are|was|were"
    r"|do|does|did|can|could|have|has|had)\b",
    re.I,
)
LEAD_MAX_CHARS = 200  # a longer sentence is not said whole as the line's opening


def lore_lead(embedder: Embedder, lore: dict[str, str], line: str, found: list[tuple[str, float]]) -> str | None:
    """The sentence the NPC's line opens with (blocking: a worker thread): of the most similar
    lore entry ``found`` for ``line``, its sentence most similar to the line, when the line asks
    something; None otherwise. A small model given the fact among its instructions says it in
    about 4 lines of 10 (tests/model/test_llama_lore.py); said first, it is said every time."""
    if not found or not _ASKS.search(line):
        return None
    key = found[0][0]
    sentence = LORE_TABLES.get(embedder, lore).best_sentence(line, embedder, key, lore[key]).strip()
    return sentence if 0 < len(sentence) <= LEAD_MAX_CHARS else None


def render_lore(entries: Sequence[tuple[str, str]], max_chars: int = LORE_MAX_CHARS) -> str:
    """The retrieved lore for the instructions: a header, then ``- key: text`` lines within
    ``max_chars`` characters (the first entry cut short to fit, the rest left out)."""
    lines: list[str] = []
    used = 0
    for key, text in entries:
        line = f"- {key}: {text}"
        if used + len(line) > max_chars:
            if lines:
                break
            line = line[: max(0, max_chars - 1)].rstrip() + "…"
        lines.append(line)
        used += len(line) + 1
    return LORE_HEADER + "\n" + "\n".join(lines) if lines else ""
