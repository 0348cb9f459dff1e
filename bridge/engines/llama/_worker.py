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
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

import trio

from bridge.engines.base import GenerationOptions, Usage
from bridge.errors import BridgeError

from ._states import StateCache, load_state, save_state

# The prompt is read in chunks of this many tokens, with a stop check between them.
PREFILL_CHUNK = int(os.environ.get("OAM_LLAMA_PREFILL_CHUNK", "128"))
DEFAULT_MAX_TOKENS = 512

Emit = Callable[[tuple[Any, ...]], None]


class Generator:
    """Owns the shared model context. ``lock`` is held for a whole step (and by close)."""

    def __init__(self, llm: Any, n_ctx: int, states: StateCache) -> None:
        self.llm: Any = llm  # None once closed
        self.n_ctx = n_ctx
        self.states = states
        self.lock = threading.Lock()
        self._resident: str | None = None  # whose tokens the context holds

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

    def generate(
        self, npc_id: str, tokens: list[int], grammar_text: str | None, opts: GenerationOptions,
        stop: threading.Event, emit: Emit,
    ) -> tuple[Usage, str] | None:
        """Runs one step: emits ``("text", delta)`` items, returns (usage, finish reason),
        or None when stopped before the prompt was read."""
        import llama_cpp
        from llama_cpp.llama_grammar import LlamaGrammar

        with self.lock:
            llm = self.llm
            if llm is None:
                raise BridgeError("model_unavailable", "engine closed")
            if stop.is_set():
                return None
            if len(tokens) >= self.n_ctx:
                raise BridgeError("context_size_exceeded", "prompt exceeds context",
                                  prompt_tokens=len(tokens), context_size=self.n_ctx)
            self._switch_to(npc_id, tokens)
            # Reuse the longest resident prefix (at least the last token is re-read: its
            # logits start the sampling).
            n = 0
            ids = llm._input_ids
            m = min(len(ids), len(tokens))
            while n < m and ids[n] == tokens[n]:
                n += 1
            n = min(n, len(tokens) - 1)
            if n > 0 and llm._ctx.kv_cache_seq_rm(-1, n, -1):
                llm.n_tokens = n
            else:
                n = 0
                llm.reset()
                llm._ctx.kv_cache_seq_rm(-1, 0, -1)
            cached = n
            grammar = LlamaGrammar.from_string(grammar_text, verbose=False) if grammar_text else None
            temp = 0.7 if opts.temperature is None else opts.temperature
            llm.set_seed(opts.seed if opts.seed is not None else llama_cpp.LLAMA_DEFAULT_SEED)
            sampler = llm._init_sampler(temp=temp, top_p=opts.top_p if opts.top_p is not None else 0.95, grammar=grammar)
            rest = tokens[n:]
            for i in range(0, len(rest), PREFILL_CHUNK):
                if stop.is_set():
                    return None
                llm.eval(rest[i : i + PREFILL_CHUNK])
            max_tokens = min(opts.max_tokens or DEFAULT_MAX_TOKENS, self.n_ctx - len(tokens))
            vocab = llm._model.vocab
            out = 0
            finish = "length"
            dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while out < max_tokens:
                if stop.is_set():
                    finish = "cancelled"
                    break
                tok = sampler.sample(llm._ctx, -1)
                if llama_cpp.llama_vocab_is_eog(vocab, tok):
                    finish = "stop"
                    break
                out += 1
                piece = dec.decode(llm._model.token_to_piece(tok).rstrip(b"\x00"))
                if piece:
                    emit(("text", piece))
                llm.eval([tok])
            tail = dec.decode(b"", final=True)
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
