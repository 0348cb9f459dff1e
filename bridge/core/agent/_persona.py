"""What the model is told it is: the persona and the game's instructions as one system text,
the world's facts after them, and the NPC's own fallback lines."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.core import _messages as m
from bridge.core._world import View, render_value
from bridge.core.agent._routing import render_lore


def render_instructions(config: m.NpcConfig) -> str:
    """The persona in plain sentences, then the game's own instructions. The name is said
    twice on purpose: small models otherwise invent one when the player asks for it."""
    parts = []
    p = config.persona
    if p is not None:
        parts.append(f"You are {p.name}" + (f", {p.role}" if p.role else "") + f". Your name is {p.name}.")
        if p.traits:
            traits = p.traits[0] if len(p.traits) == 1 else ", ".join(p.traits[:-1]) + " and " + p.traits[-1]
            parts.append(f"You are {traits}.")
        if p.speech_style:
            parts.append("How you speak: " + p.speech_style)
        parts.append(
            f"Stay in character: reply with only what {p.name} says out loud, and never call yourself by another name."
        )
    if config.instructions:
        parts.append(config.instructions)
    return "\n".join(parts)


def with_facts(instructions: str, view: View, lore: Sequence[str] = ()) -> str:
    """The persona and the game's instructions, then the facts, then the ``lore`` entries
    retrieved for the turn (keys; only those the view still holds, within ``LORE_MAX_CHARS``):
    a fact change keeps the prefix before them (an engine's cached prompt) intact."""
    recalled = render_lore([(k, render_value(view.lore[k])) for k in lore if k in view.lore])
    return "\n\n".join(part for part in (instructions, view.text, recalled) if part)


def next_fallback_line(config: m.NpcConfig, code: str, cursors: dict[str, int]) -> str | None:
    """The NPC's next fallback line for ``code`` (each code's lines in turn, ``cursors``
    holding where each is), or None when it has none."""
    fb = config.fallbacks
    lines = [] if fb is None else (fb.guardrail_violation if code == "guardrail_violation" else fb.refusal)
    if not lines:
        return None
    i = cursors.get(code, 0) % len(lines)
    cursors[code] = i + 1
    return lines[i]
