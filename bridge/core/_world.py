"""World state: facts the game pushes, shared by every NPC that can see them.

A fact is a key, any JSON value, a scope (NPC ids and/or tags; none: everyone) and a flag for
lore. What one NPC sees is a ``View``: its facts rendered for the prompt (sorted by key, so
the text is the same whatever order the game set them in), and its lore, reached through the
bridge's ``recall`` tool. A view is computed when an NPC's next model step needs it, never
for a step already running, and costs what the NPC sees, not what the world holds: the facts
are indexed by scope (everyone, each tag, each NPC id), and NPCs with the same tags and no
fact of their own share one view per revision. A thousand NPCs after a change to a world of
thousands of facts must not hold the event loop for a second.

A change costs what the fact it sets or deletes holds, never what the world holds: the index
is updated in place (one entry per tag and NPC id of that fact), and the scope counts in the
bounds (``Limits``: the scope's bytes in the fact's size, at most ``max_fact_scopes`` entries
per fact and ``max_world_scopes`` in all), so neither memory nor a ``world/set`` can be made
to grow without bound by a fact scoped to a huge list of tags.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
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


def scope_entries(p: m.WorldSetParams) -> int:
    """How many entries a fact's scope has (``npcIds`` and ``tags``, repeats included)."""
    return len(p.npc_ids or ()) + len(p.tags or ())


def fact_bytes(p: m.WorldSetParams) -> int:
    """A fact's size against the bounds: its key's UTF-8 bytes, its value as JSON, and its
    scope, ``npcIds`` and ``tags`` each as JSON (a list of ``n`` strings counts their bytes,
    their quotes, the commas and the brackets)."""
    size = len(p.key.encode()) + len(_encode(p.value))
    if p.npc_ids is not None:
        size += len(_encode(p.npc_ids))
    if p.tags is not None:
        size += len(_encode(p.tags))
    return size


class _Fact:
    __slots__ = ("key", "value", "npc_ids", "tags", "lore", "size", "scopes", "line", "_wire")

    def __init__(self, p: m.WorldSetParams, size: int, scopes: int) -> None:
        self.key = p.key
        self.value = p.value
        self.npc_ids = None if p.npc_ids is None else frozenset(p.npc_ids)
        self.tags = None if p.tags is None else frozenset(p.tags)
        self.lore = p.lore
        self.size = size
        self.scopes = scopes
        self.line = "" if p.lore else f"- {p.key}: {render_value(p.value)}"
        self._wire: m.Fact | None = None

    @property
    def everyone(self) -> bool:
        return self.npc_ids is None and self.tags is None

    def visible_to(self, npc_id: str, tags: frozenset[str]) -> bool:
        if self.npc_ids is None and self.tags is None:
            return True
        return (self.npc_ids is not None and npc_id in self.npc_ids) or (
            self.tags is not None and not self.tags.isdisjoint(tags)
        )

    def wire(self) -> m.Fact:
        """The fact as ``world/get`` returns it (made once: its scope sorted)."""
        if self._wire is None:
            self._wire = m.Fact(
                key=self.key,
                value=self.value,
                npc_ids=None if self.npc_ids is None else sorted(self.npc_ids),
                tags=None if self.tags is None else sorted(self.tags),
                lore=self.lore,
            )
        return self._wire


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


# A scope's facts (everyone's, a tag's, an NPC id's) as their keys: a dict of strings to None
# holds nothing the garbage collector tracks, so the index of 65,536 scope entries adds no
# objects to each collection's walk (two tracked objects per tag did: 285 ms pauses in a flood).
_Keys = dict[str, None]
_KEY = attrgetter("key")
_EVERYONE = ("", "")  # the cache key of everyone's scope (a tag's: ("tag", tag); an id's: ("npc", id))


class World:
    """The facts, their revision, their scope index and their bounds (``Limits``)."""

    def __init__(self, limits: m.Limits) -> None:
        self.limits = limits
        self.revision = 0
        self._facts: dict[str, _Fact] = {}
        self._sorted: list[_Fact] | None = []
        # The index, kept up to date fact by fact: a change touches its fact's scopes only.
        self._everyone: _Keys = {}
        self._by_tag: dict[str, _Keys] = {}
        self._by_npc: dict[str, _Keys] = {}
        # A scope's facts in key order, made when a view first reads it after it changed.
        self._in_order: dict[tuple[str, str], list[_Fact]] = {}
        # This revision's views, by (the NPC's id if it has facts of its own, its tags).
        self._views: dict[tuple[str | None, frozenset[str]], View] = {}
        self._bytes = 0  # facts that are not lore
        self._lore_bytes = 0
        self._scopes = 0  # scope entries of every fact, lore included

    def _ordered(self) -> list[_Fact]:
        if self._sorted is None:
            self._sorted = [self._facts[k] for k in sorted(self._facts)]
        return self._sorted

    def _index(self, f: _Fact) -> None:
        if f.everyone:
            self._everyone[f.key] = None
            self._in_order.pop(_EVERYONE, None)
            return
        for kind, index, names in (("tag", self._by_tag, f.tags), ("npc", self._by_npc, f.npc_ids)):
            for name in names or ():
                keys = index.get(name)
                if keys is None:
                    keys = index[name] = {}
                keys[f.key] = None
                self._in_order.pop((kind, name), None)

    def _unindex(self, f: _Fact) -> None:
        if f.everyone:
            del self._everyone[f.key]
            self._in_order.pop(_EVERYONE, None)
            return
        for kind, index, names in (("tag", self._by_tag, f.tags), ("npc", self._by_npc, f.npc_ids)):
            for name in names or ():
                keys = index[name]
                del keys[f.key]
                if not keys:
                    del index[name]
                self._in_order.pop((kind, name), None)

    def _changed(self) -> None:
        self._sorted = None
        self._views = {}
        self.revision += 1

    def set(self, p: m.WorldSetParams) -> int:
        """Set (or replace) one fact; ``limit_reached`` leaves the world unchanged. Costs
        what the fact holds (its scope at most ``max_fact_scopes`` entries), not the world."""
        key_bytes = len(p.key.encode())
        if key_bytes > MAX_KEY_BYTES:
            raise BridgeError("invalid_params", f"a fact key is at most {MAX_KEY_BYTES} bytes", reason="invalid_key")
        if any(c in p.key for c in "\r\n"):
            raise BridgeError("invalid_params", "a fact key is one line", reason="invalid_key")
        if p.value is None:
            raise BridgeError(
                "invalid_params", "a fact's value must not be null (world/delete removes a fact)", reason="null_value"
            )
        lim = self.limits
        scopes = scope_entries(p)
        if scopes > lim.max_fact_scopes:
            raise BridgeError(
                "limit_reached",
                f"a fact's npcIds and tags are at most {lim.max_fact_scopes} entries",
                limit="maxFactScopes",
            )
        old = self._facts.get(p.key)
        if self._scopes - (old.scopes if old is not None else 0) + scopes > lim.max_world_scopes:
            raise BridgeError(
                "limit_reached",
                f"the npcIds and tags of all facts are at most {lim.max_world_scopes} entries",
                limit="maxWorldScopes",
            )
        size = fact_bytes(p)
        lore_total = self._lore_bytes - (old.size if old is not None and old.lore else 0)
        total = self._bytes - (old.size if old is not None and not old.lore else 0)
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
        fact = _Fact(p, size, scopes)
        if old is not None:
            self._unindex(old)
        self._facts[p.key] = fact
        self._index(fact)
        self._bytes, self._lore_bytes = total, lore_total
        self._scopes += scopes - (old.scopes if old is not None else 0)
        self._changed()
        return self.revision

    def delete(self, key: str) -> tuple[int, bool]:
        fact = self._facts.pop(key, None)
        if fact is None:
            return self.revision, False
        self._unindex(fact)
        if fact.lore:
            self._lore_bytes -= fact.size
        else:
            self._bytes -= fact.size
        self._scopes -= fact.scopes
        self._changed()
        return self.revision, True

    def facts(self, npc_id: str | None = None, tags: frozenset[str] = frozenset()) -> list[m.Fact]:
        """Every fact (or those ``npc_id`` with ``tags`` sees), sorted by key, as the wire has them."""
        visible = self._ordered() if npc_id is None else self._visible(npc_id, tags)
        return [f.wire() for f in visible]

    def _in_key_order(self, scope: tuple[str, str], keys: _Keys) -> list[_Fact]:
        ordered = self._in_order.get(scope)
        if ordered is None:
            ordered = self._in_order[scope] = [self._facts[k] for k in sorted(keys)]
        return ordered

    def _visible(self, npc_id: str, tags: frozenset[str]) -> list[_Fact]:
        """The facts ``npc_id`` with ``tags`` sees, in key order: O(what it sees), from the index."""
        parts = [self._in_key_order(_EVERYONE, self._everyone)] if self._everyone else []
        parts += [self._in_key_order(("tag", t), self._by_tag[t]) for t in tags if t in self._by_tag]
        if npc_id in self._by_npc:
            parts.append(self._in_key_order(("npc", npc_id), self._by_npc[npc_id]))
        if len(parts) <= 1:
            return parts[0] if parts else []
        # Sorted runs merge in one pass; a fact seen through two scopes is kept once.
        merged = sorted(chain(*parts), key=_KEY)
        return list(dict(zip(map(_KEY, merged), merged, strict=True)).values())

    def view(self, npc_id: str, tags: frozenset[str]) -> View:
        """What ``npc_id`` with ``tags`` sees now: O(its facts) the first time, then shared."""
        key = (npc_id if npc_id in self._by_npc else None, tags)
        view = self._views.get(key)
        if view is not None:
            return view
        visible = self._visible(npc_id, tags)
        lines = [f.line for f in visible if not f.lore]
        lore = {f.key: f.value for f in visible if f.lore}
        facts = {f.key: f.value for f in visible if not f.lore}
        text = FACTS_HEADER + "\n" + "\n".join(lines) if lines else ""
        view = self._views[key] = View(self.revision, text, lore, facts)
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
