"""The method registry: one record per JSON-RPC method, the only place a method is declared.

A record names the method's params type, its result type, the service operation that runs it,
whether handling it may wait, the connection states that allow it and the state a success
moves the connection to. Every other per-method table is derived from ``METHODS``: ``PARAMS``
and ``RESULTS`` here (protocol.md is checked against them), the connection's allowed methods
and moves (``bridge/jsonrpc/_protocol.py``), the methods the reader never runs itself and the
server's dispatch (``bridge/jsonrpc/_server.py``). tests/unit/test_methods.py proves they agree.

The records are typed: mypy checks that each operation takes the record's params type and
returns its result type (or an awaitable of it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

import msgspec

from bridge.core import _messages as m
from bridge.core._service import Service

ConnectionState = Literal["uninitialized", "ready", "shutting_down", "closed"]
# in the order a connection goes through them
CONNECTION_STATES: Final[tuple[ConnectionState, ...]] = ("uninitialized", "ready", "shutting_down", "closed")
READY: Final[frozenset[ConnectionState]] = frozenset({"ready"})

P = TypeVar("P", bound=msgspec.Struct)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Method(Generic[P, R]):
    """One method of the protocol.

    ``params``: the type its ``params`` object decodes to (unknown fields are refused).
    ``result``: the type of its ``result``; ``None`` when the result is ``null``.
    ``operation``: what runs it, given the service and the decoded params; it returns the
    result, or an awaitable of it. ``None``: the service has nothing to do, the connection's
    move is the method's whole effect (``exit``).
    ``may_wait``: handling may wait (an engine starting, a token count on a model): the
    server's reader never runs it itself. Exactly the methods whose operation is ``async``.
    ``states``: the connection states that allow it; in the others it is refused.
    ``moves_to``: the state a successful call moves the connection to, if it moves it.

    Every method may be sent as a request or as a notification; none is one or the other only."""

    name: str
    params: type[P]
    result: type[R] | None
    operation: Callable[[Service, P], R | Awaitable[R]] | None
    may_wait: bool = False
    states: frozenset[ConnectionState] = READY
    moves_to: ConnectionState | None = None


def _shutdown(svc: Service, _: m.EmptyParams) -> None:
    """``shutdown``: every turn ends (tool calls are withdrawn, reason ``turn_ended``)."""
    svc.cancel_all("turn_ended")


def _npc_list(svc: Service, _: m.EmptyParams) -> m.NpcListResult:
    return svc.list()


def _engine_status(svc: Service, _: m.EmptyParams) -> m.EngineStatusResult:
    return svc.engine_status()


# In protocol.md's order.
_RECORDS: Final[tuple[Method[Any, Any], ...]] = (
    Method(
        "initialize",
        m.InitializeParams,
        m.InitializeResult,
        Service.initialize,
        states=frozenset({"uninitialized"}),
        moves_to="ready",
    ),
    Method("shutdown", m.EmptyParams, None, _shutdown, moves_to="shutting_down"),
    Method(
        "exit",
        m.EmptyParams,
        None,
        None,
        states=frozenset({"uninitialized", "ready", "shutting_down"}),
        moves_to="closed",
    ),
    Method("npc/create", m.NpcConfig, m.CreateResult, Service.create, may_wait=True),
    Method("npc/respond", m.RespondParams, m.RespondResult, Service.respond),
    Method("npc/submit", m.SubmitParams, m.SubmitResult, Service.submit),
    Method("npc/cancel", m.NpcRef, m.CancelResult, Service.cancel),
    Method("npc/transcript", m.NpcRef, m.Save, Service.transcript),
    Method("npc/restore", m.RestoreParams, m.RestoreResult, Service.restore, may_wait=True),
    Method("npc/reset", m.NpcRef, m.EmptyResult, Service.reset),
    Method("npc/delete", m.NpcRef, m.EmptyResult, Service.delete),
    Method("npc/list", m.EmptyParams, m.NpcListResult, _npc_list),
    Method("tokens/count", m.CountTokensParams, m.CountTokensResult, Service.count_tokens, may_wait=True),
    Method("engine/status", m.EmptyParams, m.EngineStatusResult, _engine_status),
    Method("npc/decide", m.DecideParams, m.RespondResult, Service.decide, may_wait=True),
    Method("npc/prewarm", m.PrewarmParams, m.RespondResult, Service.prewarm),
    Method("npc/setTags", m.SetTagsParams, m.EmptyResult, Service.set_tags),
    Method("world/set", m.WorldSetParams, m.WorldRevision, Service.world_set),
    Method("world/delete", m.WorldKey, m.WorldDeleteResult, Service.world_delete),
    Method("world/get", m.WorldGetParams, m.WorldGetResult, Service.world_get),
)

METHODS: Final[dict[str, Method[Any, Any]]] = {r.name: r for r in _RECORDS}

# ---- derived tables ----

# method -> its params type; a method not in it gets method_not_found
PARAMS: Final[dict[str, type[msgspec.Struct]]] = {r.name: r.params for r in _RECORDS}
# method -> its result type (None: the result is null)
RESULTS: Final[dict[str, type[Any] | None]] = {r.name: r.result for r in _RECORDS}
# connection state -> the methods it allows
ALLOWED_METHODS: Final[dict[ConnectionState, frozenset[str]]] = {
    s: frozenset(r.name for r in _RECORDS if s in r.states) for s in CONNECTION_STATES
}
# method -> the state its success moves the connection to (methods that move it only)
MOVES: Final[dict[str, ConnectionState]] = {r.name: r.moves_to for r in _RECORDS if r.moves_to is not None}
# methods whose handling may wait
MAY_WAIT: Final[frozenset[str]] = frozenset(r.name for r in _RECORDS if r.may_wait)


__all__ = [
    "ALLOWED_METHODS",
    "CONNECTION_STATES",
    "MAY_WAIT",
    "METHODS",
    "MOVES",
    "PARAMS",
    "RESULTS",
    "ConnectionState",
    "Method",
]
