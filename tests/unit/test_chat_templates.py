"""Chat templates: the model file's own template where it has one, ChatML (said, and in the
engine's info) where it has none, and the template's turn markers never said: they end the
step, whole or written in pieces (``_lines.StopMarkers``). No model: the real-model side is
tests/model/test_chat_template_fallback.py."""

from __future__ import annotations

import logging

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.engines._text._prompt import (
    CHATML_MARKERS,
    TEMPLATE_FALLBACK,
    TEMPLATE_GGUF,
    PromptRenderer,
)
from bridge.engines.base import EngineInfo, Message
from bridge.engines.llama._lines import SpokenLine, StopMarkers

# Gemma's template as its GGUF files carry it (shortened: no system role, so it raises on one).
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)

HISTORY = [Message("user", "Hello!"), Message("assistant", "Evening."), Message("user", "Any ale?")]


# -- which template ------------------------------------------------------------------


def test_a_file_without_a_template_gets_chatml_said_as_the_fallback() -> None:
    r = PromptRenderer(None, "</s>", "<s>")
    assert r.source == TEMPLATE_FALLBACK == "chatml-fallback"
    assert r.stop_markers == CHATML_MARKERS
    prompt = r.render("You are a guard.", HISTORY, [])
    assert prompt.startswith("<|im_start|>system\nYou are a guard.<|im_end|>\n")
    assert prompt.endswith("<|im_start|>user\nAny ale?<|im_end|>\n<|im_start|>assistant\n")


def test_a_file_with_a_template_renders_with_it_and_stops_on_its_markers() -> None:
    r = PromptRenderer(GEMMA, "<eos>", "<bos>")
    assert r.source == TEMPLATE_GGUF == "gguf"
    prompt = r.render("You are a guard.", HISTORY, [])
    # no system role in Gemma's template: the instructions open the first user message
    assert prompt.startswith("<bos><start_of_turn>user\nYou are a guard.\n\nHello!<end_of_turn>\n")
    assert prompt.endswith("<start_of_turn>user\nAny ale?<end_of_turn>\n<start_of_turn>model\n")
    assert "<|im_" not in prompt
    assert r.stop_markers == ("<end_of_turn>", "<start_of_turn>", "<eos>")  # and the EOS token, as text


@pytest.mark.parametrize(
    ("template", "eos", "markers"),
    [
        (LLAMA3, "<|eot_id|>", ("<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>")),
        (CHATML, "<|im_end|>", ("<|im_end|>", "<|im_start|>")),  # SmolLM2's own, in its GGUF file
        (MISTRAL, "</s>", ("</s>", "[INST]", "[/INST]")),
    ],
)
def test_each_templates_turn_markers_are_found(template: str, eos: str, markers: tuple[str, ...]) -> None:
    assert PromptRenderer(template, eos, "").stop_markers == markers


def test_a_template_that_cannot_render_the_probe_has_no_markers_but_still_renders() -> None:
    odd = (
        "{% if messages|length > 2 %}{{ raise_exception('short chats only') }}{% endif %}{{ messages[-1]['content'] }}"
    )
    r = PromptRenderer(odd, "", "")
    assert r.source == TEMPLATE_GGUF and r.stop_markers == ()
    assert r.render("", [Message("user", "Hi")], []) == "Hi"


def test_engine_info_carries_the_template_on_the_wire() -> None:
    info = EngineInfo(name="llama", available=True, chat_template=TEMPLATE_FALLBACK)
    wire = msgspec.json.decode(msgspec.json.encode(info))
    assert wire["chatTemplate"] == "chatml-fallback"
    assert msgspec.json.decode(msgspec.json.encode(EngineInfo(name="scripted", available=True)))["chatTemplate"] is None


def test_the_missing_template_is_said_once_per_file(caplog: pytest.LogCaptureFixture) -> None:
    from bridge.engines.llama import _engine

    _engine._warned.discard("models/gemma.gguf")
    with caplog.at_level(logging.WARNING, logger="oam_bridge.llama"):
        for _ in range(3):
            _engine._warn_no_template("models/gemma.gguf")
    said = [r for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(said) == 1 and "models/gemma.gguf" in said[0].getMessage()
    assert "chatml-fallback" in said[0].getMessage()


# -- the markers never said ----------------------------------------------------------


def run(markers: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    """What StopMarkers passes on for each piece (until a marker), and whether one ended it."""
    m = StopMarkers(markers)
    out = []
    for p in pieces:
        text, found = m.feed(p)
        out.append(text)
        if found:
            return out, True
    out.append(m.end())
    return out, False


def test_a_marker_as_one_piece_ends_the_step_with_the_text_before_it() -> None:
    out, found = run(CHATML_MARKERS, ["Aye", ", three", " left.<|im_end|>", "\nmore"])
    assert found and "".join(out) == "Aye, three left."


def test_a_marker_written_in_pieces_never_reaches_the_text() -> None:
    pieces = ["Aye", " three left.", " <", "|", "im", "_", "end", "|", ">", "\n<|im_start|>user"]
    out, found = run(CHATML_MARKERS, pieces)
    assert found and "".join(out) == "Aye three left. "
    assert out[:2] == ["Aye", " three left."]  # text streams as it comes until a marker may start
    assert not any(c in "".join(out) for c in "<|>")


def test_a_gemma_marker_in_pieces_ends_the_step() -> None:
    out, found = run(("<end_of_turn>", "<start_of_turn>"), ["Evening", ".", "<", "end", "_of", "_turn", ">", "x"])
    assert found and "".join(out) == "Evening."


def test_any_chatml_shaped_marker_ends_the_step_with_any_template() -> None:
    out, found = run(("<end_of_turn>",), ["Hi", " there", "<|", "eot", "_id", "|>", "!"])
    assert found and "".join(out) == "Hi there"


def test_text_that_only_looks_like_a_marker_start_is_released() -> None:
    out, found = run(CHATML_MARKERS, ["Two", " <", " three", ", and <|im", " not"])
    assert not found and "".join(out) == "Two < three, and <|im not"
    assert out[1] == " " and out[2] == "< three"  # "<" held until it could not be a marker


def test_a_marker_start_left_when_the_step_ends_is_dropped() -> None:
    out, found = run(CHATML_MARKERS, ["Done.", "<|im_"])
    assert not found and "".join(out) == "Done."


@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=40), st.sampled_from(CHATML_MARKERS))
def test_however_a_line_and_its_marker_are_split_the_marker_is_never_said(cuts: list[int], marker: str) -> None:
    line = "Aye, three barrels left. A copper a mug."
    text = line + marker + "\n<|im_start|>user\nmore"
    pieces, i = [], 0
    for n in cuts * (len(text) // sum(cuts) + 1):
        if i >= len(text):
            break
        pieces.append(text[i : i + n])
        i += n
    out, found = run(CHATML_MARKERS, pieces)
    assert found and "".join(out) == line
    # and through SpokenLine, as a spoken step streams it
    spoken = SpokenLine(soft_tokens=40)
    said = "".join(spoken.feed(t, k) for k, t in enumerate(out)) + spoken.end(cut=False)
    assert said == line
