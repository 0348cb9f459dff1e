"""Saved llama.cpp contexts, one per NPC, so a returning NPC skips re-reading its prompt.

One model context is shared by every NPC on the model. When another NPC's step needs the
context, the resident NPC's KV state is saved here; when it returns, the saved state is
loaded back if it shares a longer token prefix with the new prompt than what is resident.
The cache is bounded in bytes; the least recently saved states go first.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Any


class SavedState:
    __slots__ = ("input_ids", "n_tokens", "data")

    def __init__(self, input_ids: Any, n_tokens: int, data: bytes) -> None:
        self.input_ids, self.n_tokens, self.data = input_ids, n_tokens, data

    @property
    def size(self) -> int:
        return len(self.data)


def save_state(llm: Any) -> SavedState:
    """Like ``Llama.save_state`` but without copying the logits matrix (never used here)."""
    import llama_cpp

    size = llama_cpp.llama_state_get_size(llm._ctx.ctx)
    buf = (ctypes.c_uint8 * int(size))()
    n = llama_cpp.llama_state_get_data(llm._ctx.ctx, buf, size)
    return SavedState(llm.input_ids[: llm.n_tokens].copy(), llm.n_tokens, bytes(buf)[: int(n)])


def load_state(llm: Any, st: SavedState) -> None:
    import llama_cpp

    arr = (ctypes.c_uint8 * st.size).from_buffer_copy(st.data)
    if llama_cpp.llama_state_set_data(llm._ctx.ctx, arr, st.size) != st.size:
        raise RuntimeError("failed to restore llama state")
    llm.input_ids[: st.n_tokens] = st.input_ids
    llm.n_tokens = st.n_tokens
    llm._requires_eval = True


class StateCache:
    """NPC id -> SavedState, at most ``max_bytes`` in total (the newest state is always
    kept). Thread-safe: the generation thread saves and looks up, while the trio thread
    forgets NPCs (reset, delete, restore)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._states: OrderedDict[str, SavedState] = OrderedDict()
        self._bytes = 0

    def put(self, npc_id: str, st: SavedState) -> None:
        with self._lock:
            old = self._states.pop(npc_id, None)
            if old is not None:
                self._bytes -= old.size
            self._states[npc_id] = st
            self._bytes += st.size
            while self._bytes > self.max_bytes and len(self._states) > 1:
                _, evicted = self._states.popitem(last=False)
                self._bytes -= evicted.size

    def get(self, npc_id: str) -> SavedState | None:
        with self._lock:
            return self._states.get(npc_id)

    def forget(self, npc_id: str) -> None:
        with self._lock:
            old = self._states.pop(npc_id, None)
            if old is not None:
                self._bytes -= old.size

    def clear(self) -> None:
        with self._lock:
            self._states.clear()
            self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._bytes
