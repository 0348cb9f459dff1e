"""Engine registry: which engines exist, which are available and why not, and ``auto``."""

from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import Any

import trio

from bridge.engines.base import Engine, EngineInfo
from bridge.engines.scripted import ScriptedEngine
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge.engines")


def _default_model(name: str) -> str:
    if name != "llama":
        return ""
    from bridge.engines.llama import default_model_path

    return default_model_path()


def _model_file(model: str) -> str:
    """``npc/create``'s ``model`` as a file: a catalog name (``oam models``) is its downloaded
    file, ``model_unavailable`` when not downloaded; anything else is a path."""
    from bridge.engines.llama import resolve_model

    return resolve_model(model)


def _unusable_model(model: str, engine: str = "llama", why: str = "") -> BridgeError:
    """The one error for a model file the game named that its engine cannot use; ``why``: the
    native library's own reason (Apple's adapter loader names what is wrong with the file)."""
    if engine == "native":
        what = f"model {model!r} ({os.path.abspath(model)}) is not an Apple adapter file the native engine can load"
    else:
        what = f"model {model!r} ({os.path.abspath(_model_file(model))}) is not a GGUF file the llama engine can load"
    return BridgeError(
        "model_unavailable",
        f"{what} (a relative path is relative to the bridge's working directory){': ' + why if why else ''}",
        engine=engine,
        model=model,
    )


# name -> (module, class); loaded lazily so a missing optional dependency only disables one.
_OPTIONAL = {
    "native": ("bridge.engines.native", "NativeEngine"),
    "llama": ("bridge.engines.llama", "LlamaEngine"),
    # NPCs on an OpenAI-compatible server: available once a URL is configured; never auto
    "openai": ("bridge.engines.openai", "OpenAIEngine"),
}
AUTO_ORDER = ("native", "llama")


class EngineRegistry:
    def __init__(self, default: str = "auto", scripted: ScriptedEngine | None = None, **engine_kwargs: Any) -> None:
        self.default = default
        self._engines: dict[str, Engine] = {"scripted": scripted or ScriptedEngine()}
        # per engine name: constructor kwargs. The native engine runs Apple's model where the
        # library can, else its scripted test backend (which auto never picks).
        self._kwargs = {"native": {"backend": "best"}, **engine_kwargs}
        self._starting = threading.Lock()  # one construction at a time (preload thread vs get)

    def _availability(self, name: str, model_path: str | None = None) -> tuple[bool, str | None]:
        """(available, reason): the reason says why not; for an engine that runs but is not a
        model (the native library's scripted test backend) it says what runs instead, and
        ``auto`` never picks it."""
        if name == "scripted":
            return True, None
        mod_name, _ = _OPTIONAL[name]
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            return False, f"not installed: {e}"
        try:
            if name == "openai":
                return mod.availability(self._kwargs.get(name, {}).get("url"))  # type: ignore[no-any-return]
            path = model_path or self._kwargs.get(name, {}).get("model_path")
            return mod.availability(path) if path else mod.availability()  # type: ignore[no-any-return]
        except Exception as e:  # availability probes must never take the bridge down
            return False, f"{type(e).__name__}: {e}"

    def infos(self) -> list[EngineInfo]:
        out = []
        for name in ("scripted", *_OPTIONAL):
            if name in self._engines:
                out.append(self._engines[name].info())
                continue
            ok, reason = self._availability(name)
            out.append(EngineInfo(name=name, available=ok, reason=reason))
        return out

    def resolve(self, name: str) -> str:
        if name == "auto":
            name = self.default
        if name != "auto":
            if name not in self._engines and name not in _OPTIONAL:
                raise BridgeError("invalid_params", f"unknown engine {name!r}", engine=name)
            return name
        reasons = []
        for cand in AUTO_ORDER:
            ok, reason = self._availability(cand)
            if ok and reason is None:
                return cand
            reasons.append(f"{cand}: {reason}")
        raise BridgeError("model_unavailable", "no model engine is available (" + "; ".join(reasons) + ")")

    def _key(self, name: str, model: str | None) -> tuple[str, str, dict[str, Any]]:
        name = self.resolve(name)
        key = name
        kwargs = dict(self._kwargs.get(name, {}))
        if model is not None and name == "llama":  # a GGUF file
            path = os.path.realpath(_model_file(model))
            if path != os.path.realpath(kwargs.get("model_path") or _default_model(name)):
                key, kwargs["model_path"] = f"{name}@{path}", path
        elif model is not None and name == "native":  # an Apple adapter file (.fmadapter)
            # one engine per file, named to the library as the game named it (made absolute): an
            # error never names a file the game did not (a symlink's target)
            key, kwargs["adapter"] = f"{name}@{os.path.realpath(model)}", os.path.abspath(model)
        return name, key, kwargs

    def started(self, name: str, model: str | None = None) -> bool:
        """Whether ``get(name, model)`` would return without starting an engine."""
        return self._key(name, model)[1] in self._engines

    def get(self, name: str, model: str | None = None) -> Engine:
        """The engine ``name`` resolves to, started on first use. ``model``: the llama engine
        on another GGUF file (one loaded model per file, shared by the NPCs that name it), or
        the native engine on an Apple adapter file (one engine per file); a relative path is
        relative to the bridge's working directory."""
        name, key, kwargs = self._key(name, model)
        eng = self._engines.get(key)
        if eng is not None:
            return eng
        with self._starting:
            return self._start(name, key, kwargs, model if key != name else None)

    def _start(self, name: str, key: str, kwargs: dict[str, Any], named: str | None = None) -> Engine:
        """``named``: the model file as the game named it, when it is not the bridge's own.
        Every way such a file can be unusable (missing, unreadable, not GGUF, failing to load)
        gets the same error, naming only the path the game gave: a create is no probe of
        the bridge's file system, and never names a file the game did not (a symlink's target)."""
        eng = self._engines.get(key)
        if eng is not None:  # the preload thread finished while we waited
            return eng
        if named is not None and name == "llama":
            from bridge.engines.llama import model_file_problem

            if model_file_problem(kwargs["model_path"]) is not None:
                raise _unusable_model(named)
        if named is not None and name == "native" and not os.path.exists(kwargs["adapter"]):
            raise _unusable_model(named, name)
        ok, reason = self._availability(name, kwargs.get("model_path"))
        if not ok:
            raise BridgeError("model_unavailable", f"engine {name!r} is unavailable: {reason}", engine=name)
        mod_name, cls_name = _OPTIONAL[name]
        cls = getattr(importlib.import_module(mod_name), cls_name)
        try:
            started: Engine = cls(**kwargs)
        except Exception as e:
            # A model that does not load is the operator's or the game's file, not a bug here:
            # one line on stderr; the traceback only at debug level.
            log.warning("engine %s failed to start: %s", key, e)
            log.debug("engine %s failed to start", key, exc_info=True)
            if named is not None:
                raise _unusable_model(named, name, str(e) if name == "native" else "") from None
            raise BridgeError("model_unavailable", f"engine {name!r} failed to start: {e}", engine=name) from None
        self._engines[key] = started
        return started

    async def start(self, name: str = "auto", model: str | None = None) -> None:
        """Start the engine ``get(name, model)`` would return, in a worker thread: loading
        weights takes from a fraction of a second to many, and the trio loop goes on
        meanwhile. Failures are only logged: the ``npc/create`` that needs the engine
        reports them, in order."""
        try:
            if not self.started(name, model):
                await trio.to_thread.run_sync(self.get, name, model, abandon_on_cancel=True)
                log.info("engine %s started", name)
        except Exception as e:  # noqa: BLE001 - see above
            log.info("starting engine %s failed: %s", name, e)

    async def aclose(self) -> None:
        for eng in self._engines.values():
            await eng.aclose()
