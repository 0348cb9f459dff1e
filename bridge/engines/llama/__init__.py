"""llama.cpp engine (llama-cpp-python): one shared model, a saved context per NPC, GBNF
tool calls and JSON answers.

Modules, by concern: ``_model`` (model file, availability), ``_prompt`` (chat-template
rendering), ``_grammar`` (GBNF from tools and schemas; no model needed), ``_states`` (saved
per-NPC contexts), ``_worker`` (the generation thread and its stop flag), ``_engine`` (the
``Engine`` adapter). Importing this package does not import llama_cpp.
"""

from __future__ import annotations

from ._engine import FEATURES, MAX_DEFAULT_CTX, LlamaEngine
from ._grammar import TOOL_STRING_MAX
from ._model import GGUF_MAGIC, MODEL_FILE, availability, default_model_path, model_file_problem

__all__ = [
    "FEATURES", "GGUF_MAGIC", "MAX_DEFAULT_CTX", "MODEL_FILE", "TOOL_STRING_MAX", "LlamaEngine", "availability",
    "default_model_path", "model_file_problem",
]
