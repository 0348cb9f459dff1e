"""The generation thread: one model context, one step at a time, a stop flag checked
between prompt chunks and between tokens, and the hand-off of its output to trio.

``Generator.generate`` runs on a plain OS thread (``trio.lowlevel.start_thread_soon``), never
on trio's thread: a forward pass takes milliseconds to seconds. ``run_in_thread`` starts a
job there and yields what it emits; leaving the ``async for`` early (cancellation, a closed
generator) sets the stop flag, which the thread notices within one token or one prompt
chunk (``PREFILL_CHUNK`` tokens).
"""

from __future__ import annotations

import codecs
import math
import os
import re
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

import trio

from bridge.engines.base import GenerationOptions, Usage
from bridge.errors import BridgeError

from ._lines import SpokenLine
from ._states import StateCache, load_state, save_state

# The prompt is read in chunks of this many tokens, with a stop check between them.
PREFILL_CHUNK = int(os.environ.get("OAM_LLAMA_PREFILL_CHUNK", "128"))
DEFAULT_MAX_TOKENS = 512  # a step that may write a tool call or a JSON answer
DEFAULT_LINE_TOKENS = 80  # a spoken line (a text answer), when the NPC sets no maxTokens

# Sampling defaults, chosen with bench/bench_quality.py on the bundled model (see the README).
TEMPERATURE = 0.7
TOP_K = 40
TOP_P = 0.95
MIN_P = 0.05
REPEAT_PENALTY = 1.1  # over the last PENALTY_LAST_N generated tokens
PENALTY_LAST_N = 64
DRY_MULTIPLIER = 0.8  # "don't repeat yourself": penalizes extending a sequence seen before
DRY_BASE = 1.75
DRY_ALLOWED = 2
DRY_BREAKERS = ["\n", ":", '"', "*"]

Emit = Callable[[tuple[Any, ...]], None]

# Where a line introduces its speaker ("I'm ...", "my name is ..."): see Generator._said_instead.
_INTRO = re.compile(r"(?:\bI['’]m|\bI am|\bmy name is|\bname['’]s|\bcall me|\bcalled)$", re.I)
# Capitalized words that follow "I'm" without being a name.
_NOT_NAMES = frozenset({"A", "An", "The", "Not", "Sorry", "Afraid", "Glad", "Happy", "Just", "So", "Here", "Still",
                        "Always", "Only", "Sure", "Fine", "Well", "Very", "Too", "No", "Yes", "Your", "Going", "I"})


class Generator:
    """Owns the shared model context. ``lock`` is held for a whole step (and by close)."""

    def __init__(self, llm: Any, n_ctx: int, states: StateCache) -> None:
        self.llm: Any = llm  # None once closed
        self.n_ctx = n_ctx
        self.states = states
        self.lock = threading.Lock()
        self._resident: str | None = None  # whose tokens the context holds
        self._banned: dict[bool, dict[int, float]] = {}  # see _bans, filled by scan_vocabulary

    def close(self) -> None:
        with self.lock:
            self.states.clear()
            if self.llm is not None:
                try:
                    self.llm.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
                self.llm = None

    def _switch_to(self, npc_id: str, tokens: list[int]) -> None:
        """Under the lock: make the context hold the best available prefix for ``tokens``:
        save the resident NPC's state if another NPC takes the context, and load this NPC's
        saved state if it shares more of the prompt than what is resident."""
        import numpy as np

        llm = self.llm
        if self._resident is not None and self._resident != npc_id and llm.n_tokens > 0:
            self.states.put(self._resident, save_state(llm))
        self._resident = npc_id

        def common(ids: Any) -> int:
            n = min(len(ids), len(tokens))
            if n == 0:
                return 0
            diff = np.nonzero(np.asarray(ids[:n]) != np.asarray(tokens[:n]))[0]
            return int(diff[0]) if len(diff) else n

        cur = common(llm._input_ids)
        saved = self.states.get(npc_id)
        if saved is not None and common(saved.input_ids[: saved.n_tokens]) > cur:
            load_state(llm, saved)

    def scan_vocabulary(self) -> None:
        """Finds the tokens ``_bans`` keeps out: a pass over the whole vocabulary (about half
        a second for SmolLM2's 49k tokens), so it runs once, in the thread that loads the
        model, never before a step."""
        import llama_cpp

        llm = self.llm
        vocab = llm._model.vocab
        control: dict[int, float] = {}
        braces: dict[int, float] = {}
        for tok in range(llm.n_vocab()):
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                continue
            if llama_cpp.llama_vocab_is_control(vocab, tok):
                control[tok] = -math.inf
            elif b"{" in (p := llm._model.token_to_piece(tok)) or b"}" in p:
                braces[tok] = -math.inf
        self._banned = {False: control, True: {**control, **braces}}

    def _bans(self, braces: bool) -> dict[int, float]:
        """Logit biases that keep tokens out of a step: control tokens that do not end
        generation (``<|im_start|>``: the model would start a new chat turn itself), and with
        ``braces`` every token with a brace, so a spoken line can never be JSON. Found by
        ``scan_vocabulary``, which the engine runs when it loads the model."""
        return self._banned[braces]

    def _sampler(self, opts: GenerationOptions, grammar: Any, braces: bool, boost: dict[int, float]) -> Any:
        """The step's sampler chain: bans, repetition penalties, the grammar, then greedy
        (temperature 0) or top-k / top-p / min-p / temperature with the step's seed."""
        import llama_cpp
        from llama_cpp import _internals

        llm = self.llm
        s: Any = _internals.LlamaSampler()  # type: ignore[no-untyped-call]
        bans = {**boost, **self._bans(braces)}
        if bans:
            s.add_logit_bias(llm.n_vocab(), bans)
        s.add_penalties(llm.n_vocab(), PENALTY_LAST_N, REPEAT_PENALTY, 0.0, 0.0)
        s.add_dry(llm._model, DRY_MULTIPLIER, DRY_BASE, DRY_ALLOWED, -1, DRY_BREAKERS)
        if grammar is not None:
            s.add_grammar(llm._model, grammar)
        temp = TEMPERATURE if opts.temperature is None else opts.temperature
        if temp == 0:
            s.add_greedy()
        else:
            s.add_top_k(TOP_K)
            s.add_top_p(opts.top_p if opts.top_p is not None else TOP_P, 1)
            s.add_min_p(MIN_P, 1)
            s.add_temp(temp)
            s.add_dist(opts.seed if opts.seed is not None else llama_cpp.LLAMA_DEFAULT_SEED)
        return s

    def _said_instead(self, said: str, tok: int, name_tokens: list[int]) -> list[int] | None:
        """The tokens to say in place of the sampled ``tok``, or None to keep it: where the
        line introduces its speaker ("I'm", "my name is") and ``tok`` starts a name, the
        NPC's whole name is said, not the sampled one. A plain word ("I'm sorry") is kept.
        The sampler chain has seen ``tok``; a name in its place is plain text too, so a
        grammar's text branch is in the same state either way."""
        if not _INTRO.search(said[-40:]):
            return None
        if tok == name_tokens[0]:
            return name_tokens
        piece = self.llm._model.token_to_piece(tok).decode("utf-8", "ignore")
        word = piece.strip()
        if piece[:1].isspace() and word[:1].isupper() and word not in _NOT_NAMES:
            return name_tokens
        return None

    def _read_prompt(self, npc_id: str, tokens: list[int], stop: threading.Event, keep_last: bool) -> int | None:
        """Under the lock: makes the context hold ``tokens``, reusing the longest prefix the
        context or the NPC's saved state has (``_switch_to``) and reading the rest in
        ``PREFILL_CHUNK`` chunks. Returns the tokens reused, or None when stopped (the
        context then holds the chunks read so far, which a later step may reuse).
        ``keep_last``: the last token is read even when it was there (its logits start the
        sampling)."""
        llm = self.llm
        if len(tokens) >= self.n_ctx:
            raise BridgeError("context_size_exceeded", "prompt exceeds context",
                              prompt_tokens=len(tokens), context_size=self.n_ctx)
        self._switch_to(npc_id, tokens)
        n = 0
        ids = llm._input_ids
        m = min(len(ids), len(tokens))
        while n < m and ids[n] == tokens[n]:
            n += 1
        if keep_last:
            n = min(n, len(tokens) - 1)
        if n > 0 and llm._ctx.kv_cache_seq_rm(-1, n, -1):
            llm.n_tokens = n
        else:
            n = 0
            llm.reset()
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        rest = tokens[n:]
        for i in range(0, len(rest), PREFILL_CHUNK):
            if stop.is_set():
                return None
            llm.eval(rest[i : i + PREFILL_CHUNK])
        return n

    def prewarm(self, npc_id: str, tokens: list[int], stop: threading.Event) -> Usage | None:
        """Reads ``tokens`` (the start of the NPC's next prompt) into the context, as a step
        reads its prompt, and generates nothing (``npc/prewarm``). The context stays the
        NPC's: its next step reuses it, or, when another NPC's step takes the context first,
        the state saved for it (``_switch_to``). Returns the prompt's tokens and those that
        were already there, or None when stopped."""
        with self.lock:
            if self.llm is None:
                raise BridgeError("model_unavailable", "engine closed")
            if stop.is_set():
                return None
            cached = self._read_prompt(npc_id, tokens, stop, keep_last=False)
            return None if cached is None else Usage(input_tokens=len(tokens), cached_tokens=cached)

    def generate(
        self, npc_id: str, tokens: list[int], grammar_text: str | None, opts: GenerationOptions,
        spoken: bool, speaker: str | None, stop: threading.Event, emit: Emit,
        boost: dict[int, float] | None = None, recent: list[int] | None = None, unlabel: bool = False,
    ) -> tuple[Usage, str] | None:
        """Runs one step: emits ``("text", delta)`` items, returns (usage, finish reason),
        or None when stopped before the prompt was read. ``spoken``: the answer is a line of
        dialogue (no schema), shaped by ``SpokenLine`` and kept free of braces; ``speaker``:
        the NPC's name, said where the model would introduce itself by another one;
        ``boost``: logit biases toward the facts the game gave, each dropped once said;
        ``recent``: the tokens of the NPC's last lines, which the repetition penalties see
        as already said (a small model otherwise says the same line every turn; only on a
        step without a grammar, whose state they would not fit); ``unlabel``: other speakers'
        lines are in the prompt, so a ``Name:`` label the model starts the line with is
        dropped (``SpokenLine``)."""
        import llama_cpp
        from llama_cpp.llama_grammar import LlamaGrammar

        with self.lock:
            llm = self.llm
            if llm is None:
                raise BridgeError("model_unavailable", "engine closed")
            if stop.is_set():
                return None
            grammar = LlamaGrammar.from_string(grammar_text, verbose=False) if grammar_text else None
            braces = spoken and grammar is None
            boost = dict(boost or {})
            accepted: list[int] = list(recent or []) if grammar is None else []
            sampler = self._sampler(opts, grammar, braces, boost)
            for t in accepted:  # what the sampler chain has seen, to rebuild it
                sampler.accept(t)
            # at least the last token is re-read: its logits start the sampling
            cached = self._read_prompt(npc_id, tokens, stop, keep_last=True)
            if cached is None:
                return None
            limit = opts.max_tokens or (DEFAULT_LINE_TOKENS if spoken else DEFAULT_MAX_TOKENS)
            max_tokens = min(limit, self.n_ctx - len(tokens))
            line = SpokenLine(soft_tokens=limit // 2, unlabel=unlabel) if spoken else None
            name_tokens = list(llm.tokenize((" " + speaker).encode("utf-8"), add_bos=False, special=False)) if speaker else []
            vocab = llm._model.vocab
            out = 0
            finish = "length"
            said = ""  # the step's text as generated, before SpokenLine shapes it
            forced: list[int] = []  # tokens of the NPC's name being said instead of another
            dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while out < max_tokens:
                if stop.is_set():
                    finish = "cancelled"
                    break
                if forced:
                    tok = forced.pop(0)
                    sampler.accept(tok)  # penalties and the grammar see the name as said
                else:
                    tok = sampler.sample(llm._ctx, -1)
                    if name_tokens and (name := self._said_instead(said, tok, name_tokens)):
                        tok, forced = name[0], name[1:]
                accepted.append(tok)
                if tok in boost:  # a fact was said: favour it no more (it would repeat)
                    del boost[tok]
                    sampler = self._sampler(opts, grammar, braces, boost)
                    for t in accepted:
                        sampler.accept(t)
                if llama_cpp.llama_vocab_is_eog(vocab, tok):
                    finish = "stop"
                    break
                out += 1
                piece = dec.decode(llm._model.token_to_piece(tok).rstrip(b"\x00"))
                said += piece
                if line is not None:
                    piece = line.feed(piece, out)
                    if line.passthrough and limit == DEFAULT_LINE_TOKENS and not opts.max_tokens:
                        limit = DEFAULT_MAX_TOKENS  # a call batch, not a line: room to close it
                        max_tokens = min(limit, self.n_ctx - len(tokens))
                if piece:
                    emit(("text", piece))
                if line is not None and line.stopped:
                    finish = "stop"
                    break
                llm.eval([tok])
            tail = dec.decode(b"", final=True)
            if line is not None:
                tail = line.feed(tail, out) if tail else ""
                tail += line.end(cut=finish == "length")
            if tail:
                emit(("text", tail))
            return Usage(input_tokens=len(tokens), output_tokens=out, cached_tokens=cached), finish


async def run_in_thread(job: Callable[[threading.Event, Emit], None]) -> AsyncGenerator[tuple[Any, ...], None]:
    """Runs ``job(stop, emit)`` on a new OS thread and yields every item it emits, in order;
    an exception the job raises is re-raised here. Leaving early sets ``stop``."""
    send, recv = trio.open_memory_channel[tuple[Any, ...]](math.inf)
    stop = threading.Event()
    token = trio.lowlevel.current_trio_token()

    def deliver(item: tuple[Any, ...]) -> None:
        try:
            send.send_nowait(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            stop.set()

    def emit(item: tuple[Any, ...]) -> None:
        try:
            token.run_sync_soon(deliver, item)
        except trio.RunFinishedError:
            stop.set()

    def run() -> None:
        try:
            job(stop, emit)
        except BaseException as e:  # noqa: BLE001 - handed to the trio side
            emit(("error", e))
        emit(("end",))

    trio.lowlevel.start_thread_soon(run, lambda _outcome: None)
    try:
        async with recv:
            while True:
                item = await recv.receive()
                if item[0] == "end":
                    return
                if item[0] == "error":
                    raise item[1]
                yield item
    finally:
        stop.set()
