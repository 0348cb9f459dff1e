"""The connection's state table, h11-style: every (state, method) pair and every (state, new
state) pair, from tables written out here, independently of bridge/jsonrpc/_protocol.py.

Two kinds of illegal move, kept apart as h11 keeps its Remote- and LocalProtocolError apart:
the *peer's* request that the state does not allow is answered with a wire error (exactly the
one it always got), while *our own* illegal transition raises ``StateError``, a bug in the
bridge, which the wire boundary answers ``internal_error``."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import trio

from bridge import BridgeError, Server
from bridge.core._methods import CONNECTION_STATES, METHODS, MOVES, ConnectionState
from bridge.jsonrpc._protocol import Call, Connection, StateError
from bridge.messages import EmptyParams

STATES: list[ConnectionState] = list(CONNECTION_STATES)
EVERY_METHOD = set(METHODS)

# What protocol.md's Lifecycle section says, written out.
ALLOWED: dict[str, set[str]] = {
    "uninitialized": {"initialize", "exit"},
    "ready": EVERY_METHOD - {"initialize"},
    "shutting_down": {"exit"},
    "closed": set(),
}
LEGAL_TRANSITIONS = {
    ("uninitialized", "ready"),
    ("uninitialized", "closed"),
    ("ready", "shutting_down"),
    ("ready", "closed"),
    ("shutting_down", "closed"),
    ("closed", "closed"),  # closing is idempotent: EOF, a signal and exit may each close
}


def refusal(state: str, method: str) -> tuple[str, int, str]:
    """The wire error (string code, JSON-RPC number, message) a method the state does not allow
    gets: what it got before the table raised typed errors."""
    if state == "uninitialized":
        return "not_initialized", -31022, "send initialize first"
    if state in ("shutting_down", "closed"):
        return "shutting_down", -31026, "the bridge is shutting down; send exit"
    return "invalid_request", -31011, f"{method} is not allowed once the connection is {state}"


def connection(state: ConnectionState) -> Connection:
    conn = Connection()
    conn.state = state
    return conn


ANY_PARAMS = EmptyParams()  # the gate hands a call's decoded params on as they are, whatever they are
PARAMS_ERROR = BridgeError("invalid_params", "bad params", reason="validation")
PAIRS = list(itertools.product(STATES, sorted(EVERY_METHOD)))
ALLOWED_PAIRS = [(s, meth) for s, meth in PAIRS if meth in ALLOWED[s]]
REFUSED_PAIRS = [(s, meth) for s, meth in PAIRS if meth not in ALLOWED[s]]
TRANSITIONS = list(itertools.product(STATES, STATES))


def test_the_pairs_cover_both_outcomes() -> None:
    assert len(ALLOWED_PAIRS) == 2 + (len(EVERY_METHOD) - 1) + 1 and REFUSED_PAIRS
    assert len(TRANSITIONS) == 16


@pytest.mark.parametrize(("state", "method"), ALLOWED_PAIRS)
def test_an_allowed_method_passes_the_gate_and_makes_its_move(state: ConnectionState, method: str) -> None:
    conn = connection(state)
    assert conn.gate(Call(1, True, method, ANY_PARAMS)) is ANY_PARAMS
    assert conn.state == state, "the gate moves nothing"
    conn.moved_by(method)
    assert conn.state == MOVES.get(method, state)


@pytest.mark.parametrize(("state", "method"), ALLOWED_PAIRS)
def test_an_allowed_method_with_bad_params_gets_its_params_error(state: ConnectionState, method: str) -> None:
    conn = connection(state)
    with pytest.raises(BridgeError) as e:
        conn.gate(Call(1, True, method, None, PARAMS_ERROR))
    assert e.value is PARAMS_ERROR and conn.state == state


@pytest.mark.parametrize(("state", "method"), REFUSED_PAIRS)
def test_a_refused_method_gets_the_wire_error_it_always_got(state: ConnectionState, method: str) -> None:
    code, number, message = refusal(state, method)
    conn = connection(state)
    with pytest.raises(BridgeError) as e:
        conn.gate(Call(1, True, method, ANY_PARAMS))
    assert (e.value.code, e.value.rpc_code, e.value.message, e.value.data) == (code, number, message, {})
    assert conn.state == state


@pytest.mark.parametrize(("state", "method"), REFUSED_PAIRS)
def test_a_refused_method_with_bad_params_gets_the_same_error_as_before(state: ConnectionState, method: str) -> None:
    """Before initialize and after shutdown the state's refusal comes first; when ready (only
    a second initialize is refused) the params are checked first."""
    conn = connection(state)
    with pytest.raises(BridgeError) as e:
        conn.gate(Call(1, True, method, None, PARAMS_ERROR))
    expected = PARAMS_ERROR.code if state == "ready" else refusal(state, method)[0]
    assert e.value.code == expected


@pytest.mark.parametrize(("state", "new"), TRANSITIONS)
def test_every_transition_succeeds_or_raises_the_typed_error(state: ConnectionState, new: ConnectionState) -> None:
    conn = connection(state)
    if (state, new) in LEGAL_TRANSITIONS:
        conn.move(new)
        assert conn.state == new
        return
    with pytest.raises(StateError) as e:
        conn.move(new)
    assert not isinstance(e.value, BridgeError), "our own bug is not a wire error"
    assert (e.value.state, e.value.new) == (state, new)
    assert str(e.value) == f"connection is {state}; cannot become {new}"
    assert conn.state == state, "an illegal transition changes nothing"


# ---- the same, through the server's wire boundary ----


def rpc(server: Server, obj: dict[str, Any]) -> Any:
    out = trio.run(server.handle_line, json.dumps(obj).encode())
    return None if out is None else json.loads(out)


def server_in(state: str) -> Server:
    server = Server()
    steps = {"uninitialized": [], "ready": ["initialize"], "shutting_down": ["initialize", "shutdown"]}
    for method in steps.get(state, ["initialize", "exit"]):
        params = {"protocolVersion": 1} if method == "initialize" else {}
        assert "error" not in rpc(server, {"jsonrpc": "2.0", "id": 0, "method": method, "params": params})
    assert server.state == state
    return server


@pytest.mark.parametrize("state", STATES)
def test_the_peer_s_refused_requests_are_answered_on_the_wire_exactly_as_before(state: str) -> None:
    server = server_in(state)
    for method in sorted(EVERY_METHOD - ALLOWED[state]):
        params = {"protocolVersion": 1} if method == "initialize" else {}
        reply = rpc(server, {"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
        code, number, message = refusal(state, method)
        assert reply == {
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": number, "message": message, "data": {"code": code, "retryable": False}},
        }, method
        assert server.state == state


def test_our_own_illegal_transition_reaches_the_wire_as_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that moved the connection where the table forbids (here: npc/list sending a
    ready connection back to uninitialized) is answered internal_error, not invalid_request."""
    server = server_in("ready")
    monkeypatch.setitem(MOVES, "npc/list", "uninitialized")
    reply = rpc(server, {"jsonrpc": "2.0", "id": 3, "method": "npc/list"})
    assert reply["error"]["data"]["code"] == "internal_error"
    assert reply["error"]["message"] == "internal error: StateError"
    assert server.state == "ready"


def test_stopping_closes_the_connection_from_any_state_and_again() -> None:
    for state in STATES:
        server = server_in(state)
        server.stop()
        server.stop()
        assert server.state == "closed"
