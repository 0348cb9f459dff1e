"""The engine adapter: loads the model, counts tokens, turns a step into chunks."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import msgspec
import trio

from bridge.engines._text._grammar import CallSniffer, build_grammar
from bridge.engines._text._prompt import TEMPLATE_FALLBACK, PromptRenderer, turn_start
from bridge.engines.base import (
    Chunk,
    EngineInfo,
    Message,
    StepDone,
    StepRequest,
    TextChunk,
    ToolCall,
    ToolCallsChunk,
    ToolSpec,
    Usage,
    user_text,
)
from bridge.engines.llama._cpu import variant as cpu_variant
from bridge.engines.llama._model import (
    MODEL_FILE,
    availability,
    default_model_path,
    extra_buffers_default,
    load_model,
    silence_llama_logs,
)
from bridge.engines.llama._states import StateCache
from bridge.engines.llama._worker import DEFAULT_PARALLEL, Emit, Generator, run_in_thread
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge.llama")

MAX_DEFAULT_CTX = 8192
LOADER_CTX = 32  # the Llama object's own context, unused: see __init__
FEATURES = ["tools", "grammar", "streaming", "schema", "prefix_cache", "batching"]
COUNT_CACHE_SIZE = 512  # prompts whose token count is remembered
# Logit bias toward the values the game's tools answered, until each is said once (see
# Generator.generate): the bundled model otherwise rarely says the count or the price it
# was given (bench/bench_quality.py, "grounded"). $OAM_LLAMA_FACT_BIAS; 0 turns it off.
FACT_BIAS = 4.0
FACT_BIAS_MAX_VALUES = 3  # more values than this in a step's tool results: no bias
# The numbers the game's tools answered (a count, a price: _prompt.values_to_say) are said in
# the line's first sentence, not only favoured (_worker.Sampling._ground): a bias alone left
# the demo's count to a near tie that CPU variants decided differently (bench/bench_grounded.py).
# $OAM_LLAMA_GROUNDED=0 turns it off (the bias alone, as before).
GROUNDED = True
NAME_BIAS = 6.0  # toward the NPC's name when the player asks for it (once, like FACT_BIAS)
RECENT_LINES = 2  # the NPC's last lines that the repetition penalties count as said


_warned: set[str] = set()  # model files whose missing chat template was said (once a process)
_warned_lock = threading.Lock()


def _warn_no_template(path: str) -> None:
    """Says on stderr, once a process for each file, that the model file has no chat template."""
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning(
        "the model file %s has no chat template (GGUF tokenizer.chat_template): prompts are rendered as "
        "ChatML, which this model may not know; ChatML's markers end each step (engine/status: chatTemplate %r)",
        path,
        TEMPLATE_FALLBACK,
    )


# The player asks who the NPC is: "what's your name", "who are you", "what do they call you".
_ASKS_NAME = re.compile(r"\b(?:your name|who are you|who're you|call you|who runs|who is the)\b", re.I)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, a container's
    cpuset) where the platform has one, else every core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """llama.cpp's threads when the game sets none: every usable core but one."""
    return max(1, usable_cores() - 1)


class LlamaEngine:
    """llama.cpp (llama-cpp-python): one model shared by the NPCs that use it, a saved
    context per NPC, GBNF-constrained tool calls and JSON answers.

    Thread-safety: ``count_tokens`` may run on any thread, also while a step generates
    (``blocking_count``: the agent calls it in a worker thread). Tokenizing only reads the
    model's vocabulary (``llama_tokenize`` on a ``const llama_vocab``) and rendering reads
    the compiled template; ``aclose`` waits for counts in flight before freeing the model.
    """

    name = "llama"
    blocking_count = True

    def __init__(
        self,
        model_path: str | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        cache_bytes: int = 512 * 1024 * 1024,
        verbose: bool = False,
        extra_buffers: bool | None = None,
        n_parallel: int | None = None,
        n_threads_batch: int | None = None,
    ) -> None:
        """``n_threads``: the threads all of llama.cpp's work runs on (``$OAM_LLAMA_THREADS``;
        default: the cores this process may run on but one, which stays with the game);
        ``n_threads_batch``: threads for passes of more than one token (prompt chunks, several
        NPCs at once), default ``n_threads``. ``extra_buffers``: llama.cpp's AMX / weight-repacking buffers (see
        ``_model.load_model``); default ``$OAM_LLAMA_EXTRA_BUFFERS``, off. ``n_parallel``:
        NPCs whose steps decode together (``$OAM_LLAMA_PARALLEL``, default 8); ``n_ctx``:
        the KV cells they share, and the longest prompt and answer of one NPC."""
        self.model_path = model_path or default_model_path()
        # The bundled SmolLM2 chooses tools badly: the bridge routes its first steps (base.py).
        # Not another model in its place (a frozen build's DIST_MODEL=NAME, $OAM_LLAMA_MODEL).
        self.weak_tool_choice = (
            os.path.abspath(self.model_path) == os.path.abspath(default_model_path())
            and os.path.basename(self.model_path) == MODEL_FILE
        )
        ok, reason = availability(self.model_path)
        self._available, self._reason = ok, reason
        self._llm: Any = None
        self._n_ctx = 0
        self._counting = threading.Condition()  # guards _counts_in_flight, _closed, _counts
        self._counts_in_flight = 0  # tokenizations running (counts and step prompts)
        self._closed = False
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self._states = StateCache(cache_bytes)
        self.fact_bias = float(os.environ.get("OAM_LLAMA_FACT_BIAS", FACT_BIAS))
        self.grounded = os.environ.get("OAM_LLAMA_GROUNDED", "1" if GROUNDED else "0") != "0"
        if not ok:
            return
        if not verbose:  # llama.cpp logs to stderr (never stdout: fd 1 is claimed) only if asked
            silence_llama_logs()
        # All of llama.cpp's work leaves one core to the game and the bridge's own loop: ggml's
        # threads meet at a barrier on every op, so one of them preempted (by the game's frame)
        # stalls the whole pass; prompt chunks and passes of several NPCs included (issue 33).
        threads = n_threads or default_threads()
        self.threads = (threads, n_threads_batch or threads)
        # The Llama object holds the model and its tokenizer; steps decode in the batch
        # scheduler's own context (_batch.py), so Llama's context is the smallest there is.
        llm = load_model(
            extra_buffers_default() if extra_buffers is None else extra_buffers,
            model_path=self.model_path,
            n_ctx=LOADER_CTX,
            n_batch=LOADER_CTX,
            n_threads=1,
            n_threads_batch=1,
            verbose=verbose,
        )
        if not verbose:
            silence_llama_logs()
        self._n_ctx = min(llm._model.n_ctx_train(), MAX_DEFAULT_CTX) if n_ctx is None else n_ctx
        parallel = n_parallel or int(os.environ.get("OAM_LLAMA_PARALLEL", "0")) or DEFAULT_PARALLEL
        eos_id, bos_id = llm.token_eos(), llm.token_bos()
        eos = llm.detokenize([eos_id], special=True).decode("utf-8", "ignore") if eos_id >= 0 else ""
        bos = llm.detokenize([bos_id], special=True).decode("utf-8", "ignore") if bos_id >= 0 else ""
        self._renderer = PromptRenderer(llm.metadata.get("tokenizer.chat_template"), eos, bos)
        if self._renderer.source == TEMPLATE_FALLBACK:
            _warn_no_template(self.model_path)
        self._llm = llm
        self._gen = Generator(
            llm, self._n_ctx, self._states, max(1, parallel), *self.threads, self._renderer.stop_markers
        )
        self._gen.scan_vocabulary()

    # -- interface -------------------------------------------------------------------
    @property
    def context_size(self) -> int:
        return self._n_ctx

    def info(self) -> EngineInfo:
        return EngineInfo(
            name="llama",
            available=self._available and self._llm is not None,
            reason=self._reason,
            context_size=self._n_ctx,
            features=[*FEATURES, "weak_tool_choice"] if self.weak_tool_choice else list(FEATURES),
            cpu_variant=cpu_variant(),
            chat_template=self._renderer.source if self._llm is not None else None,
            threads=self.threads[0] if self._llm is not None else None,
            batch_threads=self.threads[1] if self._llm is not None else None,
        )

    def _tokens(self, prompt: str) -> list[int]:
        """The prompt's tokens; any thread. Tokenizing only reads the vocabulary; the count
        of tokenizations in flight lets ``aclose`` free the model only after them."""
        with self._counting:
            if self._closed or self._llm is None:
                raise BridgeError("model_unavailable", self._reason or "engine closed")
            self._counts_in_flight += 1
        try:
            return list(self._llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))
        finally:
            with self._counting:
                self._counts_in_flight -= 1
                self._counting.notify_all()

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        """Tokens of the prompt rendered as a step with these tools would see it. Safe on any
        thread; the last ``COUNT_CACHE_SIZE`` prompts' counts are remembered."""
        # a digest: prompts can be megabytes, and hashing them is far cheaper than tokenizing
        key = hashlib.blake2b(msgspec.json.encode((instructions, messages, tools)), digest_size=16).digest()
        with self._counting:
            hit = self._counts.get(key)
            if hit is not None:
                self._counts.move_to_end(key)
                return hit
        if self._llm is None:
            raise BridgeError("model_unavailable", self._reason or "model not loaded")
        n = len(self._tokens(self._renderer.render(instructions, messages, tools)))
        with self._counting:
            self._counts[key] = n
            if len(self._counts) > COUNT_CACHE_SIZE:
                self._counts.popitem(last=False)
        return n

    def forget(self, npc_id: str) -> None:
        if self._llm is not None:
            self._gen.forget(npc_id)
        else:
            self._states.forget(npc_id)

    async def aclose(self) -> None:
        def close() -> None:
            with self._counting:
                self._closed = True
                while self._counts_in_flight:
                    self._counting.wait()
                self._counts.clear()
            if self._llm is not None:
                self._gen.close()  # ends the scheduler; steps still running fail model_unavailable
                self._llm = None

        await trio.to_thread.run_sync(close)

    async def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]:
        """Text deltas, then (when the output is a call batch) one ToolCallsChunk, then
        StepDone. The request's tools and tool mode are used as given; the engine reports
        what the model produced and the agent decides what it means."""
        if self._llm is None:
            raise BridgeError("model_unavailable", self._reason or "model not loaded")
        warnings: list[str] = []

        def job(stop: threading.Event, emit: Emit) -> None:
            # Rendering, tokenizing and building the grammar take milliseconds: done here,
            # on the step's thread, never on trio's.
            prompt = self._renderer.render(
                request.instructions, request.messages, request.tools, request.tool_mode, request.schema
            )
            tokens = self._tokens(prompt)
            try:
                grammar_text, grammar_warnings = build_grammar(request)
            except Exception as e:
                raise BridgeError("invalid_schema", f"cannot build grammar: {e}") from e
            warnings.extend(grammar_warnings)
            spoken = request.schema is None and not (request.tools and request.tool_mode == "required")
            boost: dict[int, float] = {}
            values = self._renderer.fact_values(request.messages) if spoken else []
            say = self._renderer.said_values(request.messages) if spoken and self.grounded else []
            if self.fact_bias and len(values) <= FACT_BIAS_MAX_VALUES:
                # a few values only: favouring a whole menu's prices makes the model say
                # strings of digits ("2513 20")
                for v in values:
                    if v in say:
                        continue  # favoured where a number may start, and said (_worker.Sampling._ground)
                    for form in (" " + v, v):
                        ids = self._tokens(form)
                        if ids:
                            boost[ids[0]] = self.fact_bias
            start = turn_start(request.messages)
            player = user_text(request.messages[start]) if start >= 0 else ""
            if spoken and request.speaker and _ASKS_NAME.search(player):
                for form in (" " + request.speaker, request.speaker):  # said once, then free
                    if ids := self._tokens(form):
                        boost[ids[0]] = NAME_BIAS
            recent: list[int] = []
            # The NPC's last lines count as said, except where a bias favours the facts or the
            # name, or a count must be said: those should be said even if an earlier line said them.
            if spoken and not boost and not say:
                lines = [m.content for m in request.messages if m.role == "assistant" and m.content][-RECENT_LINES:]
                if start >= 0 and request.messages[start].name:
                    # another NPC's line: the bundled model otherwise says it back word for word
                    lines.append(request.messages[start].content)
                recent = self._tokens(" ".join(lines)) if lines else []
            unlabel = spoken and any(m.role == "user" and m.name for m in request.messages)
            done = self._gen.generate(
                request.npc_id,
                tokens,
                grammar_text,
                request.options,
                spoken,
                request.speaker if spoken else None,
                stop,
                emit,
                boost,
                recent,
                unlabel,
                say,
                request.lead if spoken else None,
            )
            if done is not None:
                emit(("done", *done))

        sniff = CallSniffer(bool(request.tools))  # output held while it may be a call batch
        try:
            async with aclosing(run_in_thread(job)) as items:
                async for item in items:
                    if item[0] == "text":
                        if shown := sniff.feed(item[1]):
                            yield TextChunk(shown)
                        continue
                    usage, finish = item[1], item[2]
                    raw, rest = sniff.end(finish)
                    if raw:
                        calls = [
                            ToolCall(
                                id=f"call_{uuid.uuid4().hex[:8]}", name=c["name"], arguments=c.get("arguments") or {}
                            )
                            for c in raw
                        ]
                        yield ToolCallsChunk(calls)
                        finish = "tool_calls"
                    elif rest:
                        yield TextChunk(rest)
                    yield StepDone(usage=usage, finish_reason=finish, warnings=warnings)
        except BridgeError:
            raise
        except Exception as e:
            raise BridgeError("generation_failed", f"llama generation failed: {type(e).__name__}: {e}") from e

    async def prewarm(self, request: StepRequest) -> Usage:
        """``npc/prewarm``: reads the start of the NPC's next prompt (the system message with
        its instructions, facts and tools, then the history: ``request.messages``, no new
        line) into the NPC's context, on the generation thread as a step reads its prompt,
        and generates nothing. The NPC's next step then reads only its new line. Usage: the
        prefix's tokens, and those already in the context (``cached_tokens``). Cancelling
        the calling task stops the reading within a prompt chunk."""
        if self._llm is None:
            raise BridgeError("model_unavailable", self._reason or "model not loaded")

        def job(stop: threading.Event, emit: Emit) -> None:
            prompt = self._renderer.render_prefix(
                request.instructions,
                request.messages,
                request.tools,
                request.tool_mode,
                request.schema,
                request.prompt_prefix,
            )
            usage = self._gen.prewarm(request.npc_id, self._tokens(prompt), stop)
            if usage is not None:
                emit(("done", usage))

        usage = Usage()
        try:
            async with aclosing(run_in_thread(job)) as items:
                async for item in items:
                    usage = item[1]
        except BridgeError:
            raise
        except Exception as e:
            raise BridgeError("generation_failed", f"llama prewarm failed: {type(e).__name__}: {e}") from e
        return usage

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone, tokenized as the prompt tokenizes it, with no chat template
        around it (``tokens/count``; ``""`` is 0). Any thread, like ``count_tokens``."""
        return len(self._tokens(text)) if text else 0
