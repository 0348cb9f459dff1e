"""JSON checks every host makes on what it reads: the JSON-RPC lines (``bridge.jsonrpc``),
``oam serve``'s request bodies (``bridge.hosts.http``) and the records of a recording
(``bridge.hosts.replay``)."""

from __future__ import annotations

from typing import Any


def nesting_ok(obj: Any, limit: int) -> bool:
    """Whether no value of ``obj`` lies deeper than ``limit`` (``obj`` itself at depth 1).
    Walks the containers only, a level at a time: a line of 300,000 strings costs one pass
    over a list, not a Python step per string."""
    level = [obj] if isinstance(obj, (dict, list)) else []
    depth = 1
    while level:
        if depth > limit:
            return False
        deeper: list[Any] = []
        for o in level:
            values = o.values() if isinstance(o, dict) else o
            if depth == limit and values:
                return False  # its values lie at limit + 1
            deeper += [v for v in values if v.__class__ is dict or v.__class__ is list]
        level = deeper
        depth += 1
    return True


__all__ = ["nesting_ok"]
