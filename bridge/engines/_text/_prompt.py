"""Rendering a step into the model's prompt text with the GGUF file's chat template."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from bridge.engines.base import Message, ToolSpec, user_text


def _describe(schema: Any) -> str:
    """A property's schema in a few words: its allowed values, or its type."""
    if not isinstance(schema, dict):
        return ""
    if "enum" in schema and isinstance(schema["enum"], list):
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    if "const" in schema:
        return f"always {schema['const']}"
    kind = schema.get("type")
    what = kind if isinstance(kind, str) else ""
    if isinstance(schema.get("description"), str):
        what = (what + ", " if what else "") + schema["description"]
    return what


def _props(schema: Any) -> list[str]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    return [f"{k} ({d})" if (d := _describe(v)) else k for k, v in props.items()]


def _arguments(parameters: Any) -> str:
    props = _props(parameters)
    return f" with {', '.join(props)}" if props else ""


def _union_properties(schema: Any) -> dict[str, Any] | None:
    """The properties of an ``anyOf``/``oneOf`` of object schemas (an ``npc/decide`` whose
    options take arguments: one object per option), merged in the order they first appear:
    the answer has these fields whichever alternative the grammar takes. None when an
    alternative is not an object schema with properties."""
    members = next((schema[k] for k in ("anyOf", "oneOf") if isinstance(schema.get(k), list)), None)
    if not members:
        return None
    merged: dict[str, Any] = {}
    for m in members:
        props = m.get("properties") if isinstance(m, dict) else None
        if not isinstance(props, dict) or not props:
            return None
        for k, v in props.items():
            if k not in merged or (isinstance(v, dict) and "description" in v and "description" not in merged[k]):
                merged[k] = v
    return merged


def _fields(schema: Any) -> str:
    """The answer's fields by name, with the game's descriptions only: allowed values and
    types are the grammar's to enforce, and a small model copies a list of them into the
    line it speaks. A union of objects (an ``npc/decide`` with argument schemas) is told as
    the fields its alternatives share, in order, never as JSON Schema."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if (not isinstance(props, dict) or not props) and isinstance(schema, dict):
        props = _union_properties(schema)
    if not isinstance(props, dict) or not props:
        return f" matching {json.dumps(schema)}"
    said = [
        f"{k} ({v['description']})" if isinstance(v, dict) and isinstance(v.get("description"), str) else k
        for k, v in props.items()
    ]
    return f" with the fields {'; '.join(said)}"


def _key(key: str) -> str:
    """A JSON key as words: ``inStock`` and ``in_stock`` say "in stock"."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).replace("_", " ").lower()


def _words(content: str) -> str:
    """A tool output in plain words: JSON objects and lists lose their braces and quotes
    (a small model copies braces into its speech), anything else is shown as it is."""
    try:
        value = json.loads(content)
    except ValueError:
        return content

    def say(v: Any) -> str:
        if isinstance(v, dict):
            return ", ".join(f"{_key(k)} {say(x)}" for k, x in v.items())
        if isinstance(v, list):
            return "; ".join(say(x) for x in v)
        if v is None:
            return "none"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return str(v)

    return say(value)


# Numbers a tool answered that the NPC's line must say (``values_to_say``).
SAY_MAX_VALUES = 2  # more numbers than this in a step's tool results (a menu, a position): none
SAY_MAX_DIGITS = 6  # longer numbers are ids or timestamps, not something an NPC says
SAY_MAX_DECIMALS = 2  # 2.5 gold is said; 0.7312 is a ratio for the game, not the player
# Words of a key that make its number an identifier, a timestamp, a version or a coordinate,
# never said ("id", "orderId", "npc_id", "timestamp", "createdAt", "x"); the key's words as
# ``_key`` splits them.
NOT_SAID_KEYS = frozenset(
    {
        "id",
        "ids",
        "uuid",
        "guid",
        "key",
        "hash",
        "code",
        "seed",
        "version",
        "revision",
        "rev",
        "index",
        "idx",
        "timestamp",
        "date",
        "at",
        "epoch",
        "ms",
        "port",
        "x",
        "y",
        "z",
    }
)


def _said_number(key: str | None, v: Any) -> str | None:
    """How ``v`` (a value under ``key``) is said, if it is a number the line must say."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    if key is not None and NOT_SAID_KEYS & set(re.split(r"[\s-]+", _key(key))):
        return None
    if isinstance(v, float):
        if v.is_integer():
            v = int(v)
        else:
            text = repr(v)
            if "e" in text or len(text.split(".")[1]) > SAY_MAX_DECIMALS:
                return None
            return text if len(text.split(".")[0]) <= SAY_MAX_DIGITS else None
    return str(v) if len(str(v)) <= SAY_MAX_DIGITS else None


def values_to_say(outputs: list[Any]) -> list[str]:
    """The numbers in the tool outputs ``outputs`` (decoded JSON) that an NPC's line must
    say: a count, a price, an amount (``{"item": "ale", "inStock": 3}``: ``3``), and an amount
    written as a string under a price or count key (``{"fare": "4 copper"}``: ``4 copper``),
    in order, each once. Not said: booleans (``{"ok": true}``), other strings (names are only
    favoured: see ``fact_values``), negative numbers, numbers under a key naming an identifier, a
    timestamp, a version or a coordinate (``NOT_SAID_KEYS``: ``id``, ``orderId``,
    ``timestamp``, ``x``), numbers of more than ``SAY_MAX_DIGITS`` digits or
    ``SAY_MAX_DECIMALS`` decimals; and none at all when more than ``SAY_MAX_VALUES`` qualify
    (a menu: a line cannot say every price, and the game that wants one said names it in its
    own line)."""
    said: list[str] = []

    def walk(key: str | None, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(str(k), x)
        elif isinstance(v, list):
            if any(isinstance(x, dict) and _entry(x) is not None for x in v):
                return  # a menu's prices: said with their entries (``entries_to_say``)
            for x in v:
                walk(key, x)
        elif (text := _said_number(key, v)) is not None:
            said.append(text)
        elif isinstance(v, str) and key is not None and _key_words(key) & (PRICE_KEYS | COUNT_KEYS):
            if _AMOUNT.fullmatch(v.strip()):
                said.append(v.strip())  # a price as the game writes it: "4 copper"

    for out in outputs:
        walk(None, out)
    said = list(dict.fromkeys(said))
    return said if len(said) <= SAY_MAX_VALUES else []


# The entries of a list the tools answered (a menu, a shop's wares) that a line must name
# with their price or count (``entries_to_say``): the ones the player's line names, or, when
# it names none, the first ``LIST_MAX_ENTRIES``.
LIST_MAX_ENTRIES = 4
ENTRY_MAX_CHARS = 40  # a longer string is a description, not a name
# A key's words that make its string an entry's name, its price, or its count.
NAME_KEYS = frozenset({"name", "item", "title", "dish", "drink", "food", "product", "label", "ware", "good"})
PRICE_KEYS = frozenset({"price", "cost", "fee", "fare", "rate", "reward", "pay", "toll", "charge"})
# A string amount said as it is: a number and a unit of a word or two ("4 copper", "12 gold coins").
_AMOUNT = re.compile(r"\d{1,6}(?:\.\d{1,2})? [A-Za-z]{2,12}(?: [A-Za-z]{2,12})?")
COUNT_KEYS = frozenset({"count", "qty", "quantity", "stock", "left", "amount", "number", "available"})
UNIT_KEYS = frozenset({"currency", "coin", "coins", "unit", "units"})
_FILLER = frozenset({"the", "a", "an", "of", "and", "with", "for", "some", "bowl", "cup", "mug", "pint", "glass"})


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a list a tool answered, as a line names it: ``name`` ("lamb stew"),
    ``detail`` ("5 copper", or a count), and ``text``, the two in one phrase ("lamb stew for
    5 copper", "3 lamb stew")."""

    name: str
    detail: str
    text: str


def _key_words(key: str) -> set[str]:
    return set(re.split(r"[\s-]+", _key(key)))


def _entry(record: dict[str, Any]) -> Entry | None:
    """``record`` as an entry a line names, if it has a name and a price or a count."""
    name = price = count = unit = None
    for k, v in record.items():
        words = _key_words(str(k))
        if isinstance(v, str) and not 0 < len(v.strip()) <= ENTRY_MAX_CHARS:
            continue
        if isinstance(v, str) and name is None and words & NAME_KEYS:
            name = v.strip()
        elif isinstance(v, str) and unit is None and words & UNIT_KEYS:
            unit = v.strip()
        elif price is None and words & PRICE_KEYS and isinstance(v, (int, float, str)) and not isinstance(v, bool):
            price = v if isinstance(v, str) else _said_number(None, v)
        elif count is None and words & COUNT_KEYS and not isinstance(v, (str, bool)):
            count = _said_number(None, v) if isinstance(v, (int, float)) else None
    if name is None:
        return None
    if price is not None:
        detail = f"{price} {unit}" if unit and re.fullmatch(r"[\d.]+", price) else price
        return Entry(name, detail, f"{name} for {detail}")
    if count is not None:
        return Entry(name, count, f"{count} {name}")
    return None


def _named(name: str, words: set[str]) -> bool:
    """Whether a player's line (its ``words``) names the entry ``name``: one of the name's
    own words ("stew" for "lamb stew"), a plural's "s" aside."""
    own = {w for w in re.findall(r"[a-z]+", name.lower()) if w not in _FILLER and len(w) > 2}
    return bool(own & words)


def entries_to_say(outputs: list[Any], player: str) -> list[Entry]:
    """The entries of lists in the tool outputs ``outputs`` (decoded JSON) that a line must
    name with their price or count: a menu's dishes, a shop's wares, records with a name (under
    a key such as ``item`` or ``name``) and a price or a count. The entries ``player``'s line
    names ("How much is the mead?": the mead), or, when it names none ("What can I buy?"), the
    first ``LIST_MAX_ENTRIES`` of the first list; in the list's order, each once."""
    lists: list[list[Entry]] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            entries = [e for x in v if isinstance(x, dict) and (e := _entry(x)) is not None]
            if entries:
                lists.append(entries)
            else:
                for x in v:
                    walk(x)

    for out in outputs:
        walk(out)
    words = set()
    for w in re.findall(r"[a-z]+", player.lower()):
        words.add(w)
        if len(w) > 3 and w.endswith("s"):
            words.add(w[:-1])
    asked = [e for entries in lists for e in entries if _named(e.name, words)]
    said = asked or (lists[0][:LIST_MAX_ENTRIES] if lists else [])
    return list(dict.fromkeys(said))


def turn_start(messages: list[Message]) -> int:
    """Where the turn being generated starts: the index of its prompt line (the last user
    message, the player's or another speaker's: see ``base.user_text``), or -1 when there
    is none."""
    return max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)


# Where a step's prompt comes from (``PromptRenderer.source``, ``EngineInfo.chat_template``).
TEMPLATE_GGUF = "gguf"  # the model file's own chat template
TEMPLATE_FALLBACK = "chatml-fallback"  # the file has none: ChatML, which the model may not know
# ChatML's markers, which end a step rendered with the fallback (``PromptRenderer.stop_markers``).
CHATML_MARKERS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")
# What a chat template's turn markers look like: ``<|im_end|>``, ``<|eot_id|>``,
# ``<end_of_turn>``, ``</s>``, ``[INST]``. Found in the text a template puts between turns.
_MARKER = re.compile(r"<\|[^<>|\s]{1,40}\|>|</?[A-Za-z_][\w.:-]{0,40}>|\[/?[A-Z][A-Z_]{1,20}\]")
# A conversation rendered to find a template's markers: contents no template adds itself.
_PROBE = ("oam-probe-u1", "oam-probe-a1", "oam-probe-u2")


def template_markers(template: Any, eos_token: str = "") -> tuple[str, ...]:
    """The turn markers a compiled chat template writes around a turn, in the order it writes
    them: what it puts between an assistant's line and the next user line, and after that
    line up to where the assistant speaks (Gemma: ``<end_of_turn>``, ``<start_of_turn>``;
    Llama 3: ``<|eot_id|>``, ``<|start_header_id|>``, ``<|end_header_id|>``), and the EOS
    token when it is shaped like one. Empty when the template cannot render the probe."""
    u1, a1, u2 = _PROBE
    msgs = [{"role": "user", "content": u1}, {"role": "assistant", "content": a1}, {"role": "user", "content": u2}]
    try:
        text = str(template.render(messages=msgs, add_generation_prompt=True, eos_token=eos_token, bos_token=""))
    except Exception:  # noqa: BLE001 - the model's own template: it may raise anything
        return ()
    found: list[str] = []
    if (i := text.find(a1)) >= 0:
        found += _MARKER.findall(text[i + len(a1) :].replace(u2, " "))
    if eos_token and _MARKER.fullmatch(eos_token):
        found.append(eos_token)
    return tuple(dict.fromkeys(found))


def _raise(msg: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(msg)


class PromptRenderer:
    """Turns (instructions, messages, tools, mode, schema) into prompt text.

    Stateless after construction and safe to use from several threads at once (a compiled
    jinja template renders without shared mutable state).
    """

    def __init__(self, template: str | None, eos_token: str, bos_token: str) -> None:
        # jinja2 comes with llama-cpp-python: imported here, so that importing the engine
        # package works (and says "not installed" through availability()) without it.
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # A GGUF file's chat template is data from the model's author: render it sandboxed.
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self._jinja = env.from_string(template) if template else None
        self._eos, self._bos = eos_token, bos_token
        # where the prompt's form comes from, and the markers that end a step (never said)
        self.source = TEMPLATE_GGUF if self._jinja is not None else TEMPLATE_FALLBACK
        self.stop_markers = template_markers(self._jinja, eos_token) if self._jinja is not None else CHATML_MARKERS

    @staticmethod
    def system_text(instructions: str, tools: list[ToolSpec], tool_mode: str, schema: dict[str, Any] | None) -> str:
        """The system message: the instructions, the step's tools exactly as the request gives
        them (the agent decides which a step shows; "must" on a required step) and the
        answer's fields.

        Tools and fields are described in words, not as JSON Schema: a small model repeats
        what it reads, and the grammar enforces the exact shape anyway."""
        parts = [instructions] if instructions else []
        if tools:
            lines = ["Tools the game runs for you:"]
            lines += [f"- {t.name}{_arguments(t.parameters)}: {t.description}".rstrip() for t in tools]
            if tool_mode == "required":
                lines.append("Call one of these tools now.")
            else:
                lines.append(
                    "When one of them is needed, reply with only the call as JSON, "
                    '{"tool_calls":[{"name":...,"arguments":{...}}]}; otherwise speak.'
                )
            parts.append("\n".join(lines))
        if schema is not None:
            parts.append("Reply with a JSON object" + _fields(schema) + ".")
        return "\n\n".join(parts)

    @staticmethod
    def fact_values(messages: list[Message]) -> list[str]:
        """The short values (numbers, names) the game's tools answered in the turn being
        generated, as they would be said."""
        values: list[str] = []

        def walk(v: Any) -> None:
            if isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)
            elif isinstance(v, (int, float, str)) and not isinstance(v, bool) and 0 < len(str(v)) <= 24:
                values.append(str(v))

        for m in messages[turn_start(messages) + 1 :]:
            if m.role == "tool" and not m.is_error:
                try:
                    walk(json.loads(m.content))
                except ValueError:
                    pass
        return list(dict.fromkeys(values))

    @staticmethod
    def said_values(messages: list[Message]) -> list[str | Entry]:
        """The values the NPC's line must say (``Sampling`` makes sure it does): the counts and
        amounts the game's tools answered in the turn being generated, as they would be said
        (``3``, ``2.5``), and the entries of a list they answered that the player asked about,
        with their prices (``mead for 3 copper``). See ``values_to_say`` and
        ``entries_to_say`` for which qualify."""
        start = turn_start(messages)
        outputs = []
        for m in messages[start + 1 :]:
            if m.role == "tool" and not m.is_error:
                try:
                    outputs.append(json.loads(m.content))
                except ValueError:
                    pass
        player = user_text(messages[start]) if start >= 0 else ""
        return [*values_to_say(outputs), *entries_to_say(outputs, player)]

    @staticmethod
    def chat_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
        """The transcript as alternating user and assistant messages (the shape every chat
        template accepts): the player's lines and the NPC's spoken lines.

        Tool rounds are not shown as the calls the model wrote: a small model imitates the
        JSON and the labels it sees in its history, and speaks them. What the game's tools
        answered in the turn being generated is told in words at the end of the system
        message ("Facts for your answer: ...", no tool names, no braces); of the rendering
        tried with bench/bench_quality.py on the bundled model it was the one the model used
        most and never repeated or answered out of character. An earlier turn's tool
        results are not shown: the NPC's line of that turn says what it made of them."""
        facts = []
        for m in messages[turn_start(messages) + 1 :]:
            if m.role == "tool":
                said = _words(m.content).rstrip(".") + "."
                facts.append(f"That did not work: {said}" if m.is_error else said)
        if facts:
            system = (system + "\n\n" if system else "") + "Facts for your answer: " + " ".join(facts)
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        for m in messages:
            if m.role == "user":  # "Name: line" when another NPC said it
                msgs.append({"role": "user", "content": user_text(m)})
            elif m.role == "assistant" and not m.tool_calls:
                msgs.append({"role": "assistant", "content": m.content})
        return msgs

    def render_prefix(
        self,
        instructions: str,
        messages: list[Message],
        tools: list[ToolSpec],
        tool_mode: str = "allowed",
        schema: dict[str, Any] | None = None,
        lead: str = "",
    ) -> str:
        """The start of the prompt of the step that follows ``messages`` (the history) with a
        new line, whatever that line will be (``npc/prewarm``): the step rendered with two
        different lines, up to where they part. Found this way, not by rendering the history
        alone, it holds for any chat template, and it leaves out what only the history's last
        turn shows (its tool results as facts), as the next step does. ``lead``: how the new
        line starts, when known (``Bram: ``): the start goes on to its end, but for trailing
        spaces (a tokenizer joins a space to the word after it)."""
        a = self.render(instructions, [*messages, Message("user", lead + "A")], tools, tool_mode, schema)
        b = self.render(instructions, [*messages, Message("user", lead + "B")], tools, tool_mode, schema)
        start = os.path.commonprefix([a, b])
        return start.rstrip(" ") if lead else start

    def render(
        self,
        instructions: str,
        messages: list[Message],
        tools: list[ToolSpec],
        tool_mode: str = "allowed",
        schema: dict[str, Any] | None = None,
    ) -> str:
        msgs = self.chat_messages(self.system_text(instructions, tools, tool_mode, schema), messages)
        if self._jinja is None:  # no template in the file: ChatML (the engine warns; see stop_markers)
            out = "".join(f"<|im_start|>{x['role']}\n{x['content']}<|im_end|>\n" for x in msgs)
            return out + "<|im_start|>assistant\n"
        try:
            return self._jinja.render(
                messages=msgs, add_generation_prompt=True, eos_token=self._eos, bos_token=self._bos
            )
        except Exception:  # noqa: BLE001 - a template that allows no system role may raise anything
            # chat_messages gives one leading system message at most: it opens the first user
            # message instead (Gemma's templates, say).
            if not msgs or msgs[0]["role"] != "system":
                raise
            system, rest = msgs[0]["content"], msgs[1:]
            if rest and rest[0]["role"] == "user":
                rest = [dict(rest[0], content=system + "\n\n" + rest[0]["content"]), *rest[1:]]
            else:
                rest = [{"role": "user", "content": system}, *rest]
            return self._jinja.render(
                messages=rest, add_generation_prompt=True, eos_token=self._eos, bos_token=self._bos
            )
