"""NativeEngine: the Swift library libOamNative (native/) through cffi ABI mode.

The C declarations come from native/include/oam_native.h, the single source of the ABI:
the region between its OAM_CDEF_BEGIN/END markers (preprocessor lines stripped) is
generated into ``bridge/engines/_native_cdef.py`` (``python -m bridge.engines.native``
rewrites it; a test fails when the two differ), so an installed package needs no source
tree. The library is found at ``$OAM_NATIVE_LIB``, else beside the program in a frozen build
(packaging/), else in the source tree's ``native/.build`` when the package runs from a checkout.

The library runs one model step; the agent loop stays in Python.
Events cross the ABI in batches (ABI 2, oam_step_pull): one pull hands over every queued
event in library-owned buffers: text deltas as raw UTF-8, back to back, with end offsets
in bytes and in code points; JSON only for toolCalls/done/error. A batch is decoded with
one str() of the whole payload buffer and one ffi.unpack of the offsets, then sliced.
A non-blocking pull runs on the trio thread; only when nothing is queued does a blocking
pull (POLL_MS) go to a worker thread, so cancelling the calling task reaches the native
step within one timeout (oam_step_cancel).
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import msgspec
import trio

from bridge.engines._native_cdef import CDEF
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
from bridge.errors import ERROR_CODES, EVENT_DATA, BridgeError

# Only meaningful in a source checkout (the package sits beside native/).
_NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
HEADER_PATH = _NATIVE_DIR / "include" / "oam_native.h"
CDEF_MODULE = Path(__file__).resolve().with_name("_native_cdef.py")
POLL_MS = 50
ABI_VERSION = 2
EV_TEXT, EV_TOOL_CALLS, EV_DONE, EV_ERROR = 1, 2, 3, 4  # oam_event_kind
COUNT_CACHE_SIZE = 512  # prompts whose token count is remembered
# What the library takes (native/Sources/OamNative/PlanSchema.swift, PlanTranscript.swift):
# beyond these a Double -> Int conversion in Swift would trap and take the process down, so
# they are refused here before the call as well.
MAX_INTEGER_BOUND = 9.0e15  # |minimum|, |maximum|, exclusive* of an integer schema
MAX_ELEMENT_COUNT = 2**31 - 1  # minItems, maxItems
MAX_TEMPERATURE = 1.0  # Apple documents GenerationOptions.temperature as 0...1

_lock = threading.Lock()
_loaded: tuple[Any, Any] | None = None


def read_cdef(header: Path = HEADER_PATH) -> str:
    """The declarations between the OAM_CDEF markers of ``header``, with preprocessor lines
    removed (what ``_native_cdef.CDEF`` must equal)."""
    text = header.read_text()
    begin, end = "/* OAM_CDEF_BEGIN */", "/* OAM_CDEF_END */"
    body = text[text.index(begin) + len(begin) : text.index(end)]
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))


def cdef_module_text(cdef: str) -> str:
    """The source of ``_native_cdef.py`` for ``cdef``."""
    if '"""' in cdef or "\\" in cdef:
        raise ValueError("the cdef region must not contain triple quotes or backslashes")
    return (
        '"""Generated from native/include/oam_native.h (its OAM_CDEF region) by\n'
        "``python -m bridge.engines.native``; do not edit. tests/native/test_native_engine.py fails\n"
        'when this copy and the header differ."""\n\n'
        f'CDEF = """{cdef}"""\n'
    )


def find_library() -> Path | None:
    env = os.environ.get("OAM_NATIVE_LIB")
    if env:
        return Path(env) if Path(env).exists() else None
    names = ("libOamNative.so", "libOamNative.dylib")
    bundle: str | None = getattr(sys, "_MEIPASS", None)  # a frozen build (packaging/): its own folder
    candidates = [Path(bundle) / n for n in names] if bundle is not None else []
    candidates += [_NATIVE_DIR / ".build" / "release" / n for n in names]
    for n in names:
        candidates += [Path(p) for p in sorted(glob.glob(str(_NATIVE_DIR / ".build" / "*" / "release" / n)))]
    return next((c for c in candidates if c.exists()), None)


def load() -> tuple[Any, Any]:
    """(ffi, lib), loaded once per process."""
    global _loaded
    with _lock:
        if _loaded is None:
            import cffi

            path = find_library()
            if path is None:
                raise BridgeError("model_unavailable", "libOamNative not found (set OAM_NATIVE_LIB or build native/)")
            ffi = cffi.FFI()
            ffi.cdef(CDEF)
            lib: Any = ffi.dlopen(str(path))
            if lib.oam_abi_version() != ABI_VERSION:
                raise BridgeError(
                    "model_unavailable", f"libOamNative ABI {lib.oam_abi_version()} != {ABI_VERSION} (rebuild native/)"
                )
            _loaded = (ffi, lib)
        return _loaded


def _take_string(ffi: Any, lib: Any, p: Any) -> str | None:
    """Copy and free a library-allocated string exactly once."""
    if p == ffi.NULL:
        return None
    try:
        raw: bytes = ffi.string(p)
        return raw.decode("utf-8")
    finally:
        lib.oam_string_free(p)


def _error_from(payload: dict[str, Any] | None, default: str = "generation_failed") -> BridgeError:
    """The library's error event as a BridgeError; its ``data`` figures a game acts on
    (``retryAfterMs``, ``promptTokens``, ``contextSize``: non-negative integers) kept."""
    payload = payload or {}
    code = payload.get("code") or default
    if code not in ERROR_CODES:
        code = default
    raw = payload.get("data")
    data = {
        k: v
        for k, v in (raw.items() if isinstance(raw, dict) else ())
        if k in EVENT_DATA and type(v) is int and 0 <= v < 2**53
    }
    return BridgeError(code, payload.get("message") or code, **data)


_enc = msgspec.json.Encoder()
_no_apple: str | None = None  # why the library has no Apple backend here, once known


def apple_model() -> tuple[bool, str | None]:
    """(available, reason): whether this library can run Apple's on-device model here. Asks
    its ``apple`` backend (not prewarmed); off macOS 26 that backend does not exist at all,
    which is remembered. The library must load (``load``)."""
    global _no_apple
    if _no_apple is not None:
        return False, _no_apple
    ffi, lib = load()
    err = ffi.new("char **")
    h = lib.oam_engine_create(_enc.encode({"backend": "apple", "prewarm": False}), err)
    if h == ffi.NULL:
        _no_apple = _error_from(
            msgspec.json.decode(_take_string(ffi, lib, err[0]) or "{}"), "model_unavailable"
        ).message
        return False, _no_apple
    try:
        info = msgspec.json.decode(_take_string(ffi, lib, lib.oam_engine_info(h)) or "{}")
    finally:
        lib.oam_engine_destroy(h)
    return bool(info.get("available")), info.get("reason")


def _languages(raw: Any) -> list[str] | None:
    """The library's ``languages`` (a list of BCP 47 strings), or None."""
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        return None
    return list(raw)


def scripted_backend_note(why: str | None) -> str:
    """The ``reason`` an engine info carries when the library runs its scripted model; ``why``:
    why Apple's model is not available (None: it is, and the scripted one was asked for)."""
    what = f"Apple's model is not available here ({why})" if why else "started on the scripted model"
    return (
        f"test backend only: {what}; an NPC on this engine plays its script, then echoes the prompt, "
        "and auto never picks it"
    )


def availability() -> tuple[bool, str | None]:
    """(available, reason). Available: the library loads, so an NPC created on engine
    ``native`` runs. The reason says why not; or, for an available library that cannot run
    Apple's model here (Linux, Windows, a Mac without Apple Intelligence), that what runs is
    the scripted test backend: ``auto`` never picks an engine that is available with a reason."""
    try:
        load()
        ok, why = apple_model()
    except BridgeError as e:
        return False, e.message
    except Exception as e:  # dlopen / cdef failure
        return False, f"cannot load libOamNative: {e}"
    return True, None if ok else scripted_backend_note(why)


def _with_property_order(schema: Any) -> Any:
    """``schema`` with an ``x-order`` list beside every ``properties``: the library's JSON
    objects are unordered, and the model generates properties in the order it is given."""
    if isinstance(schema, list):
        return [_with_property_order(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _with_property_order(v) for k, v in schema.items()}
    props = schema.get("properties")
    if isinstance(props, dict) and "x-order" not in schema:
        out["x-order"] = list(props)
    return out


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def check_schema_numbers(schema: Any, path: str = "#") -> None:
    """Raise ``invalid_schema`` for a count or integer bound the library cannot hold
    (``MAX_ELEMENT_COUNT``, ``MAX_INTEGER_BOUND``), anywhere in ``schema``."""
    if isinstance(schema, list):
        for i, x in enumerate(schema):
            check_schema_numbers(x, f"{path}/{i}")
        return
    if not isinstance(schema, dict):
        return
    for key in ("minItems", "maxItems"):
        n = _number(schema.get(key))
        if n is not None and not n <= MAX_ELEMENT_COUNT:
            raise BridgeError(
                "invalid_schema", f"{path}: {key} {schema[key]} is out of range (0 to {MAX_ELEMENT_COUNT})"
            )
    if schema.get("type") == "integer":
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            n = _number(schema.get(key))
            if n is not None and not abs(n) <= MAX_INTEGER_BOUND:
                raise BridgeError(
                    "invalid_schema",
                    f"{path}: {key} {schema[key]} is out of range (integers are bounded by ±{MAX_INTEGER_BOUND:.0e})",
                )
    for key, value in schema.items():
        if isinstance(value, (dict, list)):
            check_schema_numbers(value, f"{path}/{key}")


def check_request(request: StepRequest) -> None:
    """What the library would refuse, refused before the call with the same codes:
    ``invalid_params`` for a temperature above Apple's range, ``invalid_schema`` for schema
    numbers out of range (``check_schema_numbers``)."""
    t = request.options.temperature
    if t is not None and t > MAX_TEMPERATURE:
        raise BridgeError(
            "invalid_params", f"options.temperature must be in [0, {MAX_TEMPERATURE:g}] on the native engine, got {t}"
        )
    check_schema_numbers(request.schema)
    for tool in request.tools:
        check_schema_numbers(tool.parameters, f"tool {tool.name}")


def _spoken(messages: list[Message]) -> list[Message]:
    """The messages as the library takes them: a user line someone other than the player
    said carries its speaker in its text, ``Name: line`` (``base.user_text``), as on every
    engine; the library's messages have no speaker."""
    return [
        msgspec.structs.replace(m, content=user_text(m), name=None) if m.role == "user" and m.name else m
        for m in messages
    ]


def _request_json(request: StepRequest, prewarm: bool = False) -> bytes:
    """The StepRequest JSON of the ABI. Tools and tool mode go as given: the library
    reports what the model did, and the agent decides what it means. ``prewarm``: the
    request is ``npc/prewarm``'s (``"prewarm": true``): the library prepares the step
    whose messages these are, generates nothing and ends it with a done event."""
    body: dict[str, Any] = {
        "npcId": request.npc_id,
        "instructions": request.instructions,
        "messages": _spoken(request.messages),
        "tools": [
            {"name": t.name, "description": t.description, "parameters": _with_property_order(t.parameters)}
            for t in request.tools
        ],
        "toolMode": request.tool_mode,
        "schema": _with_property_order(request.schema),
        "options": request.options,
        "stepIndex": request.step_index,
    }
    if prewarm:
        body["prewarm"] = True
        if request.prompt_prefix:
            body["promptPrefix"] = request.prompt_prefix
    return _enc.encode(body)


class NativeEngine:
    """Thread-safety: ``count_tokens`` may run on any thread, also while steps stream
    (``blocking_count``: the agent calls it in a worker thread; the library's count reads
    only the request and immutable engine state). ``aclose`` on the trio thread releases
    the engine handle only once no count is in flight (the last count releases it
    otherwise). Every other method runs on the trio thread."""

    name = "native"
    blocking_count = True

    def __init__(self, backend: str = "scripted", script: list[dict[str, Any]] | None = None, **config: Any) -> None:
        """``backend``: ``scripted`` (every platform), ``apple`` (Apple's model), or ``best``:
        Apple's model where the library can run it here, else the scripted one (what the
        bridge's engine registry asks for)."""
        self._ffi, self._lib = load()
        if backend == "best":
            backend = "apple" if apple_model()[0] else "scripted"
        cfg = {"backend": backend, **config}
        if script is not None:
            cfg["script"] = script
        err = self._ffi.new("char **")
        h = self._lib.oam_engine_create(_enc.encode(cfg), err)
        if h == self._ffi.NULL:
            raise _error_from(
                msgspec.json.decode(_take_string(self._ffi, self._lib, err[0]) or "{}"), "model_unavailable"
            )
        # ffi.gc: destroyed exactly once, by aclose() (ffi.release) or by garbage collection.
        self._h = self._ffi.gc(h, self._lib.oam_engine_destroy)
        self._config = cfg
        self._npc_handles: dict[str, Any] = {}  # per-NPC scripted models (npc/create's script)
        self._closed = False
        self._guard = threading.Lock()  # _closed, _counts_in_flight, _released, _counts
        self._counts_in_flight = 0
        self._released = False
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        raw = _take_string(self._ffi, self._lib, self._lib.oam_engine_info(self._h)) or "{}"
        self._info: dict[str, Any] = msgspec.json.decode(raw)

    @property
    def context_size(self) -> int:
        return int(self._info.get("contextSize", 0))

    def info(self) -> EngineInfo:
        reason = self._info.get("reason")
        if reason is None and self._info.get("backend") == "scripted":
            reason = scripted_backend_note(apple_model()[1])
        return EngineInfo(
            name=self.name,
            available=bool(self._info.get("available", False)),
            reason=reason,
            context_size=self.context_size,
            features=list(self._info.get("features", [])),
            languages=_languages(self._info.get("languages")),
        )

    def _check(self) -> None:
        if self._closed:
            raise BridgeError("model_unavailable", "engine closed")

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        """The library's count (an estimate on the scripted backend); any thread. The last
        ``COUNT_CACHE_SIZE`` prompts' counts are remembered."""
        body = _enc.encode({"instructions": instructions, "messages": _spoken(messages), "tools": tools})
        with self._guard:
            if self._closed:
                raise BridgeError("model_unavailable", "engine closed")
            key = hashlib.blake2b(body, digest_size=16).digest()  # prompts can be megabytes
            hit = self._counts.get(key)
            if hit is not None:
                self._counts.move_to_end(key)
                return hit
            self._counts_in_flight += 1
        try:
            n = int(self._lib.oam_count_tokens(self._h, body))
        finally:
            with self._guard:
                self._counts_in_flight -= 1
                release = self._closed and not self._counts_in_flight
            if release:
                self._release()
        if n < 0:
            raise BridgeError("invalid_request", "oam_count_tokens rejected the request")
        with self._guard:
            self._counts[key] = n
            if len(self._counts) > COUNT_CACHE_SIZE:
                self._counts.popitem(last=False)
        return n

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone (``tokens/count``): the library counts whole prompts, so
        this is the count of ``text`` as the instructions less that of empty instructions."""
        return max(0, self.count_tokens(text, [], []) - self.count_tokens("", [], []))

    def set_script(self, npc_id: str, steps: list[Any]) -> None:
        """Give one NPC its own scripted model behind the same ABI."""
        self._check()
        err = self._ffi.new("char **")
        h = self._lib.oam_engine_create(_enc.encode({**self._config, "backend": "scripted", "script": steps}), err)
        if h == self._ffi.NULL:
            raise _error_from(
                msgspec.json.decode(_take_string(self._ffi, self._lib, err[0]) or "{}"), "invalid_request"
            )
        self.forget(npc_id)
        self._npc_handles[npc_id] = self._ffi.gc(h, self._lib.oam_engine_destroy)

    def _start(self, request: StepRequest, prewarm: bool = False) -> Any:
        check_request(request)
        err = self._ffi.new("char **")
        handle = self._npc_handles.get(request.npc_id, self._h)
        step = self._lib.oam_step_start(handle, _request_json(request, prewarm), err)
        if step == self._ffi.NULL:
            raise _error_from(
                msgspec.json.decode(_take_string(self._ffi, self._lib, err[0]) or "{}"), "invalid_request"
            )
        return step

    def _pull_blocking(self, step: Any, out: Any) -> int:
        """Runs on a worker thread (cffi drops the GIL during the call): waits up to
        POLL_MS for events. The batch is read afterwards on the trio thread, which is
        ordered before the next pull by trio's thread hand-off."""
        return int(self._lib.oam_step_pull(step, POLL_MS, out))

    def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]:
        return self._stream(request, prewarm=False)

    async def prewarm(self, request: StepRequest) -> Usage:
        """``npc/prewarm``: the step request with ``"prewarm": true``, driven like a step. On
        Apple's model the library builds the session the step would (instructions, tools,
        history) and prewarms it; the scripted backend does nothing and keeps its script.
        Either ends with a done event, whose usage this returns."""
        usage = Usage()
        async with aclosing(self._stream(request, prewarm=True)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, StepDone):
                    usage = chunk.usage
        return usage

    async def _stream(self, request: StepRequest, prewarm: bool) -> AsyncGenerator[Chunk, None]:
        self._check()
        ffi, lib = self._ffi, self._lib
        pull, buffer, unpack = lib.oam_step_pull, ffi.buffer, ffi.unpack
        step = self._start(request, prewarm)
        out = ffi.new("oam_batch **")
        finished = False
        try:
            while True:
                rc = pull(step, 0, out)  # never waits
                if rc == 0:
                    rc = await trio.to_thread.run_sync(self._pull_blocking, step, out, abandon_on_cancel=False)
                    if rc == 0:
                        continue
                if rc < 0:
                    finished = True
                    raise BridgeError("generation_failed", "native step ended without a done event")
                # Copy the batch out of the library's buffers before the next pull
                # (they stay valid until then; see "Ownership of batches" in the header).
                b = out[0]
                n = b.count
                text = str(buffer(b.data, b.size), "utf-8")
                ends = unpack(b.char_ends, n)
                # Leading text deltas (all of the batch, or all but a final non-text event,
                # the usual shapes) take the fast loop: one slice and one TextChunk each.
                m = b.text_count
                if m != n and (m != n - 1 or b.kinds[n - 1] == EV_TEXT):
                    m = 0
                s = 0
                for e in ends[:m] if m != n else ends:
                    yield TextChunk(text[s:e])
                    s = e
                if m == n:
                    await trio.lowlevel.checkpoint()  # one per batch: fairness and cancellation
                    continue
                for kind, e in zip(unpack(b.kinds + m, n - m), ends[m:], strict=True):
                    payload = text[s:e]
                    s = e
                    if kind == EV_TEXT:
                        yield TextChunk(payload)
                    elif kind == EV_TOOL_CALLS:
                        ev = msgspec.json.decode(payload)
                        yield ToolCallsChunk(
                            [ToolCall(c["id"], c["name"], c.get("arguments") or {}) for c in ev.get("calls", [])]
                        )
                    elif kind == EV_DONE:
                        finished = True
                        ev = msgspec.json.decode(payload)
                        u = ev.get("usage") or {}
                        yield StepDone(
                            Usage(
                                input_tokens=int(u.get("inputTokens", 0)),
                                output_tokens=int(u.get("outputTokens", 0)),
                                cached_tokens=int(u.get("cachedTokens", 0)),
                            ),
                            ev.get("finishReason", "stop"),
                            [str(w) for w in ev.get("warnings") or []],
                        )
                        return
                    elif kind == EV_ERROR:
                        finished = True
                        raise _error_from(msgspec.json.decode(payload))
                await trio.lowlevel.checkpoint()
        finally:
            # Reached on done, error, trio cancellation and aclose() of the generator.
            # No worker thread is inside oam_step_pull here (abandon_on_cancel=False).
            if not finished:
                lib.oam_step_cancel(step)
            lib.oam_step_free(step)

    def forget(self, npc_id: str) -> None:
        """Drop the NPC's own scripted model, if it has one (a step still running keeps
        its engine alive: each step holds a reference)."""
        h = self._npc_handles.pop(npc_id, None)
        if h is not None:
            self._ffi.release(h)

    def _release(self) -> None:
        """Destroys the engine handle exactly once."""
        with self._guard:
            if self._released:
                return
            self._released = True
        self._ffi.release(self._h)

    async def aclose(self) -> None:
        with self._guard:
            if self._closed:
                return
            self._closed = True
            self._counts.clear()
            idle = not self._counts_in_flight
        for h in self._npc_handles.values():
            self._ffi.release(h)
        self._npc_handles.clear()
        if idle:
            self._release()


def _write_cdef_module() -> None:
    """``python -m bridge.engines.native``: regenerate ``_native_cdef.py`` from the header."""
    CDEF_MODULE.write_text(cdef_module_text(read_cdef()))
    print(f"wrote {CDEF_MODULE.name} from {HEADER_PATH.name}", file=sys.stderr)


if __name__ == "__main__":
    _write_cdef_module()
