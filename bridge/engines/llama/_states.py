"""Saved KV sequences in RAM, so a prompt that starts like one already read is not read again.

The batch scheduler (``_batch``) keeps each NPC's tokens in its slot of the shared context.
When a slot's cells leave the pool (another NPC needs them, or a prompt is about to be read
and idle cells would slow every row of it), its sequence is saved here
(``llama_state_seq_get_data``): under its NPC's id, or, for the tokens of a slot that
belongs to no one (a deleted NPC, a request of the OpenAI-compatible server), as an
anonymous prefix. A step's prompt starts from whichever saved state shares the longest
start with it, its own NPC's first on a tie. The cache is bounded in bytes; the least
recently saved states go first.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Any

import numpy as np


class SavedState:
    __slots__ = ("input_ids", "n_tokens", "data")

    def __init__(self, input_ids: Any, n_tokens: int, data: bytearray) -> None:
        self.input_ids, self.n_tokens, self.data = input_ids, n_tokens, data

    @property
    def size(self) -> int:
        return len(self.data)


def common_start(a: Any, b: Any) -> int:
    """How many tokens two token arrays share from the start."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class StateCache:
    """Saved states, at most ``max_bytes`` in total (the newest state is always kept): NPC
    id (str) -> its state, and anonymous prefixes (int keys). Thread-safe: the generation
    thread saves and looks up, while the trio thread forgets NPCs (reset, delete, restore)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._states: OrderedDict[str | int, SavedState] = OrderedDict()
        self._bytes = 0
        self._keys = itertools.count()

    def put(self, npc_id: str, st: SavedState) -> None:
        with self._lock:
            self._put(npc_id, st)

    def put_prefix(self, st: SavedState) -> None:
        """Keeps tokens no NPC owns; an anonymous prefix of them is dropped, and they are
        not kept if one already holds them."""
        ids = st.input_ids[: st.n_tokens]
        with self._lock:
            for key, old in list(self._states.items()):
                if not isinstance(key, int):
                    continue
                n = common_start(old.input_ids[: old.n_tokens], ids)
                if n == old.n_tokens:
                    self._pop(key)
                elif n == st.n_tokens:
                    return
            self._put(next(self._keys), st)

    def _put(self, key: str | int, st: SavedState) -> None:
        self._pop(key)
        self._states[key] = st
        self._bytes += st.size
        while self._bytes > self.max_bytes and len(self._states) > 1:
            _, evicted = self._states.popitem(last=False)
            self._bytes -= evicted.size

    def _pop(self, key: str | int) -> SavedState | None:
        old = self._states.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        return old

    def get(self, npc_id: str) -> SavedState | None:
        with self._lock:
            return self._states.get(npc_id)

    def start_of(self, npc_id: str, tokens: Any) -> tuple[str | int | None, SavedState | None, int]:
        """The saved state that shares the longest start with ``tokens`` (its key, itself,
        and how many tokens), ``npc_id``'s own first on a tie; (None, None, 0) if none does."""
        ids = np.asarray(tokens, dtype=np.intc)
        with self._lock:
            best: tuple[str | int | None, SavedState | None, int] = (None, None, 0)
            own = self._states.get(npc_id)
            if own is not None:
                best = (npc_id, own, common_start(own.input_ids[: own.n_tokens], ids))
            for key, st in self._states.items():
                # another's state is loaded whole and cut: worth it when it spares reading
                # 1 token in 256 of it (a token is read in ~7 ms, 256 loaded in ~3 ms)
                n = common_start(st.input_ids[: st.n_tokens], ids) if key != npc_id else 0
                if n > best[2] and n * 256 >= st.n_tokens:
                    best = (key, st, n)
            return best

    def take(self, key: str | int) -> None:
        """An anonymous prefix is resident again, whole: it leaves the cache."""
        if isinstance(key, int):
            with self._lock:
                self._pop(key)

    def forget(self, npc_id: str) -> None:
        with self._lock:
            self._pop(npc_id)

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
