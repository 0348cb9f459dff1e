"""protocol.md is the exact contract: it must name every method, event, field and error code
that the message types define, each with an example."""

from __future__ import annotations

import json
import os
import re

import msgspec

from bridge.core import _messages as m
from bridge.core._methods import PARAMS, RESULTS
from bridge.errors import ERROR_CODES
from tests.support.harness import ROOT

DOC = open(os.path.join(ROOT, "protocol.md"), encoding="utf-8").read()


def section(name: str) -> str:
    match = re.search(rf"^### `{re.escape(name)}`\n(.*?)(?=^### |^## |\Z)", DOC, re.S | re.M)
    assert match, f"protocol.md has no section for {name}"
    return match.group(1)


def wire_fields(t: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(t)}


def test_every_method_is_documented_with_its_params_and_an_example() -> None:
    for method, params in PARAMS.items():
        text = section(method)
        for field in wire_fields(params):
            assert f"`{field}`" in text, f"{method}: field {field} undocumented"
        examples = [json.loads(x) for x in re.findall(r"^(\{.*\})$", text, re.M)]
        assert any(e.get("method") == method for e in examples), f"{method}: no example request"
        for e in examples:
            if e.get("method") == method and e.get("params"):
                msgspec.convert(e["params"], params)  # the example is valid against the type


def test_every_event_is_documented_with_its_fields_and_a_valid_example() -> None:
    for name, ev in m.EVENTS.items():
        text = section(name)
        for field in wire_fields(ev) - {"npcId", "turnId", "seq"}:
            assert f"`{field}`" in text, f"{name}: field {field} undocumented"
        examples = [json.loads(x) for x in re.findall(r"^(\{.*\})$", text, re.M)]
        mine = [e for e in examples if e.get("method") == name]
        assert mine, f"{name}: no example"
        for example in mine:
            typed = msgspec.convert(example["params"], ev)
            again = msgspec.json.decode(msgspec.json.encode(typed))
            assert again == example["params"], f"{name}: the example does not round-trip"


def test_every_error_code_is_in_the_table_with_its_number_and_retryable_flag() -> None:
    for code, (number, retryable) in ERROR_CODES.items():
        row = re.search(rf"^\| `{code}` \| (-?\d+) \| (yes|no) \|", DOC, re.M)
        assert row, f"error {code} missing from protocol.md"
        assert int(row.group(1)) == number and (row.group(2) == "yes") == retryable, code
    documented = set(re.findall(r"^\| `([a-z_]+)` \| -?\d+ \|", DOC, re.M))
    assert documented == set(ERROR_CODES), "protocol.md lists codes the code does not define"
    standard = {-32700, -32600, -32601, -32602, -32603}
    assert all(not (-32768 <= n <= -32000) for n, _ in ERROR_CODES.values() if n not in standard)


def test_no_section_documents_a_method_or_event_that_does_not_exist() -> None:
    names = set(re.findall(r"^### `([^`]+)`", DOC, re.M))
    assert names == set(PARAMS) | set(m.EVENTS)


def test_every_result_example_matches_the_result_type() -> None:
    for method, typ in RESULTS.items():
        text = section(method)
        examples = [json.loads(x) for x in re.findall(r"^(\{.*\})$", text, re.M)]
        replies = [e for e in examples if "result" in e]
        if typ is None:
            assert all(e["result"] is None for e in replies), f"{method}: its result is null"
            continue
        assert replies, f"{method}: no example response"
        for e in replies:
            value = msgspec.convert(e["result"], typ)  # valid against the type
            assert set(e["result"]) == wire_fields(typ), f"{method}: the example's fields differ from the type's"
            assert msgspec.json.decode(msgspec.json.encode(value)) == e["result"], (
                f"{method}: the example does not round-trip"
            )
