"""Saved KV sequences in RAM, so a prompt that starts like one already read is not read again.

The batch scheduler (``_batch``) keeps each NPC's tokens in its slot of the shared context.
When a slot's cells leave the pool (another NPC needs them, or a prompt is about to be read
and idle cells would slow every row of it), its sequence is saved here
(``llama_state_seq_get_data``): under its NPC's id, or, for the tokens of a slot that
belongs to no one (a deleted NPC, a request of the OpenAI-compatible server), as an
anonymous prefix. A step's prompt starts from whichever saved state shares the longest
start with it, its own NPC's first on a tie. The cache is bounded in bytes; the least
recently saved states go first.

Lookups run on the scheduler's thread between two decodes of every NPC, so their cost must
not grow with the states held (hundreds, in a long session) faster than numpy compares
arrays: the first ``HEAD`` tokens of every state sit in one array, a row per state in the
cache's order, compared with a prompt in one operation, and only the states that share all
of them are compared further.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

HEAD = 32  # tokens of each state compared at once across all states


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
        # a row per state, in _states' order: its first HEAD tokens (-1 past its end) and its
        # length; a state that goes leaves a dead row (key None, head -1, length -1) until
        # the rows are rebuilt, when they are full
        self._keys_of: list[str | int | None] = []
        self._row: dict[str | int, int] = {}
        self._heads = np.full((16, HEAD), -1, dtype=np.intc)
        self._lens = np.full(16, -1, dtype=np.int64)

    def put(self, npc_id: str, st: SavedState) -> None:
        with self._lock:
            self._put(npc_id, st)

    def put_prefix(self, st: SavedState) -> None:
        """Keeps tokens no NPC owns; an anonymous prefix of them is dropped, and they are
        not kept if one already holds them."""
        ids = st.input_ids[: st.n_tokens]
        with self._lock:
            keys, starts, lens = self._starts(ids)
            # in order: the prefixes it holds go, and it goes if one holds it
            for i in np.flatnonzero((starts == lens) | (starts == st.n_tokens)):
                if not isinstance(key := keys[i], int):
                    continue
                if starts[i] == lens[i]:
                    self._pop(key)
                else:
                    return
            self._put(next(self._keys), st)

    def _put(self, key: str | int, st: SavedState) -> None:
        self._pop(key)
        self._states[key] = st
        self._bytes += st.size
        self._add_row(key, st)
        while self._bytes > self.max_bytes and len(self._states) > 1:
            self._pop(next(iter(self._states)))

    def _pop(self, key: str | int) -> SavedState | None:
        old = self._states.pop(key, None)
        if old is not None:
            self._bytes -= old.size
            i = self._row.pop(key)
            self._keys_of[i] = None
            self._heads[i] = -1
            self._lens[i] = -1
        return old

    def _add_row(self, key: str | int, st: SavedState) -> None:
        if len(self._keys_of) == len(self._lens):  # full: drop the dead rows, or grow
            live = len(self._states) - 1  # the new state has no row yet
            size = len(self._lens) * (2 if 2 * live > len(self._lens) else 1)
            self._keys_of, self._row = [], {}
            self._heads = np.full((size, HEAD), -1, dtype=np.intc)
            self._lens = np.full(size, -1, dtype=np.int64)
            for k, old in self._states.items():
                if k != key:
                    self._add_row(k, old)
        i = len(self._keys_of)
        self._keys_of.append(key)
        self._row[key] = i
        m = min(HEAD, st.n_tokens)
        self._heads[i, :m] = st.input_ids[:m]
        self._lens[i] = st.n_tokens

    def _starts(self, ids: Any) -> tuple[list[str | int | None], Any, Any]:
        """Per row: its state's key, how many tokens the state shares with ``ids`` from the
        start, and its length (dead rows: None, 0, -1), in the cache's order (lock held)."""
        n = len(self._keys_of)
        heads, lens = self._heads[:n], self._lens[:n]
        q = np.full(HEAD, -2, dtype=np.intc)  # never equal to a head's padding
        m = min(HEAD, len(ids))
        q[:m] = ids[:m]
        same = heads == q
        starts = np.where(same.all(axis=1), HEAD, same.argmin(axis=1)).astype(np.int64)
        for i in np.flatnonzero(starts == HEAD):  # the first HEAD tokens alike: further
            st = self._states[self._keys_of[i]]  # type: ignore[index]
            starts[i] = common_start(st.input_ids[: st.n_tokens], ids)
        return self._keys_of, starts, lens

    def get(self, npc_id: str) -> SavedState | None:
        with self._lock:
            return self._states.get(npc_id)

    def start_of(self, npc_id: str, tokens: Any) -> tuple[str | int | None, SavedState | None, int]:
        """The saved state that shares the longest start with ``tokens`` (its key, itself,
        and how many tokens), ``npc_id``'s own first on a tie; (None, None, 0) if none does."""
        ids = np.asarray(tokens, dtype=np.intc)
        with self._lock:
            best: tuple[str | int | None, SavedState | None, int] = (None, None, 0)
            if not self._states:
                return best
            keys, starts, lens = self._starts(ids)
            # another's state is loaded whole and cut: worth it when it spares reading 1
            # token in 256 of it (a token is read in ~7 ms, 256 loaded in ~3 ms)
            worth = np.where(starts * 256 >= lens, starts, 0)
            if (own := self._states.get(npc_id)) is not None:
                best = (npc_id, own, int(starts[self._row[npc_id]]))
                worth[self._row[npc_id]] = 0
            i = int(worth.argmax())  # the first of the longest, as the cache orders them
            if worth[i] > best[2] and (key := keys[i]) is not None:
                best = (key, self._states[key], int(worth[i]))
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
            self._keys_of, self._row = [], {}
            self._heads[:] = -1
            self._lens[:] = -1

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._bytes
