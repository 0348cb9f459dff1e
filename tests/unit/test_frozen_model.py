"""Which model a frozen build (``make dist``, packaging/) starts on: the file in its own
``models/`` folder (``sys._MEIPASS``), the bundled SmolLM2 or the catalog model or file that
``DIST_MODEL`` put there instead, found without ``--model``; a catalog name resolves to the
bundled copy; only SmolLM2 is flagged ``weak_tool_choice``. A fake frozen folder stands in
for the build: no PyInstaller, no model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bridge.engines.llama import MODEL_FILE, LlamaEngine, default_model_path
from bridge.engines.llama import _catalog as cat
from bridge.errors import BridgeError

OTHER = "qwen2.5-0.5b-instruct-q4_k_m.gguf"  # the built-in catalog entry qwen2.5-0.5b's file


@pytest.fixture
def frozen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A frozen build's ``_internal`` folder, empty; returns its ``models/`` (not created)."""
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "_internal"), raising=False)
    for var in ("OAM_LLAMA_MODEL", cat.MODELS_DIR_ENV, cat.CATALOG_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(cat.MODELS_DIR_ENV, str(tmp_path / "pulled"))  # nothing pulled there
    (tmp_path / "_internal").mkdir()
    return tmp_path / "_internal" / "models"


def _put(folder: Path, name: str, data: bytes = b"GGUF not really a model") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


def test_a_build_without_a_model_has_no_default(frozen: Path) -> None:
    assert default_model_path() == ""
    frozen.mkdir()
    (frozen / "notes.txt").write_text("not a model")
    assert default_model_path() == ""


def test_the_bundled_smollm2_is_the_default(frozen: Path) -> None:
    path = _put(frozen, MODEL_FILE)
    assert default_model_path() == str(path)
    assert cat.resolve(cat.BUNDLED) == str(path)


def test_a_catalog_model_bundled_instead_is_the_default_and_its_name_resolves_to_it(frozen: Path) -> None:
    path = _put(frozen, OTHER)
    assert default_model_path() == str(path)
    assert cat.resolve("qwen2.5-0.5b") == str(path), "a frozen build has no `oam models pull`: its copy is the file"
    with pytest.raises(BridgeError, match="not downloaded"):  # SmolLM2 is not in this build
        cat.resolve(cat.BUNDLED)


def test_a_file_bundled_by_path_is_the_default(frozen: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _put(frozen, "studio-npc.Q5_K_M.gguf")
    assert default_model_path() == str(path)
    catalog = tmp_path / "catalog.json"  # a studio's own catalog entry for that file
    catalog.write_text(json.dumps([{"name": "studio-npc", "repo": "studio/npc", "file": path.name, "size": 1}]))
    monkeypatch.setenv(cat.CATALOG_ENV, str(catalog))
    assert cat.resolve("studio-npc") == str(path)


def test_oam_llama_model_still_wins(frozen: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _put(frozen, OTHER)
    monkeypatch.setenv("OAM_LLAMA_MODEL", "/elsewhere/model.gguf")
    assert default_model_path() == "/elsewhere/model.gguf"


@pytest.mark.parametrize(("bundled", "weak"), [(MODEL_FILE, True), (OTHER, False)])
def test_only_smollm2_is_flagged_weak_tool_choice(frozen: Path, bundled: str, weak: bool) -> None:
    # files that are not GGUF: the engine says it is unavailable without loading anything
    _put(frozen, bundled, b"not GGUF")
    engine = LlamaEngine()
    assert engine.model_path == str(frozen / bundled)
    assert engine.weak_tool_choice is weak
    info = engine.info()
    assert ("weak_tool_choice" in info.features) is weak
    assert info.available is False and info.reason is not None and bundled in info.reason
