"""Saved KV sequences, one per NPC, so a returning NPC skips re-reading its prompt.

The batch scheduler (``_batch``) keeps each NPC's tokens in its slot of the shared context.
When a slot's cells are needed by another NPC, the resident NPC's sequence is saved here
(``llama_state_seq_get_data``); when it returns, the saved state is loaded back if it shares
a longer token prefix with the new prompt than anything resident. The cache is bounded in
bytes; the least recently saved states go first.
"""

from __future__ import annotations

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
