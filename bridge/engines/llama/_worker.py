"""Steps on the llama engine: each step's sampling, and the hand-off of its output to trio.

A step's prompt is rendered, tokenized and its grammar built on the step's own OS thread
(``run_in_thread``, never trio's thread). The step then joins the engine's batch
(``_batch.Scheduler``): one thread that decodes every NPC's step in one llama.cpp context.
Each step keeps its own sampler chain and grammar (``Sampling``), which the scheduler calls
with the step's row of logits after each decode. Leaving the ``async for`` early
(cancellation, a closed generator) sets the stop flag, which the scheduler notices at its
next pass (one token, or one prompt chunk of ``PREFILL_CHUNK`` tokens).
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
from ._batch import Job, Scheduler
from ._states import StateCache

# Prompts are read at most this many tokens per decode (all steps together), with a stop
# check between chunks; NPCs that are generating add their tokens beside the chunk.
PREFILL_CHUNK = int(os.environ.get("OAM_LLAMA_PREFILL_CHUNK", "128"))
DEFAULT_PARALLEL = 8  # NPCs whose steps decode at once ($OAM_LLAMA_PARALLEL)
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
    """The engine's steps on its model: builds each step's sampling and runs it on the
    batch scheduler, which owns the one llama.cpp context."""

    def __init__(self, llm: Any, n_ctx: int, states: StateCache, n_parallel: int = DEFAULT_PARALLEL,
                 n_threads: int = 1, n_threads_batch: int = 1) -> None:
        self.llm: Any = llm  # None once closed
        self.n_ctx = n_ctx
        self.states = states
        self.lock = threading.Lock()  # guards close
        self._banned: dict[bool, dict[int, float]] = {}  # see _bans, filled by scan_vocabulary
        self.scheduler = Scheduler(llm, n_ctx, states, n_parallel, n_threads, n_threads_batch, PREFILL_CHUNK)

    def close(self) -> None:
        with self.lock:
            if self.llm is None:
                return
            self.scheduler.close()  # steps still running end with model_unavailable
            self.states.clear()
            try:
                self.llm.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
            self.llm = None

    def forget(self, npc_id: str) -> None:
        """The NPC's saved state and resident tokens go (reset, delete, restore)."""
        self.states.forget(npc_id)
        if self.llm is not None:
            self.scheduler.forget(npc_id)

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

    def prewarm(self, npc_id: str, tokens: list[int], stop: threading.Event) -> Usage | None:
        """Reads ``tokens`` (the start of the NPC's next prompt) into the NPC's slot, as a
        step reads its prompt, and generates nothing (``npc/prewarm``). The NPC's next step
        reuses it, or the state saved for it when its slot went to another NPC. Returns the
        prompt's tokens and those that were already there, or None when stopped."""
        if self.llm is None:
            raise BridgeError("model_unavailable", "engine closed")
        job = Job(npc_id, tokens, stop, keep_last=False, step=None, reserve=0)
        done = self.scheduler.submit(job)
        return None if done is None else Usage(input_tokens=len(tokens), cached_tokens=job.cached)

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
        from llama_cpp.llama_grammar import LlamaGrammar

        llm = self.llm
        if llm is None:
            raise BridgeError("model_unavailable", "engine closed")
        if stop.is_set():
            return None
        grammar = LlamaGrammar.from_string(grammar_text, verbose=False) if grammar_text else None
        step = Sampling(self, tokens, grammar, opts, spoken, speaker, emit, boost, recent, unlabel)
        # KV cells the answer may take: a spoken line can become a call batch (see Sampling)
        reserve = min(max(step.limit, DEFAULT_MAX_TOKENS if spoken and not opts.max_tokens else 0),
                      self.n_ctx - len(tokens))
        job = Job(npc_id, tokens, stop, keep_last=True, step=step, reserve=reserve)
        finish = self.scheduler.submit(job)
        if finish is None:
            return None
        return Usage(input_tokens=len(tokens), output_tokens=step.out, cached_tokens=job.cached), finish


class Sampling:
    """One step's token choice, called by the scheduler with the step's row of logits after
    each decode (``choose``): its own sampler chain (bans, penalties, grammar, greedy or
    seeded sampling), the NPC's name said where it introduces itself, fact biases dropped
    once said, and ``SpokenLine`` shaping a line of dialogue."""

    def __init__(self, gen: Generator, tokens: list[int], grammar: Any, opts: GenerationOptions, spoken: bool,
                 speaker: str | None, emit: Emit, boost: dict[int, float] | None, recent: list[int] | None,
                 unlabel: bool) -> None:
        llm = gen.llm
        self.gen, self.grammar, self.opts, self.emit = gen, grammar, opts, emit
        self.n_prompt = len(tokens)
        self.braces = spoken and grammar is None
        self.boost = dict(boost or {})
        self.accepted: list[int] = list(recent or []) if grammar is None else []
        self.sampler = gen._sampler(opts, grammar, self.braces, self.boost)
        for t in self.accepted:  # what the sampler chain has seen, to rebuild it
            self.sampler.accept(t)
        self.limit = opts.max_tokens or (DEFAULT_LINE_TOKENS if spoken else DEFAULT_MAX_TOKENS)
        self.max_tokens = min(self.limit, gen.n_ctx - len(tokens))
        self.line = SpokenLine(soft_tokens=self.limit // 2, unlabel=unlabel) if spoken else None
        self.name_tokens = list(llm.tokenize((" " + speaker).encode("utf-8"), add_bos=False, special=False)) if speaker else []
        self.vocab = llm._model.vocab
        self.model = llm._model
        self.out = 0
        self.finish = "length"
        self.said = ""  # the step's text as generated, before SpokenLine shapes it
        self.forced: list[int] = []  # tokens of the NPC's name being said instead of another
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def choose(self, ctx: Any, idx: int) -> int | None:
        """The next token (to be evaluated), or None when the step has ended (``finish``)."""
        import llama_cpp

        if self.out >= self.max_tokens:
            return None
        if self.forced:
            tok = self.forced.pop(0)
            self.sampler.accept(tok)  # penalties and the grammar see the name as said
        else:
            tok = self.sampler.sample(ctx, idx)
            if self.name_tokens and (name := self.gen._said_instead(self.said, tok, self.name_tokens)):
                tok, self.forced = name[0], name[1:]
        self.accepted.append(tok)
        if tok in self.boost:  # a fact was said: favour it no more (it would repeat)
            del self.boost[tok]
            self.sampler = self.gen._sampler(self.opts, self.grammar, self.braces, self.boost)
            for t in self.accepted:
                self.sampler.accept(t)
        if llama_cpp.llama_vocab_is_eog(self.vocab, tok):
            self.finish = "stop"
            return None
        self.out += 1
        piece = self.dec.decode(self.model.token_to_piece(tok).rstrip(b"\x00"))
        self.said += piece
        line = self.line
        if line is not None:
            piece = line.feed(piece, self.out)
            if line.passthrough and self.limit == DEFAULT_LINE_TOKENS and not self.opts.max_tokens:
                self.limit = DEFAULT_MAX_TOKENS  # a call batch, not a line: room to close it
                self.max_tokens = min(self.limit, self.gen.n_ctx - self.n_prompt)
        if piece:
            self.emit(("text", piece))
        if line is not None and line.stopped:
            self.finish = "stop"
            return None
        return tok

    def cancelled(self) -> str:
        self.finish = "cancelled"
        return self.end()

    def end(self) -> str:
        """Emits what the decoder and the line still hold; returns the finish reason."""
        tail = self.dec.decode(b"", final=True)
        if self.line is not None:
            tail = self.line.feed(tail, self.out) if tail else ""
            tail += self.line.end(cut=self.finish == "length")
        if tail:
            self.emit(("text", tail))
        return self.finish


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
