"""bridge/errors.py's ERROR_KINDS (one record per code) is the one source of the error table;
ERROR_CODES, HTTP_STATUS and EXIT_CODES are derived from it, and every hand-kept copy
(protocol.md, the native library, the Godot, Unity and Unreal clients) must match ERROR_CODES.

Each copy is parsed from its own text, so a copy that drifts (a code missing, extra or renamed,
a wrong number, a wrong retryable flag) fails here with the file's path in the message. A copy
carries what its language needs: protocol.md and Godot carry number and flag, Unity and Unreal
the number (the flag comes on the wire), the native library only the names an engine reports.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from bridge.errors import ERROR_CODES, ERROR_KINDS, EXIT_CODES, HTTP_STATUS, KINDS, BridgeError, ErrorKind

ROOT = Path(__file__).resolve().parents[2]

# name -> (JSON-RPC number or None, retryable or None); None: this copy does not carry it.
Table = dict[str, tuple[int | None, bool | None]]

# Codes -31001..-31019 are the ones a model engine reports (the native library's list);
# -31020 and up belong to the bridge itself.
ENGINE_CODES = range(-31019, -31000)

# Client-side codes that never come from the bridge (the transport broke).
CLIENT_ONLY = {"transport"}


def _block(text: str, start: str, end: str) -> str:
    """The text between the first `start` and the next `end` after it."""
    i = text.find(start)
    assert i >= 0, f"table start {start!r} not found"
    j = text.find(end, i + len(start))
    assert j >= 0, f"table end {end!r} not found after {start!r}"
    return text[i + len(start) : j]


def _table(pairs: list[tuple[str, int | None, bool | None]]) -> Table:
    table: Table = {}
    for name, number, retryable in pairs:
        assert name not in table, f"code {name} listed twice"
        table[name] = (number, retryable)
    return table


def _entries(block: str, entry: str, key: str) -> list[re.Match[str]]:
    """Every match of `entry`; fails if a line names a key (`key`) that `entry` cannot read."""
    found = list(re.finditer(entry, block))
    keys = re.findall(key, block)
    assert len(found) == len(keys), f"unreadable entries among {keys}"
    return found


def protocol_md(text: str) -> Table:
    header = "| string code | JSON-RPC code | retryable |"
    rows = _block(text, header, "\n\n").splitlines()[2:]  # past the header's end and |---|
    pairs: list[tuple[str, int | None, bool | None]] = []
    for row in rows:
        m = re.match(r"\| `([a-z_]+)` \| (-?\d+) \| (yes|no) \|", row)
        assert m, f"unreadable table row {row!r}"
        pairs.append((m[1], int(m[2]), m[3] == "yes"))
    return _table(pairs)


def godot_gd(text: str) -> Table:
    block = _block(text, "const ERROR_CODES := {", "\n}")
    found = _entries(block, r'"(\w+)": \[(-?\d+), (true|false)\]', r'"(\w+)"\s*:')
    return _table([(m[1], int(m[2]), m[3] == "true") for m in found])


def godot_replay_port(text: str) -> Table:
    block = _block(text, "ERROR_CODES = {", "\n}")
    found = _entries(block, r'"(\w+)": \((-?\d+), (True|False)\)', r'"(\w+)"\s*:')
    return _table([(m[1], int(m[2]), m[3] == "True") for m in found])


def unity_cs(text: str) -> Table:
    body = _block(text, "public static class ErrorCodes", "\n    }")
    consts = dict(re.findall(r'public const string (\w+) = "(\w+)";', body))
    rpc = _block(body, "Dictionary<string, int> Rpc = new Dictionary<string, int>", "};")
    found = _entries(rpc, r"\[(\w+)\] = (-?\d+)", r"\[(\w+)\]")
    for m in found:
        assert m[1] in consts, f"Rpc names {m[1]}, which is not a constant of ErrorCodes"
    numbered = {consts[m[1]]: int(m[2]) for m in found}
    names = set(consts.values()) - CLIENT_ONLY
    # a constant without a number in Rpc shows up as a wrong (missing) number
    return _table([(name, numbered.get(name), None) for name in sorted(names | set(numbered))])


def unreal_cpp(text: str) -> Table:
    block = _block(text, "kCodes[] = {", "};")
    found = _entries(block, r'\{"(\w+)", (-?\d+)\}', r'\{"(\w+)"')
    return _table([(m[1], int(m[2]), None) for m in found])


def native_header(text: str) -> Table:
    listed = _block(text, "Stable error codes:", ".\n")
    names = [n.strip(" *\n") for n in listed.split(",")]
    return _table([(n, None, None) for n in names])


def native_swift(text: str) -> Table:
    block = _block(text, "let stableCodes: Set<String> = [", "]")
    return _table([(n, None, None) for n in re.findall(r'"(\w+)"', block)])


@dataclass(frozen=True)
class Copy:
    path: str
    parse: Callable[[str], Table]
    engine_only: bool = False  # lists only the codes a model engine reports

    def expected(self) -> dict[str, tuple[int, bool]]:
        if not self.engine_only:
            return dict(ERROR_CODES)
        return {k: v for k, v in ERROR_CODES.items() if v[0] in ENGINE_CODES}


COPIES = [
    Copy("protocol.md", protocol_md),
    Copy("engine_clients/godot/addons/oam_bridge/oam_protocol.gd", godot_gd),
    Copy("engine_clients/godot/tests/replay_test.py", godot_replay_port),
    Copy("engine_clients/unity/Runtime/OamBridgeException.cs", unity_cs),
    Copy("engine_clients/unreal/Source/OamBridge/Core/oam_client.cpp", unreal_cpp),
    Copy("native/include/oam_native.h", native_header, engine_only=True),
    Copy("native/Sources/OamNative/Core.swift", native_swift, engine_only=True),
]


def drift(expected: dict[str, tuple[int, bool]], found: Table) -> list[str]:
    problems = [f"missing {k} ({n}, retryable {r})" for k, (n, r) in expected.items() if k not in found]
    problems += [
        f"extra {k}: " + ("a bridge code, not one an engine reports" if k in ERROR_CODES else "not in bridge/errors.py")
        for k in found
        if k not in expected
    ]
    for k in expected.keys() & found.keys():
        (n, r), (fn, fr) = expected[k], found[k]
        if fn is not None and fn != n:
            problems.append(f"{k} is {fn}, should be {n}")
        if fr is not None and fr != r:
            problems.append(f"{k} has retryable {fr}, should be {r}")
        # a copy that carries numbers must carry one for every code
        if fn is None and any(v[0] is not None for v in found.values()):
            problems.append(f"{k} has no number, should be {n}")
    return sorted(problems)


def check(copy: Copy, text: str) -> None:
    try:
        found = copy.parse(text)
    except AssertionError as e:
        raise AssertionError(f"{copy.path}: cannot read its error table: {e}") from None
    problems = drift(copy.expected(), found)
    assert not problems, f"{copy.path} drifted from bridge/errors.py ERROR_CODES: " + "; ".join(problems)


@pytest.mark.parametrize("copy", COPIES, ids=[c.path for c in COPIES])
def test_every_copy_of_the_error_table_matches_bridge_errors(copy: Copy) -> None:
    check(copy, (ROOT / copy.path).read_text(encoding="utf-8"))


def renamed(text: str) -> str:
    return text.replace("guardrail_violation", "guardrail_violated")


def renumbered(text: str) -> str:
    return text.replace("-31002", "-31092")


NUMBERED = [c for c in COPIES if not c.engine_only]


@pytest.mark.parametrize("copy", COPIES, ids=[c.path for c in COPIES])
def test_a_copy_with_a_renamed_code_fails_and_names_its_file(copy: Copy) -> None:
    with pytest.raises(AssertionError, match=re.escape(copy.path)) as e:
        check(copy, renamed((ROOT / copy.path).read_text(encoding="utf-8")))
    assert "missing guardrail_violation" in str(e.value) and "extra guardrail_violated" in str(e.value)


@pytest.mark.parametrize("copy", NUMBERED, ids=[c.path for c in NUMBERED])
def test_a_copy_with_a_wrong_number_fails_and_names_its_file(copy: Copy) -> None:
    with pytest.raises(AssertionError, match=re.escape(copy.path)) as e:
        check(copy, renumbered((ROOT / copy.path).read_text(encoding="utf-8")))
    assert "guardrail_violation is -31092, should be -31002" in str(e.value)


def test_a_wrong_number_or_retryable_flag_is_named() -> None:
    expected = {"busy": (-31010, True)}
    assert drift(expected, {"busy": (-31011, True)}) == ["busy is -31011, should be -31010"]
    assert drift(expected, {"busy": (-31010, False)}) == ["busy has retryable False, should be True"]
    assert drift(expected, {"busy": (-31010, True), "late": (-31099, False)}) == ["extra late: not in bridge/errors.py"]


# ---- the records themselves ----

JSONRPC_RESERVED = range(-32768, -31999)
JSONRPC_STANDARD = {-32700, -32600, -32601, -32602, -32603}


def record_problems(kinds: Sequence[ErrorKind]) -> list[str]:
    """What is wrong with a table of records: each rule its derived tables and the hosts rely on."""
    problems: list[str] = []
    codes = [k.code for k in kinds]
    problems += [f"code {c} listed twice" for c in sorted({c for c in codes if codes.count(c) > 1})]
    numbers = [k.number for k in kinds]
    problems += [f"number {n} shared by two codes" for n in sorted({n for n in numbers if numbers.count(n) > 1})]
    for k in kinds:
        if k.number in JSONRPC_RESERVED and k.number not in JSONRPC_STANDARD:
            problems.append(f"{k.code}: {k.number} is in JSON-RPC's reserved range")
        if not 400 <= k.http_status < 600:
            problems.append(f"{k.code}: HTTP status {k.http_status} is not an error status")
        # retryable codes are the ones an HTTP client retries (429, 5xx)
        if k.retryable and not (k.http_status == 429 or k.http_status >= 500):
            problems.append(f"{k.code}: retryable, but HTTP status {k.http_status} says do not retry")
        # 0 is success and 2 is argparse's usage error: no code may collide with them
        if k.exit_status in (0, 2) or not 0 < k.exit_status < 256:
            problems.append(f"{k.code}: exit status {k.exit_status}")
        if not k.meaning:
            problems.append(f"{k.code}: no meaning")
    return problems


def test_the_records_keep_every_rule() -> None:
    assert record_problems(ERROR_KINDS) == []


def mutated(which: str, **change: object) -> list[ErrorKind]:
    """ERROR_KINDS with the record of code ``which`` changed."""
    return [dataclasses.replace(k, **change) if k.code == which else k for k in ERROR_KINDS]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (mutated("busy", code="refusal"), "code refusal listed twice"),
        (mutated("busy", number=-31003), "number -31003 shared by two codes"),
        (mutated("busy", number=-32001), "busy: -32001 is in JSON-RPC's reserved range"),
        (mutated("busy", http_status=200), "busy: HTTP status 200 is not an error status"),
        (mutated("busy", http_status=409), "busy: retryable, but HTTP status 409 says do not retry"),
        (mutated("refusal", exit_status=2), "refusal: exit status 2"),
        (mutated("refusal", exit_status=0), "refusal: exit status 0"),
        (mutated("refusal", meaning=""), "refusal: no meaning"),
    ],
)
def test_a_record_that_breaks_a_rule_is_named(table: list[ErrorKind], problem: str) -> None:
    assert problem in record_problems(table)


@pytest.mark.parametrize("copy", NUMBERED, ids=[c.path for c in NUMBERED])
def test_a_record_changed_without_its_copies_fails_each_copy(copy: Copy) -> None:
    """The other direction: the copies are held to the records, through ERROR_CODES."""
    expected = {k.code: (k.number, k.retryable) for k in mutated("guardrail_violation", number=-31092)}
    found = copy.parse((ROOT / copy.path).read_text(encoding="utf-8"))
    assert "guardrail_violation is -31002, should be -31092" in drift(expected, found)


def test_the_per_code_tables_are_derived_from_the_records_in_their_order() -> None:
    assert list(KINDS) == [k.code for k in ERROR_KINDS] and all(KINDS[k.code] is k for k in ERROR_KINDS)
    assert list(ERROR_CODES.items()) == [(k.code, (k.number, k.retryable)) for k in ERROR_KINDS]
    assert list(HTTP_STATUS.items()) == [(k.code, k.http_status) for k in ERROR_KINDS]
    assert list(EXIT_CODES.items()) == [(k.code, k.exit_status) for k in ERROR_KINDS]


def test_error_codes_keeps_the_shape_the_clients_copy() -> None:
    """code -> (number, retryable), a plain tuple: what every client's copy mirrors."""
    for code, value in ERROR_CODES.items():
        assert type(value) is tuple and len(value) == 2, code
        assert type(value[0]) is int and type(value[1]) is bool, code


def test_a_bridge_error_reads_its_record() -> None:
    e = BridgeError("busy", "the queue is full", npcId="a")
    assert (e.rpc_code, e.retryable, e.http_status, e.exit_code) == (-31010, True, 503, 11)
    assert e.to_wire() == {
        "code": -31010,
        "message": "the queue is full",
        "data": {"code": "busy", "retryable": True, "npcId": "a"},
    }
    with pytest.raises(ValueError, match="unknown error code 'bussy'"):
        BridgeError("bussy", "typo")


def protocol_md_meanings(text: str) -> dict[str, str]:
    rows = _block(text, "| string code | JSON-RPC code | retryable | meaning |", "\n\n").splitlines()[2:]
    meanings: dict[str, str] = {}
    for row in rows:
        m = re.match(r"\| `([a-z_]+)` \| -?\d+ \| (?:yes|no) \| (.*) \|$", row)
        assert m, f"unreadable table row {row!r}"
        meanings[m[1]] = m[2]
    return meanings


def meaning_drift(text: str) -> list[str]:
    found = protocol_md_meanings(text)
    return [
        f"{k.code}: {found.get(k.code)!r}, should be {k.meaning!r}"
        for k in ERROR_KINDS
        if found.get(k.code) != k.meaning
    ]


def test_protocol_md_gives_each_code_its_record_s_meaning() -> None:
    assert meaning_drift((ROOT / "protocol.md").read_text(encoding="utf-8")) == []


def test_a_meaning_changed_in_protocol_md_alone_is_named() -> None:
    text = (ROOT / "protocol.md").read_text(encoding="utf-8").replace("| the model refused |", "| it said no |")
    assert meaning_drift(text) == ["refusal: 'it said no', should be 'the model refused'"]


def test_every_code_has_its_own_number() -> None:
    numbers = [n for n, _ in ERROR_CODES.values()]
    assert len(numbers) == len(set(numbers)), "two codes share a JSON-RPC number"
