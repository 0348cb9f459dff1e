"""The context window's arithmetic on its own, synchronously: what a batch of messages
costs, which newest turns fit (whole turns, oldest dropped first), and what a commit or a
restore does to the window. No NPC, no turn, no event loop except to drive one count."""

from __future__ import annotations

import random
import threading

import pytest
import trio

from bridge.core.agent._window import Window, check_fits, count_jobs, fit, prompt_budget
from bridge.engines.base import GenerationOptions, Message, ToolSpec
from bridge.errors import BridgeError


class WordEngine:
    """Counts 3 tokens of framing per prompt, 2 per message and 1 per word."""

    name = "words"
    context_size = 1000

    def __init__(self) -> None:
        self.threads: list[bool] = []  # per count: whether it ran on the main thread

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        self.threads.append(threading.current_thread() is threading.main_thread())
        return 3 + len(instructions.split()) + sum(2 + len(m.content.split()) for m in messages) + len(tools)


class CheapWordEngine(WordEngine):
    blocking_count = False


def turn(i: int) -> list[Message]:
    return [Message(role="user", content=f"line {i}"), Message(role="assistant", content="an answer")]


def longest_fitting_suffix(counts: list[int], fixed: int, budget: int) -> int:
    """The reference: drop the oldest turn one at a time until the rest fits."""
    start = 0
    while start < len(counts) and fixed + sum(counts[start:]) > budget:
        start += 1
    return start


# ---- counts ----


def test_messages_cost_their_count_less_the_empty_prompts() -> None:
    engine = CheapWordEngine()
    window = Window(engine)  # type: ignore[arg-type]
    msgs = [Message(role="user", content="three words here"), Message(role="assistant", content="two words")]
    # (3 + 2+3 + 2+2) - 3: the framing of an empty prompt is not the messages'
    assert trio.run(window.messages_tokens, msgs) == 9


def test_an_engine_that_says_nothing_about_its_counts_counts_in_a_worker_thread() -> None:
    engine = WordEngine()  # no blocking_count: a tokenizer might be slow
    trio.run(Window(engine).messages_tokens, [Message(role="user", content="hi")])  # type: ignore[arg-type]
    assert engine.threads and not any(engine.threads), "every count ran off the event loop's thread"


def test_an_engine_whose_counts_are_cheap_counts_inline() -> None:
    engine = CheapWordEngine()
    jobs = [("", [Message(role="user", content="hi")], [])]
    assert trio.run(lambda: count_jobs(engine, jobs, blocking=False)) == [3 + 2 + 1]  # type: ignore[arg-type]
    assert engine.threads == [True]


def test_the_budget_leaves_the_answer_its_max_tokens_or_256() -> None:
    assert prompt_budget(4096, GenerationOptions(max_tokens=100)) == 3996
    assert prompt_budget(4096, GenerationOptions()) == 4096 - 256


def test_a_prompt_past_the_budget_fails_context_size_exceeded() -> None:
    check_fits(60, 40, 100, 4096)  # exactly full is fine
    with pytest.raises(BridgeError) as e:
        check_fits(61, 40, 100, 4096)
    assert e.value.code == "context_size_exceeded"
    assert e.value.data == {"promptTokens": 61, "contextSize": 4096}


# ---- fitting ----


def test_everything_fits_when_there_is_room() -> None:
    assert fit([10, 10, 10], 0, 30, 5, 100) == (0, 30, None)


def test_trimming_drops_the_oldest_whole_turns_first() -> None:
    # 10 + 60 > 55: the 10-token turn goes, then the 20-token one; never part of a turn
    assert fit([10, 20, 30], 0, 60, 10, 55) == (2, 30, None)


def test_the_window_grows_back_when_the_prompt_leaves_room() -> None:
    assert fit([10, 20, 30], 2, 30, 10, 100) == (0, 60, None)


def test_growing_stops_at_the_first_older_turn_that_does_not_fit() -> None:
    # the 50-token turn does not fit beside 10 + 30; the 1-token one before it is not reached
    assert fit([1, 50, 30], 2, 30, 10, 60) == (2, 30, None)


def test_growing_asks_for_the_newest_uncounted_turn_first() -> None:
    assert fit([None, None, 30], 2, 30, 0, 100) == (2, 30, 1)
    assert fit([None, 5, 30], 2, 30, 0, 100) == (1, 35, 0)


def test_a_window_with_no_room_keeps_no_turn() -> None:
    assert fit([10, 20], 0, 30, 100, 90) == (2, 0, None)


def test_fitting_from_anywhere_is_the_longest_newest_run_that_fits() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        counts = [rng.randint(0, 40) for _ in range(rng.randint(0, 12))]
        fixed, budget = rng.randint(0, 60), rng.randint(0, 200)
        start = rng.randint(0, len(counts))
        want = longest_fitting_suffix(counts, fixed, budget)
        known: list[int | None] = list(counts)
        got = fit(known, start, sum(counts[start:]), fixed, budget)
        assert got == (want, sum(counts[want:]), None), (counts, fixed, budget, start)


# ---- commit and restore ----


def test_a_commit_adds_one_whole_turn_visible_at_once() -> None:
    window = Window(CheapWordEngine())  # type: ignore[arg-type]
    window.commit(turn(0), 7)
    window.commit(turn(1), 5)
    assert window.turns == [turn(0), turn(1)]
    assert window.span == (0, 12)
    assert window.messages_from(0) == turn(0) + turn(1)
    assert window.fit(90, 100) is None  # 90 + 12 > 100: the oldest turn leaves
    assert window.span == (1, 5)
    assert window.messages_from(1) == turn(1)
    window.commit(turn(2), 4)
    assert window.span == (1, 9), "the new turn joins the window, which keeps its start"
    assert window.messages_from(1) == turn(1) + turn(2)


def test_a_restored_history_is_counted_only_when_a_prompt_needs_it() -> None:
    window = Window(CheapWordEngine())  # type: ignore[arg-type]
    window.commit(turn(9), 3)
    window.replace([turn(0), turn(1), turn(2)])
    assert window.span == (3, 0), "no turn visible until counted"
    assert window.messages_from(3) == []
    assert window.fit(0, 100) == 2, "the newest turn is counted first"
    assert window.messages_from(0) == turn(0) + turn(1) + turn(2)


def test_counting_a_restored_history_fits_it_newest_first() -> None:
    window = Window(CheapWordEngine())  # type: ignore[arg-type]
    window.replace([turn(i) for i in range(5)])  # 2 + 2 + 2 + 2 tokens each: 8
    assert trio.run(window.fit_counted, 0, 20) == (3, 16)
    assert window.messages_from(3) == turn(3) + turn(4)
