"""llama.cpp engine (llama-cpp-python): one shared model whose NPCs decode together
(continuous batching), their tokens kept between turns, GBNF tool calls and JSON answers.

Modules, by concern: ``_model`` (model file, availability), ``_prompt`` (chat-template
rendering), ``_grammar`` (GBNF from tools and schemas; no model needed), ``_states`` (saved
per-NPC KV states), ``_batch`` (the scheduler: one context, one sequence per NPC, one decode
per pass), ``_worker`` (each step's sampling and the hand-off to trio), ``_engine`` (the
``Engine`` adapter), ``_catalog`` (the models `oam models` pulls, by name). Importing this package
does not import llama_cpp.
"""

from __future__ import annotations

from bridge.engines._text._grammar import TOOL_STRING_MAX
from bridge.engines.llama._catalog import resolve as resolve_model
from bridge.engines.llama._engine import FEATURES, MAX_DEFAULT_CTX, LlamaEngine
from bridge.engines.llama._model import GGUF_MAGIC, MODEL_FILE, availability, default_model_path, model_file_problem

__all__ = [
    "FEATURES",
    "GGUF_MAGIC",
    "MAX_DEFAULT_CTX",
    "MODEL_FILE",
    "TOOL_STRING_MAX",
    "LlamaEngine",
    "availability",
    "default_model_path",
    "model_file_problem",
    "resolve_model",
]
