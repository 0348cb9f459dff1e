"""The step's GBNF grammar: tool calls and JSON answers, built from JSON Schema.

Pure functions of the request (plus llama-cpp-python's schema converter); no model is
needed, so ``tests/unit/test_llama_grammar.py`` runs without loading one.

The grammar offers exactly the request's tools (``request.tools`` as given: the agent
decides what a step shows). ``tool_mode == "required"`` makes the call the only way to
answer; otherwise the model may call or answer (free text, or the schema's JSON). A
model's output that starts with ``CALL_PREFIX`` is a call batch, parsed by
``complete_calls``. A batch holds at most ``request.max_calls`` calls (the turn's remaining
``maxToolCalls``; never more than ``MAX_CALLS``), and an argument the player's line pins
(``request.pinned``, from ``bridge.core.agent._arguments``) can take only that value.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import msgspec

from bridge.engines.base import StepRequest, ToolSpec
from bridge.errors import BridgeError

CALL_PREFIX = '{"tool_calls"'
# A free string (a tool argument or a field of a JSON answer) without a length bound can run
# until maxTokens and never close: the grammar bounds it.
TOOL_STRING_MAX = 256
MAX_CALLS = 4  # calls per batch the grammar allows at most (fewer when the turn's budget is lower)
GRAMMAR_CACHE_SIZE = 256

# Schema keywords llama.cpp's JSON-Schema-to-GBNF converter does not turn into grammar:
# the answer is still validated against them afterwards, and the turn reports a warning.
NOT_IN_GRAMMAR = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "uniqueItems",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "minContains",
        "maxContains",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "dependentSchemas",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
GRAMMAR_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})

Grammar = tuple[str | None, tuple[str, ...]]  # (GBNF text or None for free text, warnings)

# ``"x-oam-prose": true`` on a string field (the bridge's decisions set it on ``reasoning``):
# the grammar makes it a sentence of words, a capital first, 3 to 31 words, ending in . or !
# Without it the bundled model fills a free field with "][", a lone option name or the
# situation copied out. Only a hint for generating: the answer is validated without it, and
# other engines ignore the keyword.
PROSE = "x-oam-prose"
PROSE_PATTERN = r"^[A-Z][a-z']*( [A-Za-z0-9,'-]+){2,30}[.!]$"
# ``"x-oam-prose": "reason"``: the same without commas, opening with "Because the" (a
# decision's reasoning; the bundled model otherwise writes a line of dialogue there, "Let's
# talk about the storm.", or runs on: "Because the stranger, but I'm Bram").
REASON_PATTERN = r"^Because the( [A-Za-z0-9'-]+){2,30}[.!]$"


def for_grammar(schema: Any, where: str, warnings: list[str], string_max: int | None) -> Any:
    """A copy of ``schema`` for the grammar: unbounded strings get ``string_max`` and every
    keyword the grammar cannot enforce is named in ``warnings``."""
    if isinstance(schema, list):
        return [for_grammar(x, where, warnings, string_max) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, val in schema.items():
        if key in NOT_IN_GRAMMAR:
            warnings.append(f"{where}: '{key}' is not enforced while generating (checked afterwards)")
        if key == "format" and val not in GRAMMAR_FORMATS:
            warnings.append(f"{where}: format '{val}' is not enforced while generating (checked afterwards)")
        if key in ("properties", "$defs", "definitions") and isinstance(val, dict):
            out[key] = {k: for_grammar(v, f"{where}.{k}", warnings, string_max) for k, v in val.items()}
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties"):
            out[key] = for_grammar(val, where, warnings, string_max)
        else:
            out[key] = val
    if (
        out.get(PROSE) in (True, "reason")
        and out.get("type") == "string"
        and not any(k in out for k in ("enum", "const", "pattern", "format"))
    ):
        out["pattern"] = REASON_PATTERN if out[PROSE] == "reason" else PROSE_PATTERN
        out.pop("maxLength", None)
    bounded = any(k in out for k in ("maxLength", "enum", "const", "pattern", "format"))
    if string_max is not None and out.get("type") == "string" and not bounded:
        out["maxLength"] = string_max
    return out


def pinned_parameters(parameters: dict[str, Any], pins: dict[str, str]) -> dict[str, Any]:
    """A tool's parameters with each pinned top-level argument held to its one value."""
    props = parameters.get("properties")
    if not pins or not isinstance(props, dict):
        return parameters
    return {**parameters, "properties": {k: {"const": pins[k]} if k in pins else v for k, v in props.items()}}


def tools_schema(
    tools: list[ToolSpec],
    warnings: list[str],
    max_calls: int = MAX_CALLS,
    pinned: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The JSON Schema of one call batch: ``{"tool_calls": [{"name", "arguments"}, ...]}``,
    1 to ``max_calls`` calls; ``pinned``: per tool, arguments held to one value."""
    pinned = pinned or {}
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                "arguments": for_grammar(
                    pinned_parameters(t.parameters or {"type": "object"}, pinned.get(t.name, {})),
                    f"tool {t.name}",
                    warnings,
                    TOOL_STRING_MAX,
                ),
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    return {
        "type": "object",
        "properties": {
            "tool_calls": {
                "type": "array",
                "items": items[0] if len(items) == 1 else {"anyOf": items},
                "minItems": 1,
                "maxItems": max_calls,
            }
        },
        "required": ["tool_calls"],
    }


def compact_repetition(grammar: str) -> str:
    """llama-cpp-python's converter spells ``maxLength`` N as N nested optionals, which the
    grammar sampler then tracks as N nested stacks; llama.cpp parses ``char{0,N}`` itself."""
    import llama_cpp.llama_grammar

    converter: Any = llama_cpp.llama_grammar  # a private helper, untyped
    for atom, n in (("char", TOOL_STRING_MAX), ("[0-9]", 15)):  # bounded strings; integers' digits
        grammar = grammar.replace(converter._build_repetition(atom, 0, n), f"{atom}{{0,{n}}}")
    return grammar


# A character of a JSON string. llama-cpp-python's converter allows any character but the
# quote and the backslash, raw control characters too, which JSON forbids in a string: a line
# break the model wrote inside "reasoning" would make an answer no JSON parser reads.
# llama.cpp's own converter excludes them, as this rule does.
JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def gbnf(schema: dict[str, Any]) -> str:
    """GBNF for one JSON Schema (root rule ``root``)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    text = compact_repetition(str(json_schema_to_gbnf(json.dumps(schema))))
    return re.sub(r"^char ::= .*$", lambda _m: JSON_CHAR, text, count=1, flags=re.M)


def call_limit(request: StepRequest) -> int:
    """Calls one batch may hold: the request's ``max_calls`` (at least 1), at most ``MAX_CALLS``."""
    return MAX_CALLS if request.max_calls is None else max(1, min(MAX_CALLS, request.max_calls))


def make_grammar(
    tools: list[ToolSpec],
    mode: str,
    schema: dict[str, Any] | None,
    max_calls: int = MAX_CALLS,
    pinned: dict[str, dict[str, str]] | None = None,
) -> Grammar:
    warnings: list[str] = []

    def answer() -> str:
        return gbnf(for_grammar(schema, "schema", warnings, TOOL_STRING_MAX))

    if not tools:
        return (answer() if schema is not None else None), tuple(dict.fromkeys(warnings))
    call = gbnf(tools_schema(tools, warnings, max_calls, pinned)).replace("root ::=", "oamcall ::=", 1)
    if mode == "required":
        text = call + "\nroot ::= oamcall\n"
    elif schema is not None:
        ans = answer()
        # prefix every rule of the answer grammar to avoid collisions
        names = set(re.findall(r"^([A-Za-z0-9-]+) ::=", ans, re.M))
        for n in sorted(names, key=len, reverse=True):
            ans = re.sub(rf"(?<![A-Za-z0-9-]){re.escape(n)}(?![A-Za-z0-9-])", f"oamans-{n}", ans)
        text = call + "\n" + ans + "\nroot ::= oamcall | oamans-root\n"
    else:
        # a tool call starts with '{"tool_calls"'; free text has no brace at all (a small
        # model otherwise speaks JSON envelopes as dialogue)
        text = call + "\noamtext ::= [^{} \\t\\n\\r] [^{}\\x00]*\nroot ::= oamcall | oamtext\n"
    return text, tuple(dict.fromkeys(warnings))


_cache: dict[bytes, Grammar] = {}  # JSON of (tools, mode, schema, call limit, pins) -> grammar
_cache_lock = threading.Lock()  # grammars are built on generation threads


def build_grammar(request: StepRequest) -> tuple[str | None, list[str]]:
    """The step's grammar (None: free text) and the schema warnings, cached by what decides
    them: the same tools, mode, schema, call limit and pinned arguments give the same grammar.

    Raises whatever the schema converter raises on a schema it cannot handle."""
    tools = request.tools
    mode = request.tool_mode if tools else ""
    limit = call_limit(request) if tools else MAX_CALLS
    pinned = {t.name: request.pinned[t.name] for t in tools if request.pinned.get(t.name)}
    # Insertion order kept in the key: properties are generated in the schema's order.
    key = msgspec.json.encode([tools, mode, request.schema, limit, pinned])
    with _cache_lock:
        hit = _cache.get(key)
    if hit is None:
        hit = make_grammar(tools, mode, request.schema, limit, pinned)
        with _cache_lock:
            if len(_cache) >= GRAMMAR_CACHE_SIZE:
                _cache.clear()
            _cache[key] = hit
    return hit[0], list(hit[1])


class CallSniffer:
    """A step's streamed output when it may be a call batch (the grammar allows text or
    ``{"tool_calls":[...]}``): text passes through as soon as it cannot be the start of
    ``CALL_PREFIX``; a batch is held whole. Used by every engine that streams grammar output
    (the llama engine, the openai engine's grammar mode)."""

    def __init__(self, may_call: bool) -> None:
        self.state: str | None = None if may_call else "text"  # None: undecided; "call"; "text"
        self.held = ""

    def feed(self, piece: str) -> str:
        """The text to show now ("" while held)."""
        if self.state == "text":
            return piece
        self.held += piece
        if self.state is None:
            norm = "".join(self.held.split())
            if norm.startswith(CALL_PREFIX):
                self.state = "call"
            elif not CALL_PREFIX.startswith(norm):
                self.state = "text"
                out, self.held = self.held, ""
                return out
        return ""

    def end(self, finish: str) -> tuple[list[dict[str, Any]], str]:
        """At the end of the step: (the held batch's calls, text still to show). A batch
        with no whole call fails ``generation_failed``, saying whether maxTokens cut it."""
        held, self.held = self.held, ""
        if not held:
            return [], ""
        calls = complete_calls(held)
        if calls:
            return calls, ""
        if self.state == "call":
            what = "cut off by maxTokens" if finish == "length" else "malformed"
            raise BridgeError(
                "generation_failed", f"the model's tool call was {what}", text=held[:200], finish_reason=finish
            )
        return [], held  # a short answer that looked like the start of a call


def complete_calls(text: str) -> list[dict[str, Any]]:
    """The calls in a (possibly cut-off) ``{"tool_calls":[...]}`` text: every call object
    that was generated whole, each once: a small model repeats a call in one batch
    (``get_menu`` four times for "What's on the menu?"), and the same name with the same
    arguments is one call. The grammar makes each one valid, so only a call cut off by
    ``maxTokens`` is lost, never the ones before it."""
    start = text.find("[")
    if start < 0:
        return []
    dec = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    seen: set[str] = set()
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] != "{":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            key = json.dumps([obj["name"], obj.get("arguments") or {}], sort_keys=True)
            if key not in seen:
                seen.add(key)
                calls.append(obj)
    return calls
