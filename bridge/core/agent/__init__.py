"""The agents: one ``Npc`` per NPC, and what the rest of the core needs of them.

- ``_npc``: the NPC's turn queue, worker, step loop and tool runtime; the one commit point.
- ``_turn``: a turn's state table (``TURN_TRANSITIONS``, ``StateError``) and its events.
- ``_steering``: the steering rules and the engine contract, as functions of ``TurnProgress``.
- ``_window``: the history and its token counts: which newest turns fit a step's prompt.
- ``_persona``: the system text (persona, instructions, facts) and fallback lines.
- ``_schema``: checking the games' JSON Schemas and applying them.
"""

from bridge.core.agent._npc import Npc
from bridge.core.agent._persona import render_instructions
from bridge.core.agent._schema import check_schema
from bridge.core.agent._turn import TURN_TRANSITIONS, EventSink, StateError, Turn
from bridge.core.agent._window import COUNT_CHUNK, count_text_tokens

__all__ = [
    "COUNT_CHUNK",
    "TURN_TRANSITIONS",
    "EventSink",
    "Npc",
    "StateError",
    "Turn",
    "check_schema",
    "count_text_tokens",
    "render_instructions",
]
