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
import ctypes
import logging
import math
import os
import re
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Any

import trio

from bridge.engines._text._prompt import Entry
from bridge.engines.base import GenerationOptions, Usage
from bridge.engines.llama._batch import Job, Scheduler
from bridge.engines.llama._lines import NUMBER_WORDS, SpokenLine, StopMarkers, value_pattern
from bridge.engines.llama._states import StateCache
from bridge.errors import BridgeError

# Prompts are read at most this many tokens per decode (all steps together), with a stop
# check between chunks; NPCs that are generating add their tokens beside the chunk.
PREFILL_CHUNK = int(os.environ.get("OAM_LLAMA_PREFILL_CHUNK", "128"))
# First words first: a speaking NPC's next token waits while NPCs that asked before its first
# word read their prompts (_batch.Scheduler._holds): until the last of them has its first word
# when that makes at most HOLD_BURST prompt tokens, else for HOLD prompt tokens at a time
HOLD = int(os.environ.get("OAM_LLAMA_HOLD", "256"))
HOLD_BURST = int(os.environ.get("OAM_LLAMA_HOLD_BURST", "1024"))
DEFAULT_PARALLEL = 8  # NPCs whose steps decode at once ($OAM_LLAMA_PARALLEL)
DEFAULT_MAX_TOKENS = 512  # a step that may write a tool call or a JSON answer
SLICE = 512  # a grammar step's retry masks this many best candidates first (Sampling._pick)
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
# The tokens DRY looks back over. -1 meant the whole context in older llama.cpp; 0.3.36's
# llama_sampler_init_dry clamps it to 0, which turns DRY off: the quality figures
# (bench_quality.py) were measured so. Turning it on (a positive window) wants a quality rerun.
DRY_LAST_N = -1

# A spoken line after a tool round says the numbers the game's tools answered
# (``_prompt.values_to_say``) in its first sentence, which cannot end before it has
# (``Sampling._ground``): a value is said where its logit comes within SAY_TAKE of the best
# token's; once the model would have ended the sentence, within SAY_TAKE + SAY_PRESS for each
# token since; SAY_PRESS_TOKENS tokens after that (or when maxTokens would cut it), whatever
# the model prefers. Chosen with bench/bench_grounded.py's lines: with SAY_TAKE 1 most counts
# came from the press, after the model had said the opposite ("No, I don't have ale left,
# 3."); with 2 most come early ("No, 3.", "I have 3 ale, but ..."). $OAM_LLAMA_GROUNDED=0
# turns it off.
SAY_BIAS = 4.0  # the values' logit bias where a number may start (FACT_BIAS, without its "14")
SAY_TAKE = 2.0
SAY_PRESS = 2.0
SAY_PRESS_TOKENS = 4
# What may come before a value said without a leading space ("(3", "$3", a space token).
_OPENERS = frozenset("\"'“‘([$£€#")

log = logging.getLogger("oam_bridge.llama")

Emit = Callable[[tuple[Any, ...]], None]

# Where a line introduces its speaker ("I'm ...", "my name is ..."): see Generator._said_instead.
_INTRO = re.compile(r"(?:\bI['’]m|\bI am|\bmy name is|\bname['’]s|\bcall me|\bcalled)$", re.I)
# Tokens that end a sentence or the line (the end-of-generation tokens too), and tokens that
# would glue onto a number just said ("3" + "0", "3" + "rd", "3" + ".5", "3" + ":10"): see
# Sampling._ground.
_ENDS = re.compile(rb"[.!?\n\r]|\xe2\x80\xa6")
_GLUED = re.compile(rb"\w|[.,:/]\d")
_DIGIT = re.compile(rb"\d|\xc2[\xbc-\xbe]|\xe2\x85[\x90-\x9e]")  # digits, "½", "⅓"
# Capitalized words that follow "I'm" without being a name.
_NOT_NAMES = frozenset(
    {
        "A",
        "An",
        "The",
        "Not",
        "Sorry",
        "Afraid",
        "Glad",
        "Happy",
        "Just",
        "So",
        "Here",
        "Still",
        "Always",
        "Only",
        "Sure",
        "Fine",
        "Well",
        "Very",
        "Too",
        "No",
        "Yes",
        "Your",
        "Going",
        "I",
    }
)


class Generator:
    """The engine's steps on its model: builds each step's sampling and runs it on the
    batch scheduler, which owns the one llama.cpp context."""

    def __init__(
        self,
        llm: Any,
        n_ctx: int,
        states: StateCache,
        n_parallel: int = DEFAULT_PARALLEL,
        n_threads: int = 1,
        n_threads_batch: int = 1,
        markers: tuple[str, ...] = (),
    ) -> None:
        """``markers``: the chat template's turn markers, which end a step and are never said
        (``_lines.StopMarkers``; ``PromptRenderer.stop_markers``)."""
        self.llm: Any = llm  # None once closed
        self.markers = markers
        self.n_ctx = n_ctx
        self.n_vocab: int = llm.n_vocab()
        self._cands: Any = None  # see candidates
        # one candidate, for Greedy.sample and Sampling._pick (the scheduler's thread samples
        # every step, one at a time)
        import llama_cpp

        self.one: Any = (llama_cpp.llama_token_data * 1)()
        self.states = states
        self.lock = threading.Lock()  # guards close
        self._banned: dict[bool, Any] = {}  # token ids: see _bans, filled by scan_vocabulary
        self.scheduler = Scheduler(
            llm, n_ctx, states, n_parallel, n_threads, n_threads_batch, PREFILL_CHUNK, HOLD, HOLD_BURST
        )

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
        import numpy as np

        llm = self.llm
        vocab = llm._model.vocab
        control: list[int] = []
        braces: list[int] = []
        enders: list[int] = []
        glued: list[int] = []
        digits: list[int] = []
        for tok in range(llm.n_vocab()):
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                enders.append(tok)
                continue
            if llama_cpp.llama_vocab_is_control(vocab, tok):
                control.append(tok)
                continue
            p = llm._model.token_to_piece(tok)
            if b"{" in p or b"}" in p:
                braces.append(tok)
            if _ENDS.search(p):
                enders.append(tok)
            if _GLUED.match(p):
                glued.append(tok)
            if _DIGIT.search(p):
                digits.append(tok)
        self._banned = {
            False: np.array(control, dtype=np.intc),
            True: np.array(sorted(control + braces), dtype=np.intc),
        }
        self._enders = np.array(enders, dtype=np.intc)
        self._glued = np.array(glued, dtype=np.intc)
        self._digits = np.array(digits, dtype=np.intc)

    def candidates(self, row: Any, pre: Any) -> Any:
        """The vocabulary's candidates with the logits of ``row``, after the chain ``pre``
        (a ``llama_token_data_array`` over one buffer that the scheduler's thread reuses
        for every grammar step's token)."""
        import llama_cpp
        import numpy as np

        n = self.n_vocab
        if self._cands is None:
            kind = np.dtype([("id", np.intc), ("logit", np.float32), ("p", np.float32)])
            self._cands = (llama_cpp.llama_token_data * n)()
            self._cand_view = np.frombuffer(memoryview(self._cands), dtype=kind)
            self._ids = np.arange(n, dtype=np.intc)
            self._best = (llama_cpp.llama_token_data * SLICE)()
            self._best_view = np.frombuffer(memoryview(self._best), dtype=kind)
        view = self._cand_view
        view["id"] = self._ids
        view["logit"] = np.ctypeslib.as_array(row, shape=(n,))
        view["p"] = 0.0
        arr = llama_cpp.llama_token_data_array(data=self._cands, size=n, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(pre.sampler, ctypes.byref(arr))
        return arr

    def best(self, k: int) -> Any:
        """The ``k`` best of the last ``candidates``, best first (ties: the lower id first,
        as greedy breaks them on the whole vocabulary)."""
        import llama_cpp
        import numpy as np

        view = self._cand_view
        top = np.argpartition(-view["logit"], k)[:k]
        top = top[np.lexsort((view["id"][top], -view["logit"][top]))]
        self._best_view[:k] = view[top]
        return llama_cpp.llama_token_data_array(data=self._best, size=k, selected=-1, sorted=False)

    def allowed(self, k: int) -> int:
        """How many of the ``best`` ``k`` the grammar left a finite logit."""
        import numpy as np

        return int(np.isfinite(self._best_view["logit"][:k]).sum())

    def _bans(self, braces: bool) -> Any:
        """The tokens kept out of a step (a numpy array of ids): control tokens that do not
        end generation (``<|im_start|>``: the model would start a new chat turn itself), and
        with ``braces`` every token with a brace, so a spoken line can never be JSON. Found by
        ``scan_vocabulary``, which the engine runs when it loads the model."""
        return self._banned[braces]

    def _sampler(self, opts: GenerationOptions, dry: bool = True, choice: bool = True) -> Any:
        """The step's sampler chain after the bans, boosts and repetition penalties that
        ``Sampling.choose`` applies to the logits itself, and without the grammar, which
        ``Sampling`` holds apart: "don't repeat yourself" (``dry``), then the ``choice``:
        greedy (temperature 0) or top-k / top-p / min-p / temperature with the step's seed."""
        import llama_cpp
        from llama_cpp import _internals

        llm = self.llm
        s: Any = _internals.LlamaSampler()  # type: ignore[no-untyped-call]
        if dry:
            s.add_dry(llm._model, DRY_MULTIPLIER, DRY_BASE, DRY_ALLOWED, DRY_LAST_N, DRY_BREAKERS)
        if not choice:
            return s
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
        self,
        npc_id: str,
        tokens: list[int],
        grammar_text: str | None,
        opts: GenerationOptions,
        spoken: bool,
        speaker: str | None,
        stop: threading.Event,
        emit: Emit,
        boost: dict[int, float] | None = None,
        recent: list[int] | None = None,
        unlabel: bool = False,
        say: list[str | Entry] | None = None,
        lead: str | None = None,
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
        dropped (``SpokenLine``); ``say``: values a spoken line must say in its first
        sentence (``Sampling._ground``); ``lead``: a sentence a spoken line without a grammar
        opens with (the lore that answers the player's line)."""
        from llama_cpp.llama_grammar import LlamaGrammar

        llm = self.llm
        if llm is None:
            raise BridgeError("model_unavailable", "engine closed")
        if stop.is_set():
            return None
        grammar = LlamaGrammar.from_string(grammar_text, verbose=False) if grammar_text else None
        step = Sampling(self, tokens, grammar, opts, spoken, speaker, emit, boost, recent, unlabel, say, lead)
        # KV cells the answer may take: a spoken line can become a call batch (see Sampling)
        reserve = min(
            max(step.limit, DEFAULT_MAX_TOKENS if spoken and not opts.max_tokens else 0), self.n_ctx - len(tokens)
        )
        job = Job(npc_id, tokens, stop, keep_last=True, step=step, reserve=reserve)
        finish = self.scheduler.submit(job)
        if finish is None:
            return None
        return Usage(input_tokens=len(tokens), output_tokens=step.out, cached_tokens=job.cached), finish


class Greedy:
    """A greedy step's sampler chain ("don't repeat yourself", then the best token), picking
    what ``llama_sampler_sample`` over the whole vocabulary picks without building a
    candidate for each of its 49k tokens (about 0.17 ms a token on the bundled model, per NPC
    per pass) when that is sure to be the same: the row's best token, when DRY leaves its
    logit as it was (DRY only lowers logits, so it is still the best; ``argmax`` and greedy
    both take the lowest id of equal bests). Otherwise the whole vocabulary. A step that
    samples with a temperature keeps llama.cpp's chain as it is: its top-k over the head of
    the row was measured slower in numpy than llama.cpp's pass over the whole of it."""

    def __init__(self, gen: Generator, opts: GenerationOptions) -> None:
        self.gen = gen
        self.chain: Any = gen._sampler(opts)
        self.fallbacks = 0  # picks that needed the whole vocabulary

    def sample(self, ctx: Any, idx: int) -> int:
        """The next token from the step's row of logits (``Sampling._adjust`` applied),
        accepted by the chain."""
        import llama_cpp
        import numpy as np

        gen = self.gen
        ptr = llama_cpp.llama_get_logits_ith(ctx.ctx, idx)
        row = np.ctypeslib.as_array(ptr, shape=(gen.n_vocab,))
        tok = int(np.argmax(row))
        one = gen.one
        one[0].id, one[0].logit, one[0].p = tok, row[tok], 0.0
        arr = llama_cpp.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.chain.sampler, ctypes.byref(arr))
        if one[0].logit != row[tok]:  # DRY lowered it: the chain over the whole row
            self.fallbacks += 1
            arr = gen.candidates(ptr, self.chain)
            tok = int(arr.data[arr.selected].id)
        self.chain.accept(tok)
        return tok

    def accept(self, tok: int) -> None:
        self.chain.accept(tok)


class Value:
    """A value a spoken line must say (``_prompt.values_to_say``): where a line says it
    (``_lines.value_pattern``), and the tokens that say it after a space (``spaced``) and
    after nothing (``bare``): its digits first, then a small whole number's word."""

    __slots__ = ("text", "pattern", "spaced", "bare")

    def __init__(self, text: str, tokenize: Callable[[str], list[int]]) -> None:
        self.text = text
        self.pattern = value_pattern(text)
        words = [text]
        if text.isdigit() and int(text) < len(NUMBER_WORDS):
            words.append(NUMBER_WORDS[int(text)])
        self.spaced = [t for w in words if (t := tokenize(" " + w))]
        self.bare = [t for w in words if (t := tokenize(w))]

    def forms(self, said: str, bare: bool) -> list[list[int]]:
        """The tokens that could say it next, after the line's text ``said``: a number's
        word ("three") never opens the line (it would be in lower case)."""
        forms = self.bare if bare else self.spaced
        return forms if said.strip() else forms[:1]


class EntryValue(Value):
    """An entry of a list the tools answered that a line must name with its price or count
    (``_prompt.entries_to_say``: "mead for 3 copper"). Said where the line names it and its
    detail close together, in either order ("the mead is 3 copper", "3 copper for the mead").
    Its forms: the whole phrase (capitalised where a sentence starts); ", " or " and " before
    it right after another entry, so a list reads as one; and the detail alone ("3 copper",
    "for 3 copper") right after the line has named the entry itself ("The mead is")."""

    __slots__ = ("name", "named", "joined", "detail", "opening")

    def __init__(self, entry: Entry, tokenize: Callable[[str], list[int]]) -> None:
        self.text, self.name = entry.text, entry.name
        own = [w for w in re.findall(r"[\w']+", entry.name.lower()) if len(w) > 2] or [entry.name.lower()]
        name = "|".join(re.escape(w) for w in sorted({entry.name.lower(), *own}, key=len, reverse=True))
        number, _, unit = entry.detail.partition(" ")
        detail = value_pattern(number).pattern if re.fullmatch(r"[\d.]+", number) else re.escape(number)
        detail += r"\s*" + re.escape(unit) if unit else ""
        gap = r"[^.!?\n]"
        self.pattern = re.compile(
            rf"\b(?:{name})\w*\b{gap}{{0,40}}?{detail}(?!\w)|{detail}(?!\w){gap}{{0,25}}?\b(?:{name})", re.I
        )
        self.named = re.compile(rf"\b(?:{name})\w*[^.!?\n\d]{{0,18}}$", re.I)  # the line has just named it
        self.spaced = [tokenize(" " + entry.text)]
        self.bare = [tokenize(entry.text)]
        self.opening = [tokenize(entry.text[:1].upper() + entry.text[1:])]
        self.joined = [tokenize(", " + entry.text), tokenize(", and " + entry.text), tokenize(" and " + entry.text)]
        self.detail = [tokenize(" " + entry.detail), tokenize(" for " + entry.detail)]

    def forms(self, said: str, bare: bool, after_entry: bool = False, last: bool = False) -> list[list[int]]:
        """As ``Value.forms``; ``after_entry``: the line has just said another entry, and
        ``last``: this is the list's last entry to say (", and ...")."""
        if self.named.search(said[-40:]):
            return self.detail
        if after_entry:
            return self.joined[1:] if last else self.joined[:1]
        if bare and (not said.strip() or said.rstrip()[-1:] in ".!?"):
            return self.opening
        return self.bare if bare else self.spaced


class Sampling:
    """One step's token choice, called by the scheduler with the step's row of logits after
    each decode (``choose``): its own sampler chain (bans, penalties, grammar, greedy or
    seeded sampling), the NPC's name said where it introduces itself, fact biases dropped
    once said, the values the game's tools answered said in the line's first sentence
    (``_ground``), and ``SpokenLine`` shaping a line of dialogue."""

    def __init__(
        self,
        gen: Generator,
        tokens: list[int],
        grammar: Any,
        opts: GenerationOptions,
        spoken: bool,
        speaker: str | None,
        emit: Emit,
        boost: dict[int, float] | None,
        recent: list[int] | None,
        unlabel: bool,
        say: list[str | Entry] | None = None,
        lead: str | None = None,
    ) -> None:
        import numpy as np

        llm = gen.llm
        self.gen, self.opts, self.emit = gen, opts, emit
        self.n_prompt = len(tokens)
        self.bans = gen._bans(spoken and grammar is None)
        self.boost = dict(boost or {})
        self._boosts()
        self.rules: Any = None  # the grammar's sampler, apart from the chain (see _pick)
        if grammar is None:
            greedy = (TEMPERATURE if opts.temperature is None else opts.temperature) == 0
            self.sampler: Any = Greedy(gen, opts) if greedy else gen._sampler(opts)
            self.chains = [self.sampler]  # what sees every token the step says
        else:
            from llama_cpp import _internals

            # a grammar step runs the chain in two parts, the grammar between them on a retry
            self.pre, self.post = gen._sampler(opts, choice=False), gen._sampler(opts, dry=False)
            self.rules = _internals.LlamaSampler()  # type: ignore[no-untyped-call]
            self.rules.add_grammar(llm._model, grammar)
            self.chains = [self.pre, self.post, self.rules]
            temp = TEMPERATURE if opts.temperature is None else opts.temperature
            self.need = 1 if temp == 0 else TOP_K  # see _pick
        self.checked = self.rejected = 0  # grammar steps: tokens picked, and picked again
        # the last PENALTY_LAST_N tokens the step has seen, which the repetition penalty
        # lowers, and how often each is there
        self.window: deque[int] = deque()
        self.seen: dict[int, int] = {}
        self.penalty = np.float32(REPEAT_PENALTY)
        for t in (recent or []) if grammar is None else []:
            self._accept(t)
        self.limit = opts.max_tokens or (DEFAULT_LINE_TOKENS if spoken else DEFAULT_MAX_TOKENS)
        self.max_tokens = min(self.limit, gen.n_ctx - len(tokens))
        self.line = SpokenLine(soft_tokens=self.limit // 2, unlabel=unlabel) if spoken else None
        self.name_tokens = (
            list(llm.tokenize((" " + speaker).encode("utf-8"), add_bos=False, special=False)) if speaker else []
        )
        self.vocab = llm._model.vocab
        self.model = llm._model
        self.out = 0
        self.finish = "length"
        self.said = ""  # the step's text as generated, before SpokenLine shapes it
        self.forced: list[int] = []  # tokens said without sampling: the rest of a name or a value

        def tokenize(text: str) -> list[int]:
            return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

        self.say = (
            [  # not said yet
                EntryValue(v, tokenize) if isinstance(v, Entry) else Value(v, tokenize) for v in say or []
            ]
            if spoken
            else []
        )
        self.entry_end = -1  # where the last entry said ends (EntryValue: a list goes on with ", ")
        self.listed = False  # every entry to say is said (_check_said): no digits after them
        self.pressed = -1  # tokens since the model would have ended the sentence (-1: it has not)
        self.guard = -1  # where a value just said ends: the next tokens may not glue onto it
        self.how: list[tuple[str, str]] = []  # (value, how it came to be said): see _ground
        self.offered: dict[int, list[int]] = {}  # this token's favoured value starts (_ground)
        if lead and spoken and grammar is None:
            self.forced = tokenize(lead.strip())  # said first, as the model's own words
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.markers = StopMarkers(gen.markers)  # the template's markers: the step ends there

    def choose(self, ctx: Any, idx: int) -> int | None:
        """The next token (to be evaluated), or None when the step has ended (``finish``)."""
        import llama_cpp

        if self.out >= self.max_tokens:
            return None
        if self.forced and not self._allows(self.forced[0]):
            self.forced = []  # a grammar's text branch takes any name or number: never here
        if self.forced:
            tok = self.forced.pop(0)
            self._accept(tok)  # penalties and the grammar see the name or the value as said
        else:
            row = llama_cpp.llama_get_logits_ith(ctx.ctx, idx)
            self._adjust(row)
            value = self._ground(row) if self.say or self.guard >= 0 else None
            if value is not None:
                tok, self.forced = value[0], value[1:]
                self._accept(tok)
            else:
                if self.rules is None:
                    tok = self.sampler.sample(ctx, idx)  # the chain has seen it (llama_sampler_sample)
                else:
                    tok = self._pick(row)
                self._seen(tok)
                if (start := self.offered.get(tok)) is not None:
                    self.forced = start[1:]  # the model chose a favoured value: all of it is said
                elif self.name_tokens and (name := self.gen._said_instead(self.said, tok, self.name_tokens)):
                    tok, self.forced = name[0], name[1:]
            self.offered = {}
        if tok in self.boost:  # a fact was said: favour it no more (it would repeat)
            del self.boost[tok]
            self._boosts()
        if llama_cpp.llama_vocab_is_eog(self.vocab, tok):
            self.finish = "stop"
            return None
        self.out += 1
        # a turn marker written as text ends the step: what came before it is said, never the marker
        piece, marked = self.markers.feed(self.dec.decode(self.model.token_to_piece(tok).rstrip(b"\x00")))
        self.said += piece
        if self.say and not self.forced:
            self._check_said()
        line = self.line
        if line is not None:
            piece = line.feed(piece, self.out)
            if line.passthrough and self.limit == DEFAULT_LINE_TOKENS and not self.opts.max_tokens:
                self.limit = DEFAULT_MAX_TOKENS  # a call batch, not a line: room to close it
                self.max_tokens = min(self.limit, self.gen.n_ctx - self.n_prompt)
        if piece:
            self.emit(("text", piece))
        if marked or (line is not None and line.stopped):
            self.finish = "stop"
            return None
        return tok

    def _ground(self, ptr: Any) -> list[int] | None:
        """The tokens of a value to say now, or None to sample; ``ptr``, the step's row of
        logits, loses the tokens that would end the sentence while a value is not said.

        A spoken line after a tool round says the numbers the tools answered
        (``self.say``) before its first sentence ends: until then no token that ends a
        sentence or the line (``. ! ? …``, a line break, end of generation) may be sampled.
        Where a number may start (not right after a digit), the values' digits are favoured
        (``SAY_BIAS``), and a value the model starts is said whole. A value is said where the
        model finds it nearly as likely as its best token (within ``SAY_TAKE`` of the best
        logit, after the bans, penalties and boosts); once the model's best token would have
        ended the sentence (or the line is past half its ``maxTokens``, where ``SpokenLine``
        ends it at the next sentence end), within ``SAY_PRESS`` more for each token since,
        and ``SAY_PRESS_TOKENS`` tokens after that whatever it prefers, or sooner when
        ``maxTokens`` would cut the line before it (a ``maxTokens`` of fewer tokens than the
        first word and the values leaves no room for them). The choice
        depends on the row's logits alone, never on the seed's draws: a line at any
        temperature says the value, and a near tie between CPUs moves where it is said,
        not whether. A call batch (a step that may still call a tool) is left alone."""
        import numpy as np

        gen = self.gen
        row = np.ctypeslib.as_array(ptr, shape=(gen.n_vocab,))
        if self.guard >= 0:  # a value just said stays that number: not "30", "3rd", "3.5", "3:10"
            after = self.said[self.guard :]
            if after in ("", ".", ",", ":", "/"):
                row[gen._glued] = -np.inf
            if after:
                self.guard = -1
        line = self.line
        if not self.say or line is None or line.passthrough:
            return None
        best = float(row.max())
        ending = float(row[gen._enders].max()) >= best
        row[gen._enders] = -np.inf
        if line.passthrough is False and self.pressed < 0 and (ending or self.out >= line.soft_tokens):
            self.pressed = 0  # the sentence would have ended, or should (SpokenLine's soft limit)
        pressed = self.pressed
        if pressed >= 0:
            self.pressed += 1
        need = sum(len(v.spaced[0]) if v.spaced else 0 for v in self.say)  # the values left, in digits
        force = pressed >= SAY_PRESS_TOKENS or self.max_tokens - self.out <= need + 1
        last = self.said[-1:]
        if last.isdigit() and not force:  # a value here would run on from the model's number
            return None
        # the tokens that start a value here: its digits or word after a space, an opening
        # quote or bracket, or at the start; " 3" (a space token, then "3") after a word. The
        # digits are favoured; a word ("three") is said where the model finds it likely, never
        # to open the line (it would be in lower case).
        bare = not last or last.isspace() or last in _OPENERS
        # a list under way: the next entry joins it (", mead for 3 copper"), unless the line
        # has just joined it itself
        after_entry = self.entry_end >= 0 and not self.said.rstrip().endswith((",", ";", ":", " and", " or"))
        starts: dict[int, tuple[Value, list[int]]] = {}
        firsts: set[int] = set()
        for v in self.say:
            if isinstance(v, EntryValue):
                final = sum(isinstance(x, EntryValue) for x in self.say) == 1
                forms = [f for f in v.forms(self.said, bare, after_entry, final) if f]
            else:
                forms = [f for f in v.forms(self.said, bare) if f]
            if forms:
                firsts.add(forms[0][0])
            for form in forms:
                starts.setdefault(form[0], (v, form))  # a start two values share: the first's
        row[np.fromiter(firsts, dtype=np.intc, count=len(firsts))] += SAY_BIAS
        if any(isinstance(v, EntryValue) for v in self.say):  # the model's own numbers would be invented prices
            kept = np.fromiter(starts, dtype=np.intc, count=len(starts))
            logits = row[kept].copy()
            row[gen._digits] = -np.inf
            row[kept] = logits
        self.offered = {tok: form for tok, (_v, form) in starts.items()}
        if line.passthrough is None:  # a line that opens with the number runs into sums ("4 * 10")
            return None
        if not starts:
            return None
        ids = np.fromiter(starts, dtype=np.intc, count=len(starts))
        best = float(row.max())
        tok = int(ids[np.argmax(row[ids])])
        gap = best - float(row[tok])
        value, toks = starts[tok]
        if not self._allows(tok):
            return None
        if force:
            how = "forced"
        elif gap <= SAY_TAKE + SAY_PRESS * max(pressed, 0):
            how = "taken" if pressed < 0 else "pressed"
        else:
            return None
        log.debug(
            "said %r (%s: %.2f below the best token, %d tokens after the sentence would have ended)",
            value.text,
            how,
            gap,
            max(pressed, 0),
        )
        self.how.append((value.text, how))
        return list(toks)

    def _check_said(self) -> None:
        """Values the line has said leave ``say`` (with their boosts); one said at the end of
        the text so far keeps the next tokens from gluing onto it (``_ground``)."""
        for v in list(self.say):
            m = v.pattern.search(self.said)
            if m is None:
                continue
            self.say.remove(v)
            if not self.how or self.how[-1][0] != v.text:
                self.how.append((v.text, "model"))
            self.pressed = -1
            if m.end() == len(self.said):
                self.guard = m.end()
                if isinstance(v, EntryValue):
                    self.entry_end = m.end()
            if isinstance(v, EntryValue) and not self.say:
                self.listed = True
                if self.line is not None:
                    self.line.soft_tokens = 0  # the line ends with the sentence that lists them
            for form in v.spaced + v.bare:
                self.boost.pop(form[0], None)
            self._boosts()

    def _allows(self, tok: int) -> bool:
        """Whether the step's grammar (if any) allows ``tok`` next."""
        import llama_cpp
        import numpy as np

        if self.rules is None:
            return True
        one: Any = (llama_cpp.llama_token_data * 1)()
        one[0].id, one[0].logit, one[0].p = tok, 0.0, 0.0
        single = llama_cpp.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.rules.sampler, ctypes.byref(single))
        return bool(one[0].logit != -np.inf)

    def _boosts(self) -> None:
        import numpy as np

        self.boost_ids = np.fromiter(self.boost, dtype=np.intc, count=len(self.boost))
        self.boost_by = np.fromiter(self.boost.values(), dtype=np.float32, count=len(self.boost))

    def _accept(self, tok: int) -> None:
        """``tok`` is said without being sampled: the chain, the grammar and the penalties
        see it."""
        for chain in self.chains:
            chain.accept(tok)
        self._seen(tok)

    def _pick(self, row: Any) -> int:
        """The next token under the grammar, as llama.cpp's own server samples: the chain
        picks from the whole row first, and only when the grammar refuses that token does the
        grammar mask the candidates and the chain pick again. Masking every time (the grammar
        in the chain) matches each of the 49k candidates against the grammar's stacks: 7 to
        17 ms a token on the bundled model, against about 0.5 ms this way.

        The retry masks only the ``SLICE`` best candidates when that is enough for the
        choice: greedy needs one allowed token among them (the best allowed one is then the
        best of all), sampling needs ``TOP_K`` (its top-k keeps those). Otherwise the whole
        vocabulary is masked. Greedy picks the token it picked with the grammar in the
        chain; a seeded temperature draws from the same allowed tokens, in another order."""
        import llama_cpp
        import numpy as np

        gen = self.gen
        arr = gen.candidates(row, self.pre)
        llama_cpp.llama_sampler_apply(self.post.sampler, ctypes.byref(arr))
        tok = int(arr.data[arr.selected].id)
        one = gen.one
        one[0].id, one[0].logit, one[0].p = tok, 0.0, 0.0
        single = llama_cpp.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.rules.sampler, ctypes.byref(single))
        self.checked += 1
        if one[0].logit == -np.inf:
            self.rejected += 1
            arr = gen.candidates(row, self.pre)  # the first pick's choice reordered and cut them
            best = gen.best(SLICE)  # a copy: arr is left whole for the fallback
            llama_cpp.llama_sampler_apply(self.rules.sampler, ctypes.byref(best))
            if gen.allowed(SLICE) >= self.need:
                arr = best
            else:
                llama_cpp.llama_sampler_apply(self.rules.sampler, ctypes.byref(arr))
            llama_cpp.llama_sampler_apply(self.post.sampler, ctypes.byref(arr))
            if arr.selected < 0 or arr.data[arr.selected].logit == -np.inf:
                # accepting a token the grammar refuses aborts the process in llama.cpp
                raise BridgeError("generation_failed", "the grammar allows no token the step may say here")
            tok = int(arr.data[arr.selected].id)
        for chain in self.chains:
            chain.accept(tok)
        return tok

    def _seen(self, tok: int) -> None:
        window, seen = self.window, self.seen
        window.append(tok)
        seen[tok] = seen.get(tok, 0) + 1
        if len(window) > PENALTY_LAST_N:
            old = window.popleft()
            if seen[old] == 1:
                del seen[old]
            else:
                seen[old] -= 1

    def _adjust(self, ptr: Any) -> None:
        """The boosts, bans and repetition penalty, applied to the step's row of logits in
        place (``ptr``, in the context's output buffer) before the chain samples it: what
        llama.cpp's logit-bias and penalties samplers compute, in that order, without
        their pass over the whole vocabulary (the penalties sampler looks up each of the
        49k candidates: 0.4 of the 0.5 ms the chain took per token on the bundled model)."""
        import numpy as np

        row = np.ctypeslib.as_array(ptr, shape=(self.gen.n_vocab,))
        if len(self.boost_ids):
            row[self.boost_ids] += self.boost_by
        row[self.bans] = -np.inf
        if self.listed:  # a list's entries are said with their prices: no price of its own after them
            row[self.gen._digits] = -np.inf
            if self.entry_end == len(self.said):
                row[self.gen._enders] += SAY_BIAS  # and the sentence that lists them ends there
        if self.seen:
            ids = np.fromiter(self.seen, dtype=np.intc, count=len(self.seen))
            x = row[ids]
            # llama.cpp's rule: a positive logit is divided by the penalty, any other multiplied
            row[ids] = np.where(x <= 0, x * self.penalty, x / self.penalty)

    def cancelled(self) -> str:
        self.finish = "cancelled"
        return self.end()

    def end(self) -> str:
        """Emits what the decoder and the line still hold; returns the finish reason."""
        tail, _ = self.markers.feed(self.dec.decode(b"", final=True))
        tail += self.markers.end()  # a marker's unfinished start: dropped
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
