"""The routing policy and the semantic router, on a deterministic stub embedding: each word a
fixed pseudo-random unit vector, so shared words are similar and others nearly orthogonal."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from bridge.core import _messages as m
from bridge.core.agent import _routing as r
from bridge.core.agent._steering import TurnProgress, steer
from bridge.engines.base import ToolSpec, weak_tool_choice
from tests.support.needs import require

MENU = ToolSpec(
    name="get_menu",
    description="Look up the menu and the prices.",
    examples=["What do you serve?"],
)
ORDER = ToolSpec(
    name="take_order",
    description="The player orders food or drink.",
    parameters={"type": "object", "properties": {"item": {"type": "string", "enum": ["ale", "stew"]}}},
)


class Stub:
    def words(self, text: str) -> r.Vectors:
        rows = []
        for w in r.content_words(text):
            rng = np.random.default_rng(zlib.crc32(w.encode()))
            rows.append(rng.standard_normal(64).astype(np.float32))
        return r._normalize(np.array(rows or [np.zeros(64, np.float32)]))


def test_auto_routes_only_where_the_engine_says_its_model_chooses_badly() -> None:
    assert r.resolve_policy("auto", True) == "semantic"
    assert r.resolve_policy("auto", False) == "model"
    assert r.resolve_policy("semantic", False) == "semantic"
    assert r.resolve_policy("model", True) == "model"
    assert r.resolve_policy("semantic", True, available=False) == "model"


def test_an_engine_without_the_flag_is_trusted_to_choose() -> None:
    class Weak:
        weak_tool_choice = True

    assert weak_tool_choice(Weak()) and not weak_tool_choice(object())


def test_a_tool_is_compared_on_its_name_description_values_and_examples() -> None:
    assert r.tool_texts(MENU) == ["get menu", "Look up the menu and the prices.", "What do you serve?"]
    assert "ale stew" in r.tool_texts(ORDER)


def test_the_nearest_tool_wins_and_small_talk_gets_no_tool() -> None:
    table = r.build_table(Stub(), [MENU, ORDER])
    assert r.route_line(table, "show me the menu prices", Stub()).picked == "get_menu"
    assert r.route_line(table, "a stew, and an ale", Stub()).picked == "take_order"
    small_talk = r.route_line(table, "Good evening to you!", Stub())
    assert small_talk.picked is None and small_talk.score > 0.5


def test_tool_sets_are_embedded_once_and_shared() -> None:
    cache = r.TableCache(size=1)
    a = cache.build(Stub(), [MENU, ORDER])
    assert cache.build(Stub(), [MENU, ORDER]) is a
    cache.build(Stub(), [MENU])  # past the size the oldest goes
    assert cache.get([MENU, ORDER]) is None


def _steer(choice: m.ToolChoice, routing: m.RoutingInfo | None) -> tuple[list[str], str]:
    p = m.RespondParams(npc_id="n", prompt="x", tool_choice=choice)
    progress = TurnProgress([], routing=routing)
    tools, mode = steer(p, progress, [MENU, ORDER])
    return [t.name for t in tools], mode


def test_a_semantic_route_forces_its_tool_or_words_on_the_first_step_only() -> None:
    picked = m.RoutingInfo(policy="semantic", picked="take_order", score=0.7)
    assert _steer("auto", picked) == (["take_order"], "required")
    assert _steer("tool_or_answer", picked) == (["take_order"], "required")
    assert _steer("auto", m.RoutingInfo(policy="semantic", picked=None, score=0.4)) == ([], "disallowed")
    assert _steer("auto", m.RoutingInfo(policy="model")) == (["get_menu", "take_order"], "allowed")
    assert _steer("required", picked) == (["get_menu", "take_order"], "required")  # only auto, tool_or_answer
    p = m.RespondParams(npc_id="n", prompt="x")
    later = TurnProgress([], step=1, routing=picked)
    assert steer(p, later, [MENU, ORDER])[1] == "allowed"


def test_the_real_embedder_loads_from_the_wheel_without_the_network() -> None:
    require("wordllama", "the vectors semantic routing reads; make setup installs it with the llama extra")
    e = r.default_embedder()
    assert e is not None
    rows = e.words("Bring me a bowl of stew.")
    assert rows.shape == (3, 256) and np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)


# ---- closed arguments by meaning (the real vectors) ----

REMEDY = ToolSpec(
    "sell_remedy",
    "Sell the player a remedy: a healing potion, an antidote for poison or venom, or a sleeping draught.",
    {
        "type": "object",
        "properties": {"remedy": {"type": "string", "enum": ["healing potion", "antidote", "sleeping draught"]}},
    },
)
OUTCOMES = {"type": "string", "enum": ["done", "failed"]}
DESCRIBED = {
    "type": "string",
    "anyOf": [
        {"const": "done", "description": "finished it, killed or delivered what was asked"},
        {"const": "failed", "description": "lost it, gave up, got away, or someone died"},
    ],
}


def report(outcome: dict[str, Any]) -> ToolSpec:
    return ToolSpec(
        "report_quest", "The player reports on a quest.", {"type": "object", "properties": {"outcome": outcome}}
    )


def test_a_values_glosses_are_the_description_clauses_that_mention_it_alone() -> None:
    props = REMEDY.parameters["properties"]["remedy"]
    glosses = r.value_glosses(REMEDY, "remedy", props, props["enum"])
    assert glosses == {
        "healing potion": ["healing potion", "a healing potion"],
        "antidote": ["antidote", "an antidote for poison or venom"],
        "sleeping draught": ["sleeping draught", "or a sleeping draught"],
    }
    assert r.value_glosses(report(DESCRIBED), "outcome", DESCRIBED, ["done", "failed"])["failed"] == [
        "failed",
        "lost it, gave up, got away, or someone died",
    ]


def test_a_closed_value_the_line_means_is_pinned_when_it_is_clearly_nearest() -> None:
    require("wordllama", "the vectors semantic routing reads; make setup installs it with the llama extra")
    e = r.default_embedder()
    assert e is not None
    assert r.meaning_pins(e, [REMEDY], "Do you have anything for snake venom?") == {
        "sell_remedy": {"remedy": "antidote"}
    }
    assert r.meaning_pins(e, [REMEDY], "I can't sleep at night.") == {"sell_remedy": {"remedy": "sleeping draught"}}
    assert r.meaning_pins(e, [REMEDY], "Two healing potions.") == {}, "named in words: enum_pins' to pin"
    assert r.meaning_pins(e, [REMEDY], "Got anything for a spider bite?") == {}, "no value clearly nearest"
    assert r.meaning_pins(e, [report(OUTCOMES)], "I killed the wolves you told me about.") == {
        "report_quest": {"outcome": "done"}
    }
    # word vectors do not read negation; the values' descriptions say what they mean
    assert r.meaning_pins(e, [report(OUTCOMES)], "I lost the package on the way.") == {
        "report_quest": {"outcome": "done"}
    }
    for line in ("I lost the package on the way.", "I'm sorry, the merchant I escorted died on the road."):
        assert r.meaning_pins(e, [report(DESCRIBED)], line) == {"report_quest": {"outcome": "failed"}}, line
