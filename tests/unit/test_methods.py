"""The method registry (bridge/core/_methods.py) is the one place a method is declared: every
per-method table is derived from it and agrees with it, every operation fits its record, and
protocol.md documents exactly the registry's methods."""

from __future__ import annotations

import inspect
import re
import typing
from functools import partial
from pathlib import Path

import pytest

from bridge import Server
from bridge.core import _methods
from bridge.core._methods import (
    ALLOWED_METHODS,
    CONNECTION_STATES,
    MAY_WAIT,
    METHODS,
    MOVES,
    PARAMS,
    RESULTS,
    Method,
)
from bridge.jsonrpc import _protocol, _server

ROOT = Path(__file__).resolve().parents[2]
RECORDS = list(METHODS.values())
AnyMethod = Method[typing.Any, typing.Any]


def documented_methods() -> list[str]:
    doc = (ROOT / "protocol.md").read_text(encoding="utf-8")
    start, end = doc.index("\n## Methods\n"), doc.index("\n## Events\n")
    return re.findall(r"^### `([^`]+)`", doc[start:end], re.M)


def test_each_method_is_declared_once_under_its_own_name() -> None:
    assert len(_methods._RECORDS) == len(METHODS), "a method is declared twice"
    assert all(name == r.name for name, r in METHODS.items())


def test_protocol_md_documents_exactly_the_registry_s_methods_in_its_order() -> None:
    assert documented_methods() == list(METHODS)


def test_the_derived_tables_agree_with_the_registry() -> None:
    assert PARAMS == {r.name: r.params for r in RECORDS}
    assert RESULTS == {r.name: r.result for r in RECORDS}
    assert ALLOWED_METHODS == {s: {r.name for r in RECORDS if s in r.states} for s in CONNECTION_STATES}
    assert MOVES == {r.name: r.moves_to for r in RECORDS if r.moves_to is not None}
    assert MAY_WAIT == {r.name for r in RECORDS if r.may_wait}


def test_the_hosts_use_the_registry_s_tables_not_copies() -> None:
    assert _protocol.PARAMS is PARAMS
    assert _protocol.ALLOWED_METHODS is ALLOWED_METHODS
    assert _protocol.MOVES is MOVES
    assert _server.MAY_WAIT is MAY_WAIT


def test_the_tables_say_what_they_said_before_the_registry() -> None:
    """What the hand-kept tables held, as protocol.md's Lifecycle section describes it: no
    wire behaviour changed when they became derived."""
    everything = set(METHODS)
    assert ALLOWED_METHODS == {
        "uninitialized": {"initialize", "exit"},
        "ready": everything - {"initialize"},
        "shutting_down": {"exit"},
        "closed": set(),
    }
    assert MOVES == {"initialize": "ready", "shutdown": "shutting_down", "exit": "closed"}
    assert MAY_WAIT == {"npc/create", "npc/restore", "tokens/count", "npc/decide"}
    assert {name for name, result in RESULTS.items() if result is None} == {"shutdown", "exit"}


@pytest.mark.parametrize("method", RECORDS, ids=[r.name for r in RECORDS])
def test_each_operation_takes_the_record_s_params_and_returns_its_result(method: AnyMethod) -> None:
    """What mypy checks when the record is built, checked again from the annotations."""
    if method.operation is None:
        assert method.result is None, "a method whose service does nothing returns null"
        return
    hints = typing.get_type_hints(method.operation)
    _service, params, *rest = inspect.signature(method.operation).parameters.values()
    assert hints[params.name] is method.params
    assert all(p.default is not p.empty for p in rest), "an operation is called with the params only"
    assert hints["return"] is (type(None) if method.result is None else method.result)


@pytest.mark.parametrize("method", RECORDS, ids=[r.name for r in RECORDS])
def test_a_method_may_wait_exactly_when_its_operation_is_async(method: AnyMethod) -> None:
    # an async operation the reader ran itself would stall reading while it waits
    assert method.may_wait == inspect.iscoroutinefunction(method.operation)


@pytest.mark.parametrize("method", RECORDS, ids=[r.name for r in RECORDS])
def test_every_state_that_allows_a_method_can_make_its_move(method: AnyMethod) -> None:
    """So a call that passed the gate never meets the connection's StateError."""
    assert method.states, "a method no state allows"
    if method.moves_to is not None:
        for state in method.states:
            assert method.moves_to in _protocol.CONNECTION_TRANSITIONS[state], (state, method.moves_to)


def test_the_server_dispatches_each_method_to_its_registry_operation() -> None:
    server = Server()
    ops = server._operations
    assert set(ops) == set(METHODS)
    for name, method in METHODS.items():
        op = ops[name]
        if method.operation is None:
            assert op(method.params()) is None
        else:
            assert isinstance(op, partial) and op.func is method.operation and op.args == (server.service,)
