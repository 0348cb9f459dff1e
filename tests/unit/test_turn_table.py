"""The turn's state table, h11-style: every pair of states is tried, each legal move
succeeds and every other one raises ``StateError`` and leaves the turn where it was.

The legal moves are written out here from the documented machine, not read from the table,
so a table that gains or loses a move fails::

    queued -> running -> awaiting_tool -> running -> completed | failed | cancelled
"""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from bridge.core import _messages as m
from bridge.core.agent import TURN_TRANSITIONS, StateError, Turn
from bridge.core.agent._turn import TurnState

STATES: tuple[TurnState, ...] = get_args(TurnState)
LEGAL: frozenset[tuple[TurnState, TurnState]] = frozenset(
    {
        ("queued", "running"),
        ("queued", "cancelled"),  # cancelled before it started
        ("running", "awaiting_tool"),
        ("running", "completed"),
        ("running", "failed"),
        ("running", "cancelled"),
        ("awaiting_tool", "running"),
        ("awaiting_tool", "failed"),
        ("awaiting_tool", "cancelled"),
    }
)
TERMINAL = ("completed", "failed", "cancelled")


class NullSink:
    async def wait_room(self) -> None:
        pass

    def put(self, event: m.Event) -> None:
        pass


def turn_in(state: TurnState) -> Turn:
    turn = Turn("n", NullSink(), m.RespondParams(npc_id="n", prompt="?"))
    turn.state = state
    return turn


def test_the_table_has_a_row_for_every_state() -> None:
    assert set(TURN_TRANSITIONS) == set(STATES) and len(STATES) == 6


def test_a_new_turn_is_queued() -> None:
    assert Turn("n", NullSink(), m.RespondParams(npc_id="n", prompt="?")).state == "queued"


@pytest.mark.parametrize(("old", "new"), sorted(LEGAL))
def test_every_legal_move_succeeds(old: TurnState, new: TurnState) -> None:
    turn = turn_in(old)
    turn.move(new)
    assert turn.state == new


@pytest.mark.parametrize(("old", "new"), [pair for pair in itertools.product(STATES, STATES) if pair not in LEGAL])
def test_every_illegal_move_raises_state_error_and_changes_nothing(old: TurnState, new: TurnState) -> None:
    turn = turn_in(old)
    with pytest.raises(StateError, match=f"{old} -> {new}"):
        turn.move(new)
    assert turn.state == old


@pytest.mark.parametrize("state", TERMINAL)
def test_a_terminal_state_has_no_way_out(state: TurnState) -> None:
    for new in STATES:
        with pytest.raises(StateError):
            turn_in(state).move(new)


def test_a_turn_with_a_tool_round_walks_the_documented_path() -> None:
    turn = turn_in("queued")
    path: tuple[TurnState, ...] = ("running", "awaiting_tool", "running", "completed")
    for state in path:
        turn.move(state)
    assert turn.state == "completed"
