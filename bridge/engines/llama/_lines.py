"""Shaping a spoken line while it streams: clean endings and no loops.

Pure text logic (no model, no I/O), run on the generation thread token by token; tests in
``tests/unit/test_llama_lines.py``.

A small model's line goes wrong at its end: it runs into ``maxTokens`` mid-sentence, or it
starts saying the same thing again ("I'm sorry. I'm sorry. I'm sorry."). Both are caught
at sentence boundaries:

- The first sentence streams piece by piece as it is generated (the player's first words
  are never held back).
- Every later sentence is held until it ends, then released whole, unless it repeats a
  sentence already spoken (or nearly: 80 % of its words), or the line now loops (one 4-gram of words three times): then
  it is dropped and the line ends there.
- Past ``soft_tokens``, the line ends at the next sentence boundary.
- At the hard limit (``maxTokens``) a held, unfinished sentence is dropped, so the line
  still ends where a sentence ended (the step's finish reason stays ``"length"``).

With ``unlabel`` (the prompt holds lines of other speakers, rendered ``Name: line``), a line
that starts with a speaker's label (``Bram:``, ``Old Tom:``: a small model copies the
``Name: line`` form it reads for other NPCs' lines) loses the label, and the quote mark that
often follows it; the first words are held only while they could still be such a label
(capitalised words, at most three, no colon yet).

Output that starts with ``{`` is a tool-call batch (the grammar keeps free text from
starting with one): it passes through untouched.
"""

from __future__ import annotations

import re

# A sentence ends at . ! ? or … (closing quotes and brackets may follow) before white space;
# the white space belongs to the next sentence, so a line never ends with it.
_BOUNDARY = re.compile(r"[.!?…][\"'”’)\]]*(?=\s)")
_WORDS = re.compile(r"[\w']+")
_TRAILING_END = re.compile(r"[.!?…][\"'”’)\]]*$")  # held: the white space after it decides
_NAME_WORD = r"[A-Z][\w'’-]*"
_LABEL = re.compile(rf"{_NAME_WORD}(?: {_NAME_WORD}){{0,2}}:\s*[\"“]?")
_MAYBE_LABEL = re.compile(rf"(?:{_NAME_WORD}(?: {_NAME_WORD}){{0,2}} ?)?")
_LABEL_MAX = 48  # characters: a label is short


# Whole numbers a line may say as a word: "three" says 3 as well as "3" does.
NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
)


def value_pattern(value: str) -> re.Pattern[str]:
    """Where a line says ``value`` (a number as ``_prompt.values_to_say`` gives it): its
    digits as a whole number ("3", not the 3 of "30", "13", "3rd", "2.3" or "3:10"), a
    thousands separator allowed ("1,200"), or a small whole number's word ("three")."""
    forms = [re.escape(value)]
    if value.isdigit():
        n = int(value)
        if len(value) > 3:
            forms.append(re.escape(f"{n:,}"))
        if n < len(NUMBER_WORDS):
            forms.append(NUMBER_WORDS[n])
    return re.compile(rf"(?<![\w.,:/])(?:{'|'.join(forms)})(?![\w]|[.,:/]\d)", re.I)


def _norm(sentence: str) -> tuple[str, ...]:
    return tuple(_WORDS.findall(sentence.lower()))


def loops(words: tuple[str, ...] | list[str], n: int = 4, times: int = 3) -> bool:
    """True when one ``n``-gram of ``words`` occurs ``times`` times or more."""
    seen: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - n + 1):
        g = tuple(words[i : i + n])
        seen[g] = seen.get(g, 0) + 1
        if seen[g] >= times:
            return True
    return False


class SpokenLine:
    """Feed it each decoded piece with the number of tokens generated so far; it says what
    to show now and when to stop. See the module docstring for the rules."""

    def __init__(self, soft_tokens: int, unlabel: bool = False) -> None:
        self.soft_tokens = soft_tokens
        self.passthrough: bool | None = None  # undecided until the first visible character
        self.shown = ""  # text released so far
        self.held = ""  # text generated but not yet released
        self.first_done = False  # the first sentence has ended
        self.sentences: set[tuple[str, ...]] = set()
        self.stopped = False  # the line ended early (a repeat, a loop or the soft limit)
        self.labelled: bool | None = None if unlabel else False  # None: the start may be a label
        self.quoted: bool | None = False  # a quote mark after a label was dropped: so is the
        # closing one (None: a label just ended, the quote mark may come next)

    def _unlabel(self, text: str) -> str | None:
        """The text without a leading speaker label, or None while it may still be one."""
        m = _LABEL.match(text)
        if m is not None:
            self.labelled = True
            self.quoted = self.quoted or m.group().rstrip().endswith(('"', "“"))
            return text[m.end() :]
        if len(text) < _LABEL_MAX and _MAYBE_LABEL.fullmatch(text):
            return None
        self.labelled = False
        return text

    def feed(self, piece: str, tokens: int) -> str:
        """Text to show now. After it, ``stopped`` says whether generation should end."""
        if self.passthrough is None:
            lead = (self.held + piece).lstrip()
            if not lead:
                self.held += piece
                return ""
            self.passthrough = lead.startswith("{")
            piece, self.held = lead, ""
        if self.passthrough:
            return piece
        if self.labelled is None:
            text = self.held + piece
            if self.quoted is None:  # right after a label: its quote mark may follow
                text = text.lstrip()
                if not text:
                    self.held = ""
                    return ""
                self.quoted = text[0] in '"“'
                text = text[1:] if self.quoted else text
            rest = self._unlabel(text)
            if rest is None:  # may still be a label
                self.held = text
                return ""
            self.held = ""
            if self.labelled and not rest.strip():  # a label's end: the line has not started
                self.labelled = None
                if not self.quoted:
                    self.quoted = None
                return ""
            piece = rest.lstrip()
        self.held += piece
        line_break = self.held.find("\n")
        if line_break >= 0:  # a spoken line is one paragraph: what follows a break is not said
            self.held = self.held[:line_break]
        out = self._sentences(tokens)
        if line_break >= 0 and not self.stopped:
            out += self._last()
            self.stopped = True
        elif not self.first_done:  # the first sentence streams as it comes
            m = _TRAILING_END.search(self.held)
            cut = m.start() if m else len(self.held)
            out, self.held = out + self.held[:cut], self.held[cut:]
        self.shown += out
        return out

    def end(self, cut: bool) -> str:
        """The rest to show when generation ends: ``cut`` when it hit the hard limit (an
        unfinished sentence is then dropped); otherwise the model ended the line itself."""
        if self.passthrough:
            rest, self.held = self.held, ""
            return rest
        if self.stopped or (cut and self.first_done):
            self.held = ""
            return ""
        if self.labelled is None:  # the whole line looked like the start of a label: it was not
            self.labelled = False
        out = self._last()
        if self.quoted and out.endswith(('"', "”")):
            out = out[:-1]
        self.shown += out
        return out

    def _sentences(self, tokens: int) -> str:
        """Releases the held sentences that have ended, until one is dropped or the soft
        limit is reached."""
        out = ""
        while not self.stopped:
            m = _BOUNDARY.search(self.held)
            if m is None:
                break
            sentence, self.held = self.held[: m.end()], self.held[m.end() :]
            if not self._keep(sentence, out):
                break
            out += sentence
            self.first_done = True
            if tokens >= self.soft_tokens:
                self.held, self.stopped = "", True
        return out

    def _last(self) -> str:
        """The held text as the line's last sentence, if it may be said."""
        rest, self.held = self.held.rstrip(), ""
        return rest if rest and self._keep(rest, "") else ""

    def _repeats(self, words: tuple[str, ...]) -> bool:
        """Whether a sentence says an earlier one again: the same words, or (four words or
        more) at least 80 % of its words from one earlier sentence ("Greta, keeper of the
        Flagon. I'm Greta, keeper of the Flagon.")."""
        if words in self.sentences:
            return True
        mine = set(words)
        return len(words) >= 4 and any(len(mine & set(s)) >= 0.8 * len(mine) for s in self.sentences)

    def _keep(self, sentence: str, pending: str) -> bool:
        """Whether ``sentence`` may follow what was shown and ``pending``; a later sentence
        that repeats an earlier one or makes the line loop ends the line instead."""
        # before the first boundary, everything shown so far is the first sentence
        words = _norm(sentence if self.first_done else self.shown + pending + sentence)
        if self.first_done and (self._repeats(words) or loops(_norm(self.shown + pending + sentence))):
            self.held, self.stopped = "", True
            return False
        self.sentences.add(words)
        return True


# The shape of a ChatML-style marker (``<|im_end|>``, ``<|eot_id|>``, ``<|user|>``): never
# said, whichever chat template the model file has.
_MARKER_SHAPE = re.compile(r"<\|[\w.-]{1,32}\|>")
_MARKER_SHAPE_START = re.compile(r"<(?:\|[\w.-]{0,32}\|?)?")  # what may still become one
_MARKER_SHAPE_MAX = 36


class StopMarkers:
    """A step's text with the chat template's markers taken out (``<|im_end|>``,
    ``<end_of_turn>``: ``PromptRenderer.stop_markers``, and anything shaped like
    ``<|name|>``): a marker ends the step, and neither it nor anything after it is said.

    A model that writes a marker as plain text writes it in pieces (``<|``, ``im``, ``_end``,
    ``|>``), so text that may still become a marker is held until it cannot; what is held
    when the step ends was a marker's unfinished start, and is dropped. (A marker the model
    emits as one special token is either an end-of-generation token, which ends the step
    before this sees it, or a control token, which the step's bans keep out.)

    Pure text logic, run on the generation thread token by token before ``SpokenLine``."""

    def __init__(self, markers: tuple[str, ...] | list[str]) -> None:
        self.markers = tuple(m for m in markers if m)
        self.starts = frozenset(m[0] for m in self.markers) | {"<"}
        self.longest = max([_MARKER_SHAPE_MAX, *(len(m) for m in self.markers)])
        self.held = ""
        self.found: str | None = None  # the marker that ended the step

    def _first(self, text: str) -> tuple[int, str] | None:
        """Where the first whole marker in ``text`` starts, and the marker."""
        hits = [(i, m) for m in self.markers if (i := text.find(m)) >= 0]
        if (shaped := _MARKER_SHAPE.search(text)) is not None:
            hits.append((shaped.start(), shaped.group()))
        return min(hits) if hits else None

    def _may_start(self, tail: str) -> bool:
        """Whether ``tail`` (the end of the text) may still become a marker."""
        return any(m.startswith(tail) for m in self.markers) or _MARKER_SHAPE_START.fullmatch(tail) is not None

    def feed(self, piece: str) -> tuple[str, bool]:
        """(the text to pass on now, whether a marker ended the step: then the text is what
        came before it, and nothing more is fed)."""
        if self.found is not None:
            return "", True
        text = self.held + piece
        hit = self._first(text)
        if hit is not None:
            self.held, self.found = "", hit[1]
            return text[: hit[0]], True
        cut = len(text)
        for i in range(max(0, len(text) - self.longest), len(text)):
            if text[i] in self.starts and self._may_start(text[i:]):
                cut = i
                break
        self.held = text[cut:]
        return text[:cut], False

    def end(self) -> str:
        """At the end of the step: what is still held, the unfinished start of a marker, is
        dropped (always ``""``)."""
        self.held = ""
        return ""
