"""NativeEngine: the Swift library libOamNative (native/) through cffi ABI mode.

The C declarations are read from native/include/oam_native.h (between the
OAM_CDEF_BEGIN/END markers, preprocessor lines stripped): the header is the single
source of the ABI. The library runs one model step; the agent loop stays in Python.
Events are pulled on a trio worker thread with short timeouts, so cancelling the
calling task reaches the native step within one timeout (oam_step_cancel).
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import trio

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
)
from bridge.errors import ERROR_CODES, BridgeError

_NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
HEADER_PATH = _NATIVE_DIR / "include" / "oam_native.h"
POLL_MS = 50
MAX_BATCH = 256  # events taken per thread hop

_lock = threading.Lock()
_loaded: tuple[Any, Any] | None = None


def read_cdef(header: Path = HEADER_PATH) -> str:
    """The declarations between the OAM_CDEF markers, with preprocessor lines removed."""
    text = header.read_text()
    begin, end = "/* OAM_CDEF_BEGIN */", "/* OAM_CDEF_END */"
    body = text[text.index(begin) + len(begin) : text.index(end)]
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))


def find_library() -> Path | None:
    env = os.environ.get("OAM_NATIVE_LIB")
    if env:
        return Path(env) if Path(env).exists() else None
    names = ("libOamNative.so", "libOamNative.dylib")
    candidates = [_NATIVE_DIR / ".build" / "release" / n for n in names]
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
            ffi.cdef(read_cdef())
            lib = ffi.dlopen(str(path))
            if lib.oam_abi_version() != 1:
                raise BridgeError("model_unavailable", f"libOamNative ABI {lib.oam_abi_version()} != 1")
            _loaded = (ffi, lib)
        return _loaded


def availability() -> tuple[bool, str | None]:
    try:
        load()
    except BridgeError as e:
        return False, e.message
    except Exception as e:  # dlopen / cdef failure
        return False, f"cannot load libOamNative: {e}"
    return True, None


def _take_string(ffi: Any, lib: Any, p: Any) -> str | None:
    """Copy and free a library-allocated string exactly once."""
    if p == ffi.NULL:
        return None
    try:
        return ffi.string(p).decode("utf-8")
    finally:
        lib.oam_string_free(p)


def _error_from(payload: dict[str, Any] | None, default: str = "generation_failed") -> BridgeError:
    payload = payload or {}
    code = payload.get("code") or default
    if code not in ERROR_CODES:
        code = default
    return BridgeError(code, payload.get("message") or code)


_enc = msgspec.json.Encoder()


def _request_json(request: StepRequest) -> bytes:
    return _enc.encode(
        {
            "npcId": request.npc_id,
            "instructions": request.instructions,
            "messages": request.messages,
            "tools": request.tools if request.tool_mode != "disallowed" else [],
            "toolMode": request.tool_mode,
            "schema": request.schema,
            "options": request.options,
            "stepIndex": request.step_index,
        }
    )


class NativeEngine:
    name = "native"

    def __init__(self, backend: str = "scripted", script: list[dict[str, Any]] | None = None, **config: Any) -> None:
        self._ffi, self._lib = load()
        cfg = {"backend": backend, **config}
        if script is not None:
            cfg["script"] = script
        err = self._ffi.new("char **")
        h = self._lib.oam_engine_create(_enc.encode(cfg), err)
        if h == self._ffi.NULL:
            raise _error_from(msgspec.json.decode(_take_string(self._ffi, self._lib, err[0]) or "{}"), "model_unavailable")
        # ffi.gc: destroyed exactly once, by aclose() (ffi.release) or by garbage collection.
        self._h = self._ffi.gc(h, self._lib.oam_engine_destroy)
        self._config = cfg
        self._npc_handles: dict[str, Any] = {}  # per-NPC scripted models (npc/create's script)
        self._closed = False
        raw = _take_string(self._ffi, self._lib, self._lib.oam_engine_info(self._h)) or "{}"
        self._info: dict[str, Any] = msgspec.json.decode(raw)

    @property
    def context_size(self) -> int:
        return int(self._info.get("contextSize", 0))

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            available=bool(self._info.get("available", False)),
            reason=self._info.get("reason"),
            context_size=self.context_size,
            features=list(self._info.get("features", [])),
        )

    def _check(self) -> None:
        if self._closed:
            raise BridgeError("model_unavailable", "engine closed")

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        self._check()
        n = self._lib.oam_count_tokens(
            self._h, _enc.encode({"instructions": instructions, "messages": messages, "tools": tools})
        )
        if n < 0:
            raise BridgeError("invalid_request", "oam_count_tokens rejected the request")
        return int(n)

    def set_script(self, npc_id: str, steps: list[Any]) -> None:
        """Give one NPC its own scripted model behind the same ABI."""
        self._check()
        err = self._ffi.new("char **")
        h = self._lib.oam_engine_create(_enc.encode({**self._config, "backend": "scripted", "script": steps}), err)
        if h == self._ffi.NULL:
            raise _error_from(msgspec.json.decode(_take_string(self._ffi, self._lib, err[0]) or "{}"), "invalid_request")
        self.forget(npc_id)
        self._npc_handles[npc_id] = self._ffi.gc(h, self._lib.oam_engine_destroy)

    def _start(self, request: StepRequest) -> Any:
        err = self._ffi.new("char **")
        handle = self._npc_handles.get(request.npc_id, self._h)
        step = self._lib.oam_step_start(handle, _request_json(request), err)
        if step == self._ffi.NULL:
            raise _error_from(msgspec.json.decode(_take_string(self._ffi, self._lib, err[0]) or "{}"), "invalid_request")
        return step

    def _next(self, step: Any, out: Any) -> tuple[int, list[dict[str, Any]]]:
        """Runs on a worker thread (cffi drops the GIL during the call). Waits up to
        POLL_MS for one event, then takes whatever else is already queued (up to
        MAX_BATCH) without waiting, so one thread hop carries many events."""
        rc = self._lib.oam_step_next(step, POLL_MS, out)
        events: list[dict[str, Any]] = []
        while rc == 1:
            events.append(msgspec.json.decode(_take_string(self._ffi, self._lib, out[0]) or "{}"))
            if len(events) >= MAX_BATCH or events[-1].get("type") in ("done", "error"):
                break
            rc = self._lib.oam_step_next(step, 0, out)
        return (1 if events else rc), events

    async def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]:
        self._check()
        step = self._start(request)
        out = self._ffi.new("char **")
        finished = False
        try:
            while True:
                rc, batch = await trio.to_thread.run_sync(self._next, step, out, abandon_on_cancel=False)
                if rc == 0:
                    continue
                if rc < 0:
                    finished = True
                    raise BridgeError("generation_failed", "native step ended without a done event")
                for ev in batch:
                    kind = ev.get("type")
                    if kind == "text":
                        yield TextChunk(ev.get("delta", ""))
                    elif kind == "toolCalls":
                        yield ToolCallsChunk(
                            [ToolCall(c["id"], c["name"], c.get("arguments") or {}) for c in ev.get("calls", [])]
                        )
                    elif kind == "done":
                        finished = True
                        u = ev.get("usage") or {}
                        yield StepDone(
                            Usage(
                                input_tokens=int(u.get("inputTokens", 0)),
                                output_tokens=int(u.get("outputTokens", 0)),
                                cached_tokens=int(u.get("cachedTokens", 0)),
                            ),
                            ev.get("finishReason", "stop"),
                        )
                        return
                    elif kind == "error":
                        finished = True
                        raise _error_from(ev)
        finally:
            # Reached on done, error, trio cancellation and aclose() of the generator.
            # No worker thread is inside oam_step_next here (abandon_on_cancel=False).
            if not finished:
                self._lib.oam_step_cancel(step)
            self._lib.oam_step_free(step)

    def forget(self, npc_id: str) -> None:
        """Drop the NPC's own scripted model, if it has one (a step still running keeps
        its engine alive: each step holds a reference)."""
        h = self._npc_handles.pop(npc_id, None)
        if h is not None:
            self._ffi.release(h)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            for h in self._npc_handles.values():
                self._ffi.release(h)
            self._npc_handles.clear()
            self._ffi.release(self._h)
