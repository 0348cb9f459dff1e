"""Apple's model can arrive after start-up (issue 34 item 3): its assets download while the game
runs (``modelNotReady``). ``auto`` is resolved at each ``npc/create``, not once at start-up, and
``engine/status`` probes again each time, so a game that polls ``engine/status`` sees the native
engine become available, and the NPCs it creates on ``auto`` from then on run on it, while
those created before keep their engine. Played here with the availability probe replaced (no Mac)."""

from __future__ import annotations

import pytest

from bridge import EngineRegistry
from bridge.engines import native


def test_auto_follows_the_model_when_it_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"ready": False}

    def availability() -> tuple[bool, str | None]:
        return (True, None) if state["ready"] else (False, "modelNotReady: the model's assets are downloading")

    monkeypatch.setattr(native, "availability", availability)
    registry = EngineRegistry()
    status = {e.name: e for e in registry.infos()}
    assert status["native"].available is False and "modelNotReady" in (status["native"].reason or "")
    assert registry.resolve("auto") == "llama", "while it downloads, auto is the llama engine"
    state["ready"] = True  # the download finished, the process still running
    status = {e.name: e for e in registry.infos()}
    assert status["native"].available is True and status["native"].reason is None, "engine/status says so"
    assert registry.resolve("auto") == "native", "NPCs created on auto from now on get Apple's model"
