"""World state: facts the game pushes, shared by every NPC that can see them.

A fact is a key, any JSON value, a scope (NPC ids and/or tags; none: everyone) and a flag for
lore. What one NPC sees is a ``View``: its facts rendered for the prompt (sorted by key, so
the text is the same whatever order the game set them in), and its lore, reached through the
bridge's ``recall`` tool. A view is computed when an NPC's next model step needs it, never
for a step already running, and costs what the NPC sees, not what the world holds: each
revision indexes the facts by scope once (everyone, each tag, each NPC id), and NPCs with the
same tags and no fact of their own share one view. A thousand NPCs after a change to a world
of thousands of facts must not hold the event loop for a second.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bridge.core import _messages as m
from bridge.engines.base import ToolSpec
from bridge.errors import BridgeError

RECALL = "recall"
RESPOND_DIRECTLY = "respond_directly"
RESERVED_TOOL_NAMES = frozenset({RECALL, RESPOND_DIRECTLY})
MAX_KEY_BYTES = 256
FACTS_HEADER = "Facts you know now:"

RESPOND_DIRECTLY_TOOL = ToolSpec(
    name=RESPOND_DIRECTLY,
    description="Answer the player directly in words, without any other tool: small talk, or what you already know.",
    parameters={"type": "object", "properties": {}},
)

_encode = msgspec.json.Encoder().encode


def render_value(value: Any) -> str:
    """A fact's value as the model reads it: a string as it is, anything else compact JSON."""
    return value if isinstance(value, str) else _encode(value).decode()


class _Fact:
    __slots__ = ("key", "value", "npc_ids", "tags", "lore", "size", "line")

    def __init__(self, p: m.WorldSetParams, size: int) -> None:
        self.key = p.key
        self.value = p.value
        self.npc_ids = None if p.npc_ids is None else frozenset(p.npc_ids)
        self.tags = None if p.tags is None else frozenset(p.tags)
        self.lore = p.lore
        self.size = size
        self.line = "" if p.lore else f"- {p.key}: {render_value(p.value)}"

    def visible_to(self, npc_id: str, tags: frozenset[str]) -> bool:
        if self.npc_ids is None and self.tags is None:
            return True
        return (self.npc_ids is not None and npc_id in self.npc_ids) or (
            self.tags is not None and not self.tags.isdisjoint(tags)
        )

    def wire(self) -> m.Fact:
        return m.Fact(
            key=self.key,
            value=self.value,
            npc_ids=None if self.npc_ids is None else sorted(self.npc_ids),
            tags=None if self.tags is None else sorted(self.tags),
            lore=self.lore,
        )


class View:
    """What one NPC sees of the world at one revision."""

    __slots__ = ("revision", "text", "lore", "facts", "recall_tool")

    def __init__(self, revision: int, text: str, lore: dict[str, Any], facts: dict[str, Any] | None = None) -> None:
        self.revision = revision
        self.text = text  # "" when no fact is visible
        self.lore = lore
        self.facts = facts or {}  # the facts in ``text`` (not lore), by key
        self.recall_tool: ToolSpec | None = None
        if lore:
            topics = list(lore)
            self.recall_tool = ToolSpec(
                name=RECALL,
                description="Recall what you know about one of these topics: " + "; ".join(topics) + ".",
                parameters={
                    "type": "object",
                    "properties": {"topic": {"type": "string", "enum": topics, "description": "the topic to recall"}},
                    "required": ["topic"],
                },
            )


EMPTY_VIEW = View(0, "", {})


class _Index:
    """One revision's facts by scope, each list sorted by key, and the views made from them."""

    def __init__(self, facts: list[_Fact]) -> None:
        self.everyone: list[_Fact] = []
        self.by_tag: dict[str, list[_Fact]] = {}
        self.by_npc: dict[str, list[_Fact]] = {}
        for f in facts:  # in key order, so every list is too
            if f.npc_ids is None and f.tags is None:
                self.everyone.append(f)
                continue
            for t in f.tags or ():
                self.by_tag.setdefault(t, []).append(f)
            for n in f.npc_ids or ():
                self.by_npc.setdefault(n, []).append(f)
        self.views: dict[tuple[str | None, frozenset[str]], View] = {}


class World:
    """The facts, their revision and their byte bounds (``Limits``)."""

    def __init__(self, limits: m.Limits) -> None:
        self.limits = limits
        self.revision = 0
        self._facts: dict[str, _Fact] = {}
        self._sorted: list[_Fact] | None = []
        self._index: _Index | None = None
        self._bytes = 0  # facts that are not lore
        self._lore_bytes = 0

    def _ordered(self) -> list[_Fact]:
        if self._sorted is None:
            self._sorted = sorted(self._facts.values(), key=lambda f: f.key)
        return self._sorted

    def _changed(self) -> None:
        self._sorted = None
        self._index = None
        self.revision += 1

    def set(self, p: m.WorldSetParams) -> int:
        """Set (or replace) one fact; ``limit_reached`` leaves the world unchanged."""
        key_bytes = len(p.key.encode())
        if key_bytes > MAX_KEY_BYTES:
            raise BridgeError("invalid_params", f"a fact key is at most {MAX_KEY_BYTES} bytes", reason="invalid_key")
        if any(c in p.key for c in "\r\n"):
            raise BridgeError("invalid_params", "a fact key is one line", reason="invalid_key")
        if p.value is None:
            raise BridgeError(
                "invalid_params", "a fact's value must not be null (world/delete removes a fact)", reason="null_value"
            )
        size = key_bytes + len(_encode(p.value))
        old = self._facts.get(p.key)
        lore_total = self._lore_bytes - (old.size if old is not None and old.lore else 0)
        total = self._bytes - (old.size if old is not None and not old.lore else 0)
        lim = self.limits
        if p.lore:
            if size > lim.max_lore_fact_bytes:
                raise BridgeError(
                    "limit_reached", f"a lore fact is at most {lim.max_lore_fact_bytes} bytes", limit="maxLoreFactBytes"
                )
            if lore_total + size > lim.max_lore_bytes:
                raise BridgeError(
                    "limit_reached", f"all lore is at most {lim.max_lore_bytes} bytes", limit="maxLoreBytes"
                )
            lore_total += size
        else:
            if size > lim.max_world_fact_bytes:
                raise BridgeError(
                    "limit_reached", f"a fact is at most {lim.max_world_fact_bytes} bytes", limit="maxWorldFactBytes"
                )
            if total + size > lim.max_world_bytes:
                raise BridgeError(
                    "limit_reached", f"the facts are at most {lim.max_world_bytes} bytes", limit="maxWorldBytes"
                )
            total += size
        self._facts[p.key] = _Fact(p, size)
        self._bytes, self._lore_bytes = total, lore_total
        self._changed()
        return self.revision

    def delete(self, key: str) -> tuple[int, bool]:
        fact = self._facts.pop(key, None)
        if fact is None:
            return self.revision, False
        if fact.lore:
            self._lore_bytes -= fact.size
        else:
            self._bytes -= fact.size
        self._changed()
        return self.revision, True

    def facts(self, npc_id: str | None = None, tags: frozenset[str] = frozenset()) -> list[m.Fact]:
        return [f.wire() for f in self._ordered() if npc_id is None or f.visible_to(npc_id, tags)]

    def view(self, npc_id: str, tags: frozenset[str]) -> View:
        """What ``npc_id`` with ``tags`` sees now: O(its facts) the first time, then shared."""
        index = self._index
        if index is None:
            index = self._index = _Index(self._ordered())
        own = index.by_npc.get(npc_id)
        key = (npc_id if own else None, tags)
        view = index.views.get(key)
        if view is not None:
            return view
        parts = [index.everyone, *(index.by_tag[t] for t in tags if t in index.by_tag)]
        if own:
            parts.append(own)
        seen: dict[str, _Fact] = {}
        for part in parts:
            for f in part:
                seen[f.key] = f
        visible = sorted(seen.values(), key=lambda f: f.key) if len(parts) > 1 else parts[0]
        lines = [f.line for f in visible if not f.lore]
        lore = {f.key: f.value for f in visible if f.lore}
        facts = {f.key: f.value for f in visible if not f.lore}
        text = FACTS_HEADER + "\n" + "\n".join(lines) if lines else ""
        view = index.views[key] = View(self.revision, text, lore, facts)
        return view


__all__ = [
    "World",
    "View",
    "EMPTY_VIEW",
    "RECALL",
    "RESPOND_DIRECTLY",
    "RESPOND_DIRECTLY_TOOL",
    "RESERVED_TOOL_NAMES",
    "render_value",
]
