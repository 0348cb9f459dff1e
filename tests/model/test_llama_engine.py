"""LlamaEngine on the bundled model, in-process. Where the model or llama-cpp-python is
missing these tests skip, and under CI=true fail (the ``model`` marker, tests/model/conftest.py).
Grammar tests that need no model are in tests/unit/test_llama_grammar.py; timings are in
bench/bench_llama.py."""

import threading
from types import SimpleNamespace

import jsonschema
import pytest
import trio

from bridge.engines.base import GenerationOptions, Message, StepDone, StepRequest, TextChunk, ToolCallsChunk, ToolSpec
from bridge.engines.llama import LlamaEngine, availability
from bridge.engines.llama._worker import Generator


def test_the_model_is_available():
    assert availability() == (True, None)


GIVE = ToolSpec(
    "give",
    "Give an item",
    {"type": "object", "properties": {"item": {"type": "string", "enum": ["sword", "apple"]}}, "required": ["item"]},
)
WAVE = ToolSpec(
    "wave", "Wave", {"type": "object", "properties": {"polite": {"type": "boolean"}}, "required": ["polite"]}
)


@pytest.fixture(scope="module")
def engine():
    return LlamaEngine()


def req(npc="a", msgs=None, tools=(), mode="disallowed", schema=None, max_tokens=24):
    return StepRequest(
        npc,
        "You are a guard.",
        msgs or [Message("user", "Hello there!")],
        list(tools),
        mode,
        schema,
        GenerationOptions(max_tokens=max_tokens, temperature=0),
        0,
    )


async def collect(engine, r):
    return [c async for c in engine.stream_step(r)]


@pytest.mark.trio
async def test_required_single_tool(engine):
    out = await collect(engine, req(tools=[GIVE], mode="required", max_tokens=40))
    calls = [c for c in out if isinstance(c, ToolCallsChunk)]
    assert len(calls) == 1 and out[-1].finish_reason == "tool_calls"
    for call in calls[0].calls:
        assert call.name == "give"
        jsonschema.validate(call.arguments, GIVE.parameters)


@pytest.mark.trio
async def test_disallowed_no_tools(engine):
    out = await collect(engine, req(max_tokens=12))
    assert not any(isinstance(c, ToolCallsChunk) for c in out)
    assert isinstance(out[-1], StepDone)
    assert any(isinstance(c, TextChunk) for c in out)


@pytest.mark.trio
async def test_schema(engine):
    import json

    schema = {
        "type": "object",
        "properties": {"mood": {"type": "string", "enum": ["happy", "sad"]}},
        "required": ["mood"],
    }
    out = await collect(engine, req(schema=schema, max_tokens=30))
    text = "".join(c.delta for c in out if isinstance(c, TextChunk))
    jsonschema.validate(json.loads(text), schema)


def test_count_tokens_grows(engine):
    a = engine.count_tokens("x", [Message("user", "hi")], [])
    b = engine.count_tokens("x", [Message("user", "hi"), Message("assistant", "hello, traveller")], [])
    assert b > a > 0


@pytest.mark.trio
async def test_leaving_a_step_stops_its_thread_within_a_token(engine, monkeypatch):
    after_stop: list[object] = []
    generate = Generator.generate

    def spy(self, npc_id, tokens, grammar, opts, spoken, speaker, stop, emit, *rest):
        def counting_emit(item):
            if stop.is_set():
                after_stop.append(item)
            emit(item)

        return generate(self, npc_id, tokens, grammar, opts, spoken, speaker, stop, counting_emit, *rest)

    monkeypatch.setattr(Generator, "generate", spy)
    first = None
    with trio.fail_after(60):
        async for c in engine.stream_step(req(max_tokens=200)):
            if isinstance(c, TextChunk):
                first = c
                break
        assert first is not None
        out = await collect(engine, req(max_tokens=4))  # waits for the first step's thread
    assert isinstance(out[-1], StepDone)
    assert len(after_stop) <= 1, after_stop


async def test_count_tokens_from_threads_while_a_step_generates(engine):
    # blocking_count: the agent counts in worker threads, also while another NPC's step
    # holds the model; tokenizing only reads the vocabulary, so the counts are exact.
    assert engine.blocking_count is True
    prompts = [[Message("user", "Tell me about the gate." + " and the wall" * i)] for i in range(6)]
    expected = [engine.count_tokens("You are a guard.", p, [GIVE]) for p in prompts]
    engine._counts.clear()  # count afresh below, not from the cache
    counts: list[int] = []

    async def step():
        await collect(engine, req(max_tokens=16))

    with trio.fail_after(60):
        async with trio.open_nursery() as n:
            n.start_soon(step)
            for p in prompts:
                counts.append(await trio.to_thread.run_sync(engine.count_tokens, "You are a guard.", p, [GIVE]))
    assert counts == expected and expected == sorted(set(expected))


@pytest.mark.trio
async def test_returning_npc_cache(engine):
    msgs_a = [Message("user", "I am Alice, tell me about the castle gate.")]
    await collect(engine, req("A", msgs_a, max_tokens=4))
    await collect(engine, req("B", [Message("user", "Totally different words from Bob here.")], max_tokens=4))
    out = await collect(engine, req("A", msgs_a + [Message("assistant", "ok"), Message("user", "and?")], max_tokens=4))
    assert out[-1].usage.cached_tokens > 20


def test_a_line_another_npc_said_is_counted_with_its_speakers_name(engine):
    plain = engine.count_tokens("x", [Message("user", "Who goes there?")], [])
    named = engine.count_tokens("x", [Message("user", "Who goes there?", name="Brom Ironfoot")], [])
    assert named > plain


# -- npc/prewarm ----------------------------------------------------------------------------

KEEPER = (
    "You are Greta, the gruff but kind keeper of the Prancing Pony, a tavern on the market square. "
    "You speak in short sentences and never leave the counter. "
    * 4
    + "\nWorld facts: the north bridge washed away last week; ale costs 2 coins; the stew is mutton."
)
STOCK = ToolSpec(
    "check_inventory",
    "How many of an item the tavern has",
    {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
)


def keeper(npc, msgs, instructions=KEEPER):
    return StepRequest(
        npc,
        instructions,
        msgs,
        [STOCK],
        "allowed",
        None,
        GenerationOptions(max_tokens=4, temperature=0),
        0,
        speaker="Greta",
    )


@pytest.mark.trio
async def test_a_prewarm_reads_the_prompt_off_the_event_loop_and_the_next_step_reuses_it(engine, monkeypatch):
    threads = []
    prewarm = Generator.prewarm

    def spy(self, *args):
        threads.append(threading.current_thread())
        return prewarm(self, *args)

    monkeypatch.setattr(Generator, "prewarm", spy)
    history = [Message("user", "Evening."), Message("assistant", "Evening. What'll it be?")]
    with trio.fail_after(120):
        warm = await engine.prewarm(keeper("pw-keeper", history))
        assert threads and threads[0] is not threading.main_thread()
        assert warm.input_tokens > 150 and warm.output_tokens == 0
        again = await engine.prewarm(keeper("pw-keeper", history))
        assert again.input_tokens == again.cached_tokens == warm.input_tokens, "nothing left to read"
        # another NPC takes the context; the keeper's prewarmed state is saved and comes back
        await collect(engine, req("pw-other", [Message("user", "Completely different words here.")], max_tokens=2))
        out = await collect(engine, keeper("pw-keeper", [*history, Message("user", "Any ale left?")]))
    done = out[-1]
    assert isinstance(done, StepDone)
    assert done.usage.cached_tokens >= warm.input_tokens - 1, (done.usage, warm)
    assert done.usage.input_tokens - done.usage.cached_tokens < 20, "only the new line is read"


@pytest.mark.trio
async def test_a_prewarm_on_a_first_turn_leaves_only_the_players_line_to_read(engine):
    with trio.fail_after(120):
        warm = await engine.prewarm(keeper("pw-first", [], instructions=KEEPER + " The cellar door sticks."))
        out = await collect(
            engine,
            keeper(
                "pw-first", [Message("user", "Hello?", name="Brom")], instructions=KEEPER + " The cellar door sticks."
            ),
        )
    assert out[-1].usage.cached_tokens >= warm.input_tokens - 1
    assert warm.cached_tokens < warm.input_tokens


@pytest.mark.trio
async def test_a_prewarm_with_the_speakers_lead_in_leaves_only_the_rest_of_the_line(engine):
    """npc/prewarm with a speaker: the lead-in the model will read (``Brom: ``) is read too, so
    the turn that follows reads only the words after it."""
    import msgspec

    instructions = KEEPER + " The well in the yard is dry."
    with trio.fail_after(120):
        plain = await engine.prewarm(keeper("pw-lead-plain", [], instructions=instructions))
        lead = msgspec.structs.replace(keeper("pw-lead", [], instructions=instructions), prompt_prefix="Brom: ")
        led = await engine.prewarm(lead)
        out = await collect(engine, keeper("pw-lead", [Message("user", "Hello?", name="Brom")], instructions))
    assert led.input_tokens > plain.input_tokens, "the speaker's name and colon are read"
    assert out[-1].usage.cached_tokens >= led.input_tokens - 1, (out[-1].usage, led)


@pytest.mark.trio
async def test_a_prewarm_is_cancelled_like_a_step(engine):
    long = KEEPER + " The regulars tell long stories about the old war." * 60
    with trio.fail_after(120):
        with trio.move_on_after(0.05) as scope:
            await engine.prewarm(keeper("pw-cancel", [], instructions=long))
        assert scope.cancelled_caught
        out = await collect(engine, req("pw-cancel-next", max_tokens=2))  # waits for the thread to stop
    assert isinstance(out[-1], StepDone)


# -- npc/decide on the bundled model ------------------------------------------------------------

OPTIONS = {"let_in": "open the gate", "question": "ask who they are", "call_help": "ring the bell"}
REASONING = {"type": "string", "description": "why, in one short sentence"}
DECIDE = {
    "type": "object",
    "properties": {"reasoning": REASONING, "choice": {"type": "string", "enum": list(OPTIONS)}},
    "required": ["reasoning", "choice"],
}
DECIDE_ARGS = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"reasoning": REASONING, "choice": {"type": "string", "enum": ["let_in", "question"]}},
            "required": ["reasoning", "choice"],
        },
        {
            "type": "object",
            "properties": {
                "reasoning": REASONING,
                "choice": {"const": "call_help"},
                "arguments": {
                    "type": "object",
                    "properties": {"urgency": {"type": "string", "enum": ["low", "high"]}},
                    "required": ["urgency"],
                },
            },
            "required": ["reasoning", "choice", "arguments"],
        },
    ]
}


@pytest.mark.trio
@pytest.mark.parametrize("schema", [DECIDE, DECIDE_ARGS], ids=["enum", "anyOf"])
async def test_decisions_at_temperature_are_always_one_of_the_options(engine, schema):
    import json

    situation = "A stranger in a hood walks up to the gate after dark.\n\nChoose one option:\n" + "\n".join(
        f"- {k}: {v}" for k, v in OPTIONS.items()
    )
    choices = []
    with trio.fail_after(300):
        for seed in range(10):
            r = StepRequest(
                "decider",
                "You are Hilda, the night guard of the town gate.",
                [Message("user", situation)],
                [],
                "disallowed",
                schema,
                GenerationOptions(temperature=0.7, seed=seed),
                0,
            )
            out = await collect(engine, r)
            text = "".join(c.delta for c in out if isinstance(c, TextChunk))
            assert out[-1].finish_reason == "stop", (seed, text)
            value = json.loads(text)
            jsonschema.validate(value, schema)
            assert list(value)[:2] == ["reasoning", "choice"], "the reason comes before the choice"
            choices.append(value["choice"])
    assert set(choices) <= set(OPTIONS)


def test_a_greedy_step_picks_from_the_best_token_what_the_whole_vocabulary_gives(engine, monkeypatch):
    """Greedy.sample looks at a row's best token first: it picks the token llama.cpp's chain
    over the whole vocabulary picks, with the same history, on rows where DRY lowers the best
    token, rows with equal bests and plain rows, and it falls back to the whole vocabulary
    exactly where DRY lowered the best."""
    import ctypes

    import llama_cpp
    import numpy as np

    from bridge.engines.llama import _worker
    from bridge.engines.llama._worker import TOP_K, Greedy

    monkeypatch.setattr(_worker, "DRY_LAST_N", 64)  # DRY on (see DRY_LAST_N), so it can lower the best
    gen = engine._gen
    n = gen.n_vocab
    rng = np.random.default_rng(11)
    row = np.zeros(n, dtype=np.float32)
    monkeypatch.setattr(
        llama_cpp, "llama_get_logits_ith", lambda _c, _i: row.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    )
    data = (llama_cpp.llama_token_data * n)()
    view = np.frombuffer(data, dtype=np.dtype([("id", np.intc), ("logit", np.float32), ("p", np.float32)]))
    a, b, c, d = (int(t) for t in rng.choice(np.arange(1000, 5000), 4, replace=False))
    fell = dict.fromkeys(range(4), 0)
    for i in range(300):
        opts = GenerationOptions(temperature=0, seed=i)
        ours, ref = Greedy(gen, opts), gen._sampler(opts)
        for t in (a, b, c, d, a, b, c):  # "a b c" said again: DRY lowers d, which would go on repeating
            ours.accept(t)
            ref.accept(t)
        row[:] = rng.normal(0, 3, n).astype(np.float32)
        kind = i % 4
        if kind == 1:  # the best token is the one DRY lowers
            row[d] = row.max() + 0.3
        elif kind == 2:  # a few stand out, the rest tie
            row[:] = 0
            row[rng.choice(n, TOP_K - 1, replace=False)] = rng.uniform(1, 5, TOP_K - 1)
        elif kind == 3:  # equal bests: both take the lowest id
            row[rng.choice(n, 3, replace=False)] = row.max() + 1
        expected = row.copy()
        tok = ours.sample(SimpleNamespace(ctx=None), 0)
        view["id"], view["logit"], view["p"] = np.arange(n), expected, 0.0
        arr = llama_cpp.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(ref.sampler, ctypes.byref(arr))
        assert tok == int(arr.data[arr.selected].id), (i, kind)
        assert np.array_equal(row, expected), "the row is left as it was"
        fell[kind] += ours.fallbacks
    assert fell == {0: 0, 1: 75, 2: 0, 3: 0}, "the whole vocabulary only where DRY lowered the best"


def test_a_steps_boosts_bans_and_repetition_penalty_are_llama_cpps_own(engine):
    """Sampling applies the logit biases and the repetition penalty to the row of logits
    itself (llama.cpp's penalties sampler looks up every one of the 49k candidates): the row
    it leaves is, bit for bit, what llama.cpp's logit-bias and penalties samplers make of it,
    with the window of the last PENALTY_LAST_N tokens moving as the step says more."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import _internals

    from bridge.engines.llama import _worker
    from bridge.engines.llama._worker import Sampling

    gen = engine._gen
    n = gen.n_vocab
    rng = np.random.default_rng(7)
    boost = {int(t): 3.0 for t in rng.integers(100, n, 3)}
    # more than the window, with repeats, and tokens seen only early that must drop out
    recent = [int(t) for t in rng.integers(100, 400, 90)] + list(boost)[:1]
    step = Sampling(
        gen, [1, 2, 3], None, GenerationOptions(temperature=0), True, None, lambda item: None, boost, recent, False
    )
    ref = _internals.LlamaSampler()
    ref.add_logit_bias(n, {**boost, **{int(t): -float("inf") for t in gen._bans(True)}})
    ref.add_penalties(n, _worker.PENALTY_LAST_N, _worker.REPEAT_PENALTY, 0.0, 0.0)
    for t in recent:
        ref.accept(t)
    for said in [None, 150, 151, 150, *range(152, 220)]:
        if said is not None:
            step._seen(said)
            ref.accept(said)
        logits = rng.normal(0, 4, n).astype(np.float32)
        ours = logits.copy()
        step._adjust(ours.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        data = (llama_cpp.llama_token_data * n)()
        view = np.frombuffer(data, dtype=np.dtype([("id", np.intc), ("logit", np.float32), ("p", np.float32)]))
        view["id"], view["logit"] = np.arange(n), logits
        arr = llama_cpp.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(ref.sampler, ctypes.byref(arr))
        theirs = view["logit"].copy()
        assert np.array_equal(ours, theirs)
        assert (ours != logits).sum() > len(gen._bans(True))  # the penalty changed something


@pytest.mark.trio
@pytest.mark.parametrize(
    "tools, schema",
    [
        ([GIVE, WAVE], None),
        (
            [],
            {
                "type": "object",
                "properties": {"reasoning": {"type": "string"}, "choice": {"enum": ["serve", "refuse"]}},
                "required": ["reasoning", "choice"],
            },
        ),
    ],
)
async def test_a_greedy_grammar_step_picks_what_masking_the_whole_vocabulary_first_picks(
    engine, monkeypatch, tools, schema
):
    """A grammar step lets the chain pick from the whole row and masks only when the grammar
    refuses the pick, a slice of the best candidates first (``Sampling._pick``): greedy, that
    is the token the grammar in the chain (every candidate masked, then the choice) gives."""
    import ctypes

    import llama_cpp

    from bridge.engines.llama._worker import Sampling

    def masked_first(self, row):
        arr = self.gen.candidates(row, self.pre)
        llama_cpp.llama_sampler_apply(self.rules.sampler, ctypes.byref(arr))
        llama_cpp.llama_sampler_apply(self.post.sampler, ctypes.byref(arr))
        tok = int(arr.data[arr.selected].id)
        for chain in (self.pre, self.post, self.rules):
            chain.accept(tok)
        return tok

    steps = []
    init = Sampling.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        steps.append(self)

    monkeypatch.setattr(Sampling, "__init__", keep)
    r = req(npc="pick", tools=tools, mode="required" if tools else "disallowed", schema=schema, max_tokens=60)

    async def answer():
        out = await collect(engine, r)
        return (
            "".join(c.delta for c in out if isinstance(c, TextChunk)),
            [[(call.name, call.arguments) for call in c.calls] for c in out if isinstance(c, ToolCallsChunk)],
        )

    ours = await answer()
    monkeypatch.setattr(Sampling, "_pick", masked_first)
    assert ours == await answer()
    assert ours[0] or ours[1]
    assert steps[0].rejected > 0  # the grammar refused picks: the retry ran
    assert steps[0].checked > steps[0].rejected
