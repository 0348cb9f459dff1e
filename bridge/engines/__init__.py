"""Engine registry: which engines exist, which are available and why not, and ``auto``."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from ..errors import BridgeError
from .base import Engine, EngineInfo
from .scripted import ScriptedEngine

log = logging.getLogger("oam_bridge.engines")

# name -> (module, class); loaded lazily so a missing optional dependency only disables one.
_OPTIONAL = {"native": ("bridge.engines.native", "NativeEngine"), "llama": ("bridge.engines.llama", "LlamaEngine")}
AUTO_ORDER = ("native", "llama")


class EngineRegistry:
    def __init__(self, default: str = "auto", scripted: ScriptedEngine | None = None, **engine_kwargs: Any) -> None:
        self.default = default
        self._engines: dict[str, Engine] = {"scripted": scripted or ScriptedEngine()}
        self._kwargs = engine_kwargs  # per engine name: constructor kwargs

    def _availability(self, name: str) -> tuple[bool, str | None]:
        if name == "scripted":
            return True, None
        mod_name, _ = _OPTIONAL[name]
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            return False, f"not installed: {e}"
        try:
            return mod.availability()  # type: ignore[no-any-return]
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
            if cand == "native" and sys.platform != "darwin":
                # Elsewhere the library carries only its scripted model: never a default.
                reasons.append("native: Apple's model exists only on macOS")
                continue
            ok, reason = self._availability(cand)
            if ok:
                return cand
            reasons.append(f"{cand}: {reason}")
        raise BridgeError("model_unavailable", "no model engine is available (" + "; ".join(reasons) + ")")

    def get(self, name: str) -> Engine:
        name = self.resolve(name)
        eng = self._engines.get(name)
        if eng is not None:
            return eng
        ok, reason = self._availability(name)
        if not ok:
            raise BridgeError("model_unavailable", f"engine {name!r} is unavailable: {reason}", engine=name)
        mod_name, cls_name = _OPTIONAL[name]
        cls = getattr(importlib.import_module(mod_name), cls_name)
        try:
            eng = cls(**self._kwargs.get(name, {}))
        except Exception as e:
            log.exception("engine %s failed to start", name)
            raise BridgeError("model_unavailable", f"engine {name!r} failed to start: {e}", engine=name) from None
        self._engines[name] = eng
        return eng

    async def aclose(self) -> None:
        for eng in self._engines.values():
            await eng.aclose()
