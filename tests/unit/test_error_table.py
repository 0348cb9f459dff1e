"""bridge/errors.py's ERROR_CODES is the one source of the error table; every hand-kept copy
(protocol.md, the native library, the Godot, Unity and Unreal clients) must match it.

Each copy is parsed from its own text, so a copy that drifts (a code missing, extra or renamed,
a wrong number, a wrong retryable flag) fails here with the file's path in the message. A copy
carries what its language needs: protocol.md and Godot carry number and flag, Unity and Unreal
the number (the flag comes on the wire), the native library only the names an engine reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from bridge.errors import ERROR_CODES

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
    assert drift(expected, {"busy": (-31010, True), "late": (-31099, False)}) == [
        "extra late: not in bridge/errors.py"
    ]


def test_every_code_has_its_own_number() -> None:
    numbers = [n for n, _ in ERROR_CODES.values()]
    assert len(numbers) == len(set(numbers)), "two codes share a JSON-RPC number"


def test_every_code_has_an_http_status_and_an_exit_code() -> None:
    from bridge.errors import EXIT_CODES, HTTP_STATUS

    assert set(HTTP_STATUS) == set(ERROR_CODES)
    assert set(EXIT_CODES) == set(ERROR_CODES)
    assert all(400 <= s < 600 for s in HTTP_STATUS.values())
    # retryable codes are the ones an HTTP client retries (429, 5xx)
    for code, (_, retryable) in ERROR_CODES.items():
        if retryable:
            assert HTTP_STATUS[code] == 429 or HTTP_STATUS[code] >= 500, code
    # 0 is success and 2 is argparse's usage error: no code may collide with them
    assert all(s not in (0, 2) and 0 < s < 256 for s in EXIT_CODES.values())
