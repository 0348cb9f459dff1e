"""The saved KV states of the llama engine (``bridge/engines/llama/_states.py``), without a
model: which saved state a prompt starts like, a prefix of no one, the bytes bound, and the
cache's fast search against a scan of every state."""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from tests.support.needs import require

require("numpy", "the saved states' arrays; llama-cpp-python brings it")

import numpy as np  # noqa: E402

from bridge.engines.llama._states import HEAD, SavedState, StateCache  # noqa: E402


def test_saved_states_are_found_by_how_a_prompt_starts() -> None:
    def state(tokens: list[int], size: int = 10) -> SavedState:
        return SavedState(np.asarray(tokens, dtype=np.intc), len(tokens), bytearray(size))

    cache = StateCache(max_bytes=45)
    cache.put("anna", state([1, 2, 3, 4]))
    cache.put_prefix(state([1, 2, 9]))
    assert cache.start_of("anna", [1, 2, 3, 5])[:1] == ("anna",)  # the longest start
    key, _, n = cache.start_of("bert", [1, 2, 9, 9])
    assert isinstance(key, int) and n == 3  # a prefix of no one
    assert cache.start_of("anna", [1, 2, 9, 9])[0] == key  # longer than her own
    assert cache.start_of("anna", [1, 2, 7])[:1] == ("anna",)  # her own first on a tie
    assert cache.start_of("bert", [7]) == (None, None, 0)
    # one token in common is not worth loading 300
    cache.put("carl", state([5] + [6] * 299))
    assert cache.start_of("dora", [5, 0])[2] == 0 and cache.start_of("carl", [5, 0])[2] == 1
    # a prefix of no one that a longer one holds goes, and one that holds a new one stays
    cache.put_prefix(state([1, 2, 9, 8]))
    assert sum(isinstance(k, int) for k in cache._states) == 1
    cache.put_prefix(state([1, 2]))
    assert sum(isinstance(k, int) for k in cache._states) == 1
    key, _, n = cache.start_of("bert", [1, 2, 9, 8])
    assert isinstance(key, int) and n == 4
    cache.take(key)
    assert cache.start_of("bert", [1, 2, 9, 8])[2] == 2  # anna's
    assert cache.bytes == 20
    cache.put("dora", state([3], size=30))  # over the bound: the least recently saved go
    assert cache.get("anna") is None and cache.bytes == 40


class _ScanningCache:
    """What StateCache answers, by comparing a prompt with every state in turn."""

    def __init__(self) -> None:
        self.states: dict[Any, list[int]] = {}
        self.keys = itertools.count()

    @staticmethod
    def common(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    def put(self, key: Any, toks: list[int]) -> None:
        self.states.pop(key, None)
        self.states[key] = toks

    def put_prefix(self, toks: list[int]) -> None:
        for key, old in list(self.states.items()):
            if isinstance(key, int):
                if self.common(old, toks) == len(old):
                    del self.states[key]
                elif self.common(old, toks) == len(toks):
                    return
        self.put(next(self.keys), toks)

    def start_of(self, npc: str, toks: list[int]) -> tuple[Any, int]:
        best: tuple[Any, int] = (None, 0)
        if npc in self.states:
            best = (npc, self.common(self.states[npc], toks))
        for key, old in self.states.items():
            n = self.common(old, toks) if key != npc else 0
            if n > best[1] and n * 256 >= len(old):
                best = (key, n)
        return best


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_saved_states_are_found_as_a_scan_of_every_state_finds_them(data: Any) -> None:
    """The cache compares a prompt's first tokens with all states at once and goes further
    only with those that share them all; what it finds is what comparing the prompt with
    every state in turn finds, ties included, past the compared head and short of it."""
    bases = [[1] * 70, [1] * 20 + [2] * 50, [3] * 70]  # starts shared past HEAD and short of it
    prompts = st.builds(
        lambda b, cut, tail: bases[b][:cut] + tail,
        st.integers(0, 2),
        st.integers(0, 70),
        st.lists(st.integers(0, 3), max_size=12),
    ).filter(bool)
    cache, scan = StateCache(max_bytes=1 << 30), _ScanningCache()
    for _ in range(data.draw(st.integers(1, 60))):  # past 16 rows: the rows are rebuilt
        op, toks = data.draw(st.sampled_from(["put", "prefix", "forget", "take"])), data.draw(prompts)
        npc = data.draw(st.sampled_from(["anna", "bert", "carl"]))
        if op == "put":
            cache.put(npc, SavedState(np.asarray(toks, dtype=np.intc), len(toks), bytearray(1)))
            scan.put(npc, toks)
        elif op == "prefix":
            cache.put_prefix(SavedState(np.asarray(toks, dtype=np.intc), len(toks), bytearray(1)))
            scan.put_prefix(toks)
        elif op == "forget":
            cache.forget(npc)
            scan.states.pop(npc, None)
        else:
            key, _, _ = cache.start_of(npc, toks)
            assert (key, cache.start_of(npc, toks)[2]) == scan.start_of(npc, toks)
            if isinstance(key, int):
                cache.take(key)
                del scan.states[key]
        assert [(k, list(v.input_ids)) for k, v in cache._states.items()] == list(scan.states.items())
        key, _, n = cache.start_of(npc, toks)
        assert (key, n) == scan.start_of(npc, toks)


def test_a_start_shared_past_the_compared_head_is_found_whole() -> None:
    cache = StateCache(max_bytes=1 << 20)
    lore = list(range(100, 100 + HEAD + 8))
    for npc, tail in (("anna", [1, 2]), ("bert", [3, 4, 5]), ("carl", [3, 4, 6])):
        cache.put(npc, SavedState(np.asarray(lore + tail, dtype=np.intc), len(lore) + len(tail), bytearray(1)))
    assert cache.start_of("dora", lore + [3, 4, 6, 9])[::2] == ("carl", HEAD + 11)
    assert cache.start_of("dora", lore + [3, 9])[::2] == ("bert", HEAD + 9)  # the first of equals
    assert cache.start_of("dora", lore[:5] + [0])[::2] == ("anna", 5)
