"""Tool-call arguments from the player's words: pure functions, the same on every engine.

A small model asked "Do you have any ale left?" with ``check_inventory(item: ale|bread|stew)``
may still ask for bread, or for a made-up name when ``item`` is a free string. On the first
step of a turn (the player's line, never a later step of its tool rounds) the agent:

- before the step, works out the values the line *pins* (``enum_pins``): for each top-level
  argument with a closed set of string values (``enum``, or ``anyOf``/``oneOf`` of ``const``),
  the one value the line names. An engine that constrains generation holds the call to it (the
  llama engine's grammar, ``StepRequest.pinned``);
- after the step, whatever the engine, sets each pinned argument the model got wrong to the
  pinned value, and a tool's one free string argument to the span of the line it names
  (``line_phrase``), each with a warning (``pin_calls``).

Where the bridge routes the turn because the engine's model chooses badly (``routing``
``semantic``), two more rules hold, since such a model's own values are near chance:
a closed argument the line does not name may be pinned by what the line *means*
(``_routing.meaning_pins``: "anything for snake venom?" gives ``antidote``, from the tool's
description "an antidote for poison or venom"), and a free string takes a span of the line
even when the model's value is other words of it (``line_span``: the line's one noun phrase,
else its main clause: "I took an arrow in the leg, can you patch me up?" gives "took an arrow
in the leg").

The rules, kept simple so they can be measured and predicted:

- Words are compared case-insensitively, a singular matching its simple plural ("ale" and
  "ales", "loaf" and "loafs" but not "loaves", "berry" and "berries", "potato" and
  "potatoes") and a verb its -ing and -ed forms ("hunt", "hunting", "hunted"; "trade",
  "trading", "traded"); a value of several words ("back door", "front_gate") matches those words in a
  row. A value found inside a longer value's match does not count ("door" in "back door"),
  nor does a value of function words only ("a", "on", "none": said for other reasons).
- The line pins a closed argument only when it names exactly one of its values: two values
  named ("ale or bread?") leave the model's choice alone, as does a line naming none.
- A tool's only integer argument takes the one count the line says, in digits or words
  ("two ales" gives 2, "a dozen eggs" 12; several counts, or one outside the argument's
  ``minimum``/``maximum``/``enum``: the model's value stands).
- A free string argument (no ``enum``, ``const``, ``pattern`` or ``format``) is touched only
  when it is the tool's only one, and only when the model's value is not already words of the
  line. It takes the line's one quoted phrase; without a quote, when it holds a name (its
  name is not one that holds prose, such as ``text`` or ``message``, or the model's value is at
  most three words), the line's one noun phrase: the words after a
  determiner ("any ale left?" gives "ale"; "a bowl of stew" gives "stew", the words after
  "of"), or a capitalised name inside the line ("Have you seen Marcus?"). Several candidates,
  or a span breaking the argument's ``minLength``/``maxLength``: the model's value stands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from bridge.engines.base import ToolCall, ToolSpec

# Words of a line (letters and digits, inner apostrophes and hyphens kept) and punctuation.
_TOKEN = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*|[^\w\s]")
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”|(?:^|(?<=\s))[\'‘]([^\'‘’]+)[\'’](?=$|[\s.,!?;:])')

DETERMINERS = frozenset(
    "a an the any some more another my your his her its our their this that these those "
    "one two three four five six seven eight nine ten few several many much".split()
)
# Words that end a noun phrase (besides punctuation and determiners): what follows the noun
# in a player's line is seldom part of it.
STOP_WORDS = frozenset(
    "of and or but nor to for with without in on at from by about into onto over under up down "
    "out off as than then so if left please here there now today tonight too also again still "
    "yet anymore is are was were be been am do does did have has had will would can could "
    "should shall may might must i me you he him she we us they them it who what which when "
    "where why how not no yes".split()
)
SENTENCE_ENDS = frozenset(".!?")
MAX_PHRASE_WORDS = 3
MAX_NAME_WORDS = 3  # a model's value of more words is prose, not a name, in a prose argument
# Argument names (or words of them: ``note_text``) that hold prose rather than a name.
PROSE_ARGS = frozenset(
    "text message note content body description reason summary comment speech line say reply "
    "answer story details explanation query question request words".split()
)


def words(text: str) -> list[str]:
    """The lower-cased words of ``text`` (``_`` and ``-`` separate words, as in a value)."""
    return [w.lower() for w in _WORD.findall(text.replace("-", " "))]


def _forms(word: str) -> set[str]:
    forms = {word + "s", word + "es"}
    if len(word) > 1 and word.endswith("y"):
        forms.add(word[:-1] + "ies")
    if len(word) > 2:  # a verb's -ing and -ed forms ("hunting", "traded"; not "a" -> "aing")
        forms |= {word + "ing", word + "ed"}
        if word.endswith("e"):
            forms |= {word[:-1] + "ing", word + "d"}
    return forms


def same_word(a: str, b: str) -> bool:
    """Whether two lower-cased words are the same up to a simple plural or a verb form."""
    return a == b or a in _forms(b) or b in _forms(a)


def find(line: list[str], value: list[str]) -> list[int]:
    """Where the words ``value`` occur in a row in the words ``line``."""
    n = len(value)
    if n == 0:
        return []
    return [i for i in range(len(line) - n + 1) if all(same_word(line[i + k], value[k]) for k in range(n))]


def closed_values(schema: Any) -> list[str] | None:
    """The string values of a closed argument (``enum``; ``anyOf``/``oneOf`` of ``const``),
    or None for any other argument."""
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list):
        values = schema["enum"]
    else:
        alts = schema.get("anyOf", schema.get("oneOf"))
        if not isinstance(alts, list) or not alts:
            return None
        if not all(isinstance(a, dict) and "const" in a for a in alts):
            return None
        values = [a["const"] for a in alts]
    strings = [v for v in values if isinstance(v, str)]
    return strings or None


def is_free_string(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and schema.get("type") == "string"
        and not any(k in schema for k in ("enum", "const", "pattern", "format", "anyOf", "oneOf"))
    )


def named_value(line: str, values: Iterable[str]) -> str | None:
    """The one value of a closed set the line names, or None (none, or several)."""
    said = words(line)
    spans: list[tuple[int, int, str]] = []
    for value in values:
        vw = words(value)
        if all(_stops(w) for w in vw):  # "a", "on", "none": said for other reasons
            continue
        spans.extend((i, i + len(vw), value) for i in find(said, vw))
    kept = {v for s, e, v in spans if not any(s2 <= s and e <= e2 and (e2 - s2) > (e - s) for s2, e2, _ in spans)}
    return kept.pop() if len(kept) == 1 else None


def _properties(tool: ToolSpec) -> dict[str, Any]:
    props = tool.parameters.get("properties")
    return props if isinstance(props, dict) else {}


def enum_pins(line: str, tools: Iterable[ToolSpec]) -> dict[str, dict[str, str]]:
    """Per tool, the values the line pins for its closed arguments (tools and arguments the
    line pins nothing for are left out)."""
    out: dict[str, dict[str, str]] = {}
    for tool in tools:
        pins = {}
        for arg, schema in _properties(tool).items():
            values = closed_values(schema)
            value = named_value(line, values) if values else None
            if value is not None:
                pins[arg] = value
        if pins:
            out[tool.name] = pins
    return out


def quoted(line: str) -> list[str]:
    """The phrases the line quotes, in order."""
    return [next(g for g in m.groups() if g is not None).strip() for m in _QUOTED.finditer(line)]


def noun_phrases(line: str) -> list[str]:
    """The line's noun phrases, in order: the words after a determiner up to a stop word or
    punctuation (at most three; after "of", the phrase that follows it), and capitalised names
    that do not start a sentence."""
    tokens = _TOKEN.findall(line)
    low = [t.lower() for t in tokens]

    def phrase(i: int) -> tuple[int, int]:
        """The phrase starting at token i (past any determiners): its token span."""
        while i < len(tokens) and low[i] in DETERMINERS:
            i += 1
        j = i
        while j < len(tokens) and j - i < MAX_PHRASE_WORDS and _WORD.fullmatch(tokens[j]) and not _stops(low[j]):
            j += 1
        if j > i and j < len(tokens) and low[j] == "of":
            k, end = phrase(j + 1)
            if end > k:
                return k, end
        return i, j

    out: list[str] = []
    covered: set[int] = set()
    i = 0
    while i < len(tokens):
        if low[i] in DETERMINERS:
            s, e = phrase(i)
            if e > s:
                out.append(" ".join(tokens[s:e]))
                covered.update(range(i, e))
                i = e
                continue
        i += 1
    starts = {0} | {k + 1 for k, t in enumerate(tokens) if t in SENTENCE_ENDS}
    k = 0
    while k < len(tokens):
        if k not in starts and k not in covered and _is_name(tokens[k]):
            e = k
            while e < len(tokens) and e not in covered and _is_name(tokens[e]):
                e += 1
            out.append(" ".join(tokens[k:e]))
            k = e
            continue
        k += 1
    return out


def _stops(word: str) -> bool:
    return word in STOP_WORDS or word in DETERMINERS


def _is_name(token: str) -> bool:
    return (
        token[:1].isupper()
        and token != "I"
        and not token.startswith(("I'", "I’"))  # "I'm", "I've": the player, not a name
        and _WORD.fullmatch(token) is not None
    )


def line_phrase(line: str, name_like: bool) -> str | None:
    """The span of the line a free string argument takes: its one quoted phrase; without
    one, its one noun phrase when the argument holds a name (``name_like``). None: no span
    fits, or several do."""
    quotes = list(dict.fromkeys(quoted(line)))
    if quotes:
        return quotes[0] if len(quotes) == 1 else None
    if not name_like:
        return None
    phrases = list(dict.fromkeys(p.lower() for p in noun_phrases(line)))
    if len(phrases) != 1:
        return None
    return next(p for p in noun_phrases(line) if p.lower() == phrases[0])


# Words a clause span does not start or end with, besides stop words and determiners: a
# player's contractions and the words that only ask ("please", "help me").
_EDGE_WORDS = frozenset(
    "i'm i've i'd i'll you're you've you'd it's that's there's don't can't won't didn't couldn't just really "
    "help sorry thanks thank".split()
)
MAX_CLAUSE_WORDS = 8
_CLAUSE_ENDS = frozenset(".!?,;:")


def _edge(word: str) -> bool:
    return _stops(word) or word in _EDGE_WORDS


def main_clause(line: str) -> str | None:
    """The line's main clause, trimmed to its words that carry meaning: of the clauses between
    punctuation marks, the one with the most noun phrases, then the most words that are not
    stop words (the first on a tie), less the stop words at either end; at most
    ``MAX_CLAUSE_WORDS`` words (cut at the last noun phrase that fits). None: no such word."""
    tokens = _TOKEN.findall(line)
    clauses: list[list[str]] = [[]]
    for t in tokens:
        if t in _CLAUSE_ENDS:
            clauses.append([])
        elif _WORD.fullmatch(t):
            clauses[-1].append(t)
    best: tuple[int, int] | None = None
    chosen: list[str] = []
    for clause in clauses:
        low = [w.lower() for w in clause]
        key = (len(noun_phrases(" ".join(clause))), sum(not _edge(w) for w in low))
        if key[1] and (best is None or key > best):
            best, chosen = key, clause
    if best is None:
        return None
    low = [w.lower() for w in chosen]
    s, e = 0, len(chosen)
    while s < e and _edge(low[s]):
        s += 1
    while e > s and _edge(low[e - 1]):
        e -= 1
    if e - s > MAX_CLAUSE_WORDS:
        e = s + MAX_CLAUSE_WORDS
        while e > s + 1 and _edge(low[e - 1]):
            e -= 1
    return " ".join(chosen[s:e])


def line_span(line: str) -> str | None:
    """The span of the line a free string takes where the bridge routes (``semantic``): its
    one quoted phrase, else its one noun phrase (``line_phrase``), else its main clause
    (``main_clause``); None when it quotes several phrases."""
    return line_phrase(line, name_like=True) or (None if quoted(line) else main_clause(line))


NUMBER_WORDS = {
    w: n for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
}
NUMBER_WORDS |= {"a dozen": 12, "dozen": 12, "a couple of": 2, "a pair of": 2}
_NUMBER = re.compile(
    r"(?<![\w.,-])(\d{1,6})(?!\w|[.,]\d)|\b("
    + "|".join(sorted((re.escape(w) for w in NUMBER_WORDS), key=len, reverse=True))
    + r")\b",
    re.I,
)
_ARTICLE = re.compile(r"\b(?:a|an)\s+[^\W\d_]", re.I)


def line_number(line: str, article: bool = False) -> int | None:
    """The one count the line says, in digits or words ("two ales", "3 loaves", "a dozen
    eggs"); None for none or several. ``article``: with no count said, "a"/"an" before a word
    says 1 ("A bowl of lamb stew"), where the bridge routes (a weak model's own count is a
    guess)."""
    said = {int(m[1]) if m[1] else NUMBER_WORDS[m[2].lower()] for m in _NUMBER.finditer(line)}
    if len(said) == 1:
        return said.pop()
    if not said and article and _ARTICLE.search(line):
        return 1
    return None


def _in_bounds(n: int, schema: Mapping[str, Any]) -> bool:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if isinstance(schema.get("enum"), list) and n not in schema["enum"]:
        return False
    return (not isinstance(lo, (int, float)) or n >= lo) and (not isinstance(hi, (int, float)) or n <= hi)


def _fits(value: str, schema: Mapping[str, Any]) -> bool:
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    return (not isinstance(lo, int) or len(value) >= lo) and (not isinstance(hi, int) or len(value) <= hi)


def _said(line: str, value: str) -> bool:
    """Whether ``value`` is words of the line (up to case and simple plurals)."""
    return bool(find(words(line), words(value)))


def pin_call(
    call: ToolCall,
    tool: ToolSpec | None,
    line: str,
    meant: Mapping[str, str] | None = None,
    routed: bool = False,
) -> tuple[ToolCall, list[str]]:
    """The call with the arguments the line pins, and a warning for each value replaced.
    ``meant``: the closed values the line means (``_routing.meaning_pins``), for arguments its
    words pin nothing for; ``routed``: the bridge routed the turn (a weak model's free string
    takes ``line_span`` whatever it was)."""
    if tool is None:
        return call, []
    props = _properties(tool)
    args = dict(call.arguments)
    warnings: list[str] = []

    def replace(arg: str, value: str | int) -> None:
        if arg in args and args[arg] == value and type(args[arg]) is type(value):
            return
        was = json.dumps(args[arg]) if arg in args else "nothing"
        warnings.append(
            f"tool call {call.id} ({call.name}): argument {arg!r} set to {json.dumps(value)} "
            f"from the player's line (the model gave {was})"
        )
        args[arg] = value

    said = enum_pins(line, [tool]).get(tool.name, {})
    for arg, value in {**(meant or {}), **said}.items():
        replace(arg, value)
    counts = [a for a, s in props.items() if isinstance(s, dict) and s.get("type") == "integer"]
    if len(counts) == 1:
        number = line_number(line, article=routed)
        if number is not None and _in_bounds(number, props[counts[0]]):
            replace(counts[0], number)
    free = [a for a, s in props.items() if is_free_string(s)]
    if len(free) == 1 and routed and free[0] in args:
        span = line_span(line)
        if span is not None and _fits(span, props[free[0]]):
            replace(free[0], span)
    elif len(free) == 1 and isinstance(args.get(free[0]), str):
        arg, model_value = free[0], args[free[0]]
        if not _said(line, model_value):
            prose = any(w in PROSE_ARGS for w in words(arg))
            span = line_phrase(line, name_like=not prose or len(model_value.split()) <= MAX_NAME_WORDS)
            if span is not None and _fits(span, props[arg]):
                replace(arg, span)
    if not warnings:
        return call, []
    return ToolCall(call.id, call.name, args), warnings


def pin_calls(
    calls: list[ToolCall],
    tools: Mapping[str, ToolSpec],
    line: str,
    meant: Mapping[str, Mapping[str, str]] | None = None,
    routed: bool = False,
) -> tuple[list[ToolCall], list[str]]:
    """``pin_call`` for each call of a step's batch: the calls, and the warnings."""
    out: list[ToolCall] = []
    warnings: list[str] = []
    for call in calls:
        pinned, said = pin_call(call, tools.get(call.name), line, (meant or {}).get(call.name), routed)
        out.append(pinned)
        warnings.extend(said)
    return out, warnings
