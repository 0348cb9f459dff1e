"""Lore without a tool call (``routing: "semantic"``): what the bridge retrieves for a line,
within the NPC's scope, its budget and its threshold; ``model`` leaves lore to ``recall``."""

from __future__ import annotations

from bridge.core import _messages as m
from bridge.core._world import RECALL, World
from bridge.core.agent._persona import with_facts
from bridge.core.agent._routing import (
    LORE_HEADER,
    LORE_MAX_CHARS,
    LORE_MAX_ENTRIES,
    default_embedder,
    lore_lead,
    render_lore,
    retrieve_lore,
)
from bridge.core.agent._steering import offered_tools
from tests.support.needs import require

require("wordllama", "the vectors semantic routing reads; make setup installs it with the llama extra")
embedder = default_embedder()

MILL = "The old mill burned down in the winter of the wolves."


def world() -> World:
    w = World(m.Limits())
    w.set(m.WorldSetParams(key="the old mill", value=MILL, lore=True))
    w.set(
        m.WorldSetParams(key="the mill's secret", value="A mill key hides under the stone.", lore=True, npc_ids=["a"])
    )
    w.set(m.WorldSetParams(key="weather", value="It rains.", lore=False))
    return w


def lore_of(w: World, npc: str) -> dict[str, str]:
    return {k: str(v) for k, v in w.view(npc, frozenset()).lore.items()}


def test_an_npc_never_gets_lore_it_cannot_see() -> None:
    assert embedder is not None
    w = world()
    assert [k for k, _ in retrieve_lore(embedder, lore_of(w, "b"), "What happened to the mill?")] == ["the old mill"]
    got = {k for k, _ in retrieve_lore(embedder, lore_of(w, "a"), "What happened to the mill?")}
    assert got == {"the old mill", "the mill's secret"}
    # a retrieved key the step's view does not hold never reaches the instructions
    text = with_facts("Be brief.", w.view("b", frozenset()), ["the old mill", "the mill's secret"])
    assert MILL in text and "stone" not in text and text.index("weather") < text.index(LORE_HEADER)


def test_an_unrelated_line_retrieves_nothing() -> None:
    assert embedder is not None
    lore = lore_of(world(), "a")
    for line in ("Hello there!", "I'll take an ale, please.", "What's your name?", "Nice weather, isn't it?"):
        assert retrieve_lore(embedder, lore, line) == [], line


def test_the_budget_holds_entries_and_characters() -> None:
    assert embedder is not None
    lore = {f"the mill {i}": f"The mill number {i} ground wheat for the town." for i in range(6)}
    got = retrieve_lore(embedder, lore, "Tell me about the mill.")
    assert len(got) == LORE_MAX_ENTRIES and [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    long = [(f"k{i}", "x" * 300) for i in range(3)]
    text = render_lore(long)
    assert len(text) <= len(LORE_HEADER) + 1 + LORE_MAX_CHARS and text.count("\n- ") == 1
    one = render_lore([("k", "y" * 2000)])
    assert len(one) <= len(LORE_HEADER) + 1 + LORE_MAX_CHARS and one.endswith("…")
    assert render_lore([]) == ""


def test_recall_is_offered_only_when_the_model_chooses() -> None:
    view = world().view("b", frozenset())
    assert [t.name for t in offered_tools([], view)] == [RECALL]
    assert offered_tools([], view, recall=False) == []
    # model: nothing retrieved, the instructions as before
    assert with_facts("Be brief.", view) == "Be brief.\n\nFacts you know now:\n- weather: It rains."


def test_a_question_about_lore_gets_the_sentence_that_answers_it_first() -> None:
    # The NPC's line opens with the retrieved entry's sentence most like the question, a whole
    # sentence (not a part after ";"); a line that asks nothing, or finds no lore, gets none.
    assert embedder is not None
    lore = {
        "the lighthouse": (
            "The lighthouse stands on the north cape. Old Brann kept it for forty years; his eyes failed."
        ),
        "the old mill": MILL,
    }

    def lead(line: str) -> str | None:
        return lore_lead(embedder, lore, line, retrieve_lore(embedder, lore, line))

    assert lead("Who kept the lighthouse?") == "Old Brann kept it for forty years; his eyes failed."
    assert lead("Tell me about the mill") == MILL
    assert lead("I'll have the mill's bread.") is None  # not a question
    assert lead("Nice weather today?") is None  # nothing retrieved
    fen = {"the fen": "a healer lives alone in the fen; folk call her a witch."}
    assert lore_lead(embedder, fen, "Who is the witch?", [("the fen", 0.9)]) == fen["the fen"].capitalize()
