"""A spoken line after a tool round says the numbers the game's tools answered: the sampler's
promise that the first sentence says them whatever the model's logits are
(``_worker.Sampling._ground``), shown on rows of logits a test makes up, so no CPU's numerics
decide it. Which values must be said and where a line says one need no model:
tests/unit/test_grounding_values.py. The demo's exchange on the real
model is ``tests/model/test_llama_lines_real.py::test_the_keeper_answers_with_the_count_the_game_gave``;
the rates, per CPU variant and beside the soft bias alone, are ``bench/bench_grounded.py``'s.
"""

from __future__ import annotations

import ctypes
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.engines.base import GenerationOptions, Message, StepRequest, ToolCall
from bridge.engines.llama._lines import value_pattern


# -- the sampler's promise, on made-up logits -------------------------------------------------
@pytest.fixture(scope="module")
def engine() -> Any:
    from bridge.engines.llama import LlamaEngine

    return LlamaEngine()


class MadeUpModel:
    """Stands in for llama.cpp's logits and sampler under ``Sampling.choose``: each row of
    logits is drawn by ``rows(step)``; the sampler draws from the row ``Sampling`` left
    (bans, boosts, masks applied) with its own seed, or takes the best at temperature 0."""

    def __init__(self, n_vocab: int, rows: Any, temperature: float, seed: int) -> None:
        import numpy as np

        self.n, self.rows, self.temp = n_vocab, rows, temperature
        self.rng = np.random.default_rng(seed)
        self.row = np.zeros(n_vocab, dtype=np.float32)
        self.step = 0

    def logits(self, _ctx: Any, _idx: int) -> Any:
        self.row[:] = self.rows(self.step)
        self.step += 1
        return self.row.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def sample(self, _ctx: Any, _idx: int) -> int:
        import numpy as np

        if self.temp == 0:
            return int(np.argmax(self.row))
        z = (self.row - self.row.max()) / self.temp
        p = np.exp(z.astype(np.float64))
        return int(self.rng.choice(self.n, p=p / p.sum()))

    def accept(self, _tok: int) -> None:
        pass


def speak(
    engine: Any,
    monkeypatch: Any,
    say: list[str],
    rows: Any,
    temperature: float = 0.7,
    seed: int = 1,
    max_tokens: int = 60,
) -> tuple[str, Any]:
    """A spoken step on made-up logits: the line as the player sees it, and the step."""
    import llama_cpp

    from bridge.engines.llama._worker import Sampling

    gen = engine._gen
    model = MadeUpModel(gen.n_vocab, rows, temperature, seed)
    monkeypatch.setattr(llama_cpp, "llama_get_logits_ith", model.logits)
    shown: list[str] = []
    step = Sampling(
        gen,
        [1, 2, 3],
        None,
        GenerationOptions(temperature=temperature, seed=seed, max_tokens=max_tokens),
        True,
        None,
        lambda item: shown.append(item[1]),
        None,
        None,
        False,
        say,
    )
    step.sampler = model
    step.chains = [model]
    ctx = SimpleNamespace(ctx=None)
    while step.choose(ctx, 0) is not None:
        pass
    step.end()
    return "".join(shown), step


def adversary(engine: Any, say: list[str], seed: int, ends_after: int, value_gap: float) -> Any:
    """Rows of a model that wants the line to end after ``ends_after`` words and finds the
    values ``value_gap`` less likely than its best token: words first (a common word's token
    best by far), then an end of sentence or of generation best by far."""
    import numpy as np

    llm = engine._llm
    words = [
        t
        for w in (" I", " have", " some", " ale", ",", " but", " not", " sure", " friend", " and")
        for t in llm.tokenize(w.encode(), add_bos=False, special=False)
    ]
    ends = [t for w in (".", "!", "\n") for t in llm.tokenize(w.encode(), add_bos=False, special=False)] + [
        llm.token_eos()
    ]
    values = [t for v in say for w in (" " + v, v) for t in llm.tokenize(w.encode(), add_bos=False, special=False)[:1]]
    rng = np.random.default_rng(seed)
    n = engine._gen.n_vocab

    def rows(step: int) -> Any:
        row = rng.normal(-10, 1, n).astype(np.float32)
        best = 12.0
        row[rng.choice(words)] = best
        if step >= ends_after:
            row[rng.choice(ends)] = best + 6
        row[values] = best - value_gap
        return row

    return rows


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
@pytest.mark.parametrize(
    "value_gap, how", [(0.5, {"model", "taken", "pressed"}), (8.0, {"model", "taken", "pressed"}), (40.0, {"forced"})]
)
def test_the_first_sentence_says_the_values_whatever_the_logits(
    engine: Any, monkeypatch: Any, temperature: float, value_gap: float, how: set[str]
) -> None:
    # A model that would end the line early, and finds the count barely (0.5 below its best
    # token, before SAY_BIAS), hardly (8) or never (40) as likely: the count is said, once,
    # in the first sentence, as a whole number; never forced when the model finds it likely
    # enough, always when it never does (SAY_PRESS_TOKENS after it would have ended).
    for seed in range(8):
        for say in (["3"], ["12", "2.5"]):
            rows = adversary(engine, say, seed, ends_after=seed % 4, value_gap=value_gap)
            text, step = speak(engine, monkeypatch, say, rows, temperature, seed)
            first = re.split(r"(?<=[.!?])\s", text)[0]
            for v in say:
                assert len(value_pattern(v).findall(first)) == 1, (say, text, step.how)
            assert not step.say
            assert {h for _v, h in step.how} <= how, (text, step.how)


def test_a_value_is_said_before_maxtokens_cuts_the_line(engine: Any, monkeypatch: Any) -> None:
    # The model never wants to end and never wants the values: they are said in time all the
    # same, when maxTokens leaves room for a first word and the values (" 1200" is 5 tokens,
    # " ", "1", "2", "0", "0"; " 7" two).
    for say, max_tokens in ((["7"], 3), (["1200"], 6), (["1200", "7"], 8), (["1200"], 20)):
        rows = adversary(engine, say, 1, ends_after=10_000, value_gap=40.0)
        text, step = speak(engine, monkeypatch, say, rows, 0.7, 1, max_tokens=max_tokens)
        assert all(value_pattern(v).search(text) for v in say), (max_tokens, text)
        assert [how for _v, how in step.how] == ["forced"] * len(say)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_value_said_never_runs_on_into_another_number(engine: Any, monkeypatch: Any, temperature: float) -> None:
    # A model that would glue digits, a decimal point, a time or "rd" onto anything it says:
    # the count said stays 3 ("3.", not "30", "3.5", "3:10" or "3rd").
    import numpy as np

    llm = engine._llm
    glue = [llm.tokenize(w.encode(), add_bos=False, special=False)[0] for w in ("0", "5", ".", ":", "/", "rd")]
    word = llm.tokenize(b" ale", add_bos=False, special=False)[0]
    three = [llm.tokenize(w.encode(), add_bos=False, special=False)[0] for w in (" 3", "3")]
    for seed in range(6):
        rng = np.random.default_rng(seed)

        def rows(step: int, rng: Any = rng) -> Any:
            row = rng.normal(-10, 1, engine._gen.n_vocab).astype(np.float32)
            row[word] = 10.0
            row[rng.choice(glue)] = 12.0
            row[three] = 11.5
            return row

        text, step = speak(engine, monkeypatch, ["3"], rows, temperature, seed, max_tokens=20)
        assert value_pattern("3").search(text), (seed, text, step.how)


def test_a_line_with_nothing_to_say_is_left_to_the_model(engine: Any, monkeypatch: Any) -> None:
    rows = adversary(engine, ["3"], 1, ends_after=2, value_gap=40.0)
    text, step = speak(engine, monkeypatch, [], rows, 0.0, 1)
    assert "3" not in text and step.how == []
    assert len(re.split(r"[.!?\n]", step.said)[0].split()) == 2  # the sentence ended where the model ended it


async def test_the_engine_asks_a_spoken_step_for_the_counts_of_its_tool_round_only(
    engine: Any, monkeypatch: Any
) -> None:
    """The values reach the step's sampling from the engine: after a tool round (not on the
    step that calls, not in a JSON answer), none for ``{"ok": true}``, none with
    ``$OAM_LLAMA_GROUNDED=0`` (``engine.grounded``)."""
    from bridge.engines.llama._worker import Sampling

    steps: list[Any] = []
    init = Sampling.__init__

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        steps.append(self)

    monkeypatch.setattr(Sampling, "__init__", keep)
    call = ToolCall("c1", "check_inventory", {"item": "ale"})

    def request(output: Any, schema: Any = None) -> StepRequest:
        msgs = [
            Message("user", "Any ale left?"),
            Message("assistant", "", tool_calls=[call]),
            Message("tool", json.dumps(output), tool_call_id="c1", name="check_inventory"),
        ]
        return StepRequest(
            "keeper",
            "You are Greta, a tavern keeper.",
            msgs,
            [],
            "disallowed",
            schema,
            GenerationOptions(temperature=0, max_tokens=24),
            1,
        )

    async def said(r: StepRequest) -> list[str]:
        steps.clear()
        async for _ in engine.stream_step(r):
            pass
        return [v.text for v in steps[0].say] + [v for v, _how in steps[0].how]

    assert await said(request({"item": "ale", "inStock": 3})) == ["3"]
    assert await said(request({"ok": True})) == []
    assert (
        await said(request({"inStock": 3}, schema={"type": "object", "properties": {"n": {"type": "integer"}}})) == []
    )
    monkeypatch.setattr(engine, "grounded", False)
    assert await said(request({"item": "ale", "inStock": 3})) == []


async def test_a_line_that_may_still_call_a_tool_says_the_count_when_it_speaks(engine: Any) -> None:
    """With tools still allowed (a grammar: a call batch or text), a step that speaks says the
    count like any line, and one that calls is left to call (``_ground`` leaves a call batch
    alone; a value's tokens are only taken once the text branch is chosen)."""
    from bridge.engines.base import TextChunk, ToolCallsChunk, ToolSpec

    tool = ToolSpec(
        "check_inventory",
        "Look up how many of an item the tavern has.",
        {"type": "object", "properties": {"item": {"type": "string", "enum": ["ale", "bread"]}}, "required": ["item"]},
    )
    call = ToolCall("c1", "check_inventory", {"item": "ale"})
    msgs = [
        Message("user", "Any ale left?"),
        Message("assistant", "", tool_calls=[call]),
        Message("tool", json.dumps({"item": "ale", "inStock": 3}), tool_call_id="c1", name="check_inventory"),
    ]
    spoke = 0
    for seed in range(6):
        r = StepRequest(
            f"keeper{seed}",
            "You are Greta, a tavern keeper.",
            msgs,
            [tool],
            "allowed",
            None,
            GenerationOptions(temperature=1.0, seed=seed, max_tokens=60),
            1,
        )
        out = [c async for c in engine.stream_step(r)]
        if any(isinstance(c, ToolCallsChunk) for c in out):
            continue
        spoke += 1
        text = "".join(c.delta for c in out if isinstance(c, TextChunk))
        assert value_pattern("3").search(text) and "{" not in text, text
    assert spoke


# -- a list's entries, named with their prices ------------------------------------------------
MENU = [
    ("ale", "2 copper"),
    ("mead", "3 copper"),
    ("lamb stew", "5 copper"),
    ("bread", "1 copper"),
]


def lister(engine: Any, seed: int, ends_after: int, name_gap: float) -> Any:
    """Rows of a model that would end the line after ``ends_after`` words, finds the entries'
    names ``name_gap`` below its best token, and after that wants any number but a true price
    ("12", "½"): it would invent prices if let."""
    import numpy as np

    llm = engine._llm

    def toks(*words: str) -> list[int]:
        return [llm.tokenize(w.encode(), add_bos=False, special=False)[0] for w in words]

    words = toks(" We", " have", " fine", " food", " friend", " and", ",")
    ends = toks(".", "!", "\n") + [llm.token_eos()]
    names = toks(*(" " + n for n, _ in MENU), *(n.capitalize() for n, _ in MENU))
    invented = toks(" 12", " 7", " ½", "9")
    rng = np.random.default_rng(seed)

    def rows(step: int) -> Any:
        row = rng.normal(-10, 1, engine._gen.n_vocab).astype(np.float32)
        best = 12.0
        row[rng.choice(words)] = best
        row[invented] = best + 1 if step > ends_after else best - 20
        if step >= ends_after:
            row[rng.choice(ends)] = best + 6
        row[names] = best - name_gap
        return row

    return rows


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
@pytest.mark.parametrize("name_gap", [0.5, 8.0, 40.0])
def test_a_lists_entries_are_named_with_their_prices_and_no_other_price(
    engine: Any, monkeypatch: Any, temperature: float, name_gap: float
) -> None:
    # One entry asked about, or the whole menu: every entry is named with its own price in
    # the first sentence, whatever the model would rather say; no number of the model's own
    # follows them, and the line ends with the sentence that lists them.
    from bridge.engines._text._prompt import Entry
    from bridge.engines.llama._worker import EntryValue

    for seed in range(6):
        for chosen in (MENU[1:2], MENU):
            say = [Entry(n, d, f"{n} for {d}") for n, d in chosen]
            rows = lister(engine, seed, ends_after=seed % 3, name_gap=name_gap)
            text, step = speak(engine, monkeypatch, say, rows, temperature, seed, max_tokens=80)
            sentences = re.split(r"(?<=[.!?])\s", text.strip())
            assert len(sentences) == 1, (text, step.how)
            for e in say:
                assert EntryValue(e, lambda s: [1]).pattern.search(sentences[0]), (e, text, step.how)
            prices = re.findall(r"\d+|[½⅓¼¾]", text)
            assert sorted(prices) == sorted(d.split()[0] for _n, d in chosen), (text, step.how)
            assert not step.say
