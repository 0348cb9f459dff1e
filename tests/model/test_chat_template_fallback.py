"""A model file without a chat template: a GGUF copy of the bundled model with its
``tokenizer.chat_template`` key taken out (the file rewritten, tensors untouched). The bridge
says so once on stderr, naming the file, and in ``engine/status`` (``chatTemplate``), renders
ChatML, and no line it speaks holds a ChatML marker. And on the bundled file: its own
template, and a marker the model writes out as text pieces ends the step unsaid."""

from __future__ import annotations

import json
import mmap
import shutil
import struct
import threading
from pathlib import Path

import pytest
import trio

from bridge.engines._text._prompt import TEMPLATE_FALLBACK, TEMPLATE_GGUF
from bridge.engines.base import GenerationOptions
from bridge.engines.llama import LlamaEngine, default_model_path
from tests.support.harness import bridge

TEMPLATE_KEY = "tokenizer.chat_template"
MARKER_BITS = ("<|", "|>", "im_end", "im_start", "endoftext")

# GGUF value types (ggml's gguf.h): the fixed sizes, and the two that are not fixed
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def without_key(src: str, dst: Path, key: str) -> None:
    """Writes ``src``, a GGUF file, to ``dst`` without the metadata ``key``: the header's
    key count and the key-value section change; the tensor infos (whose offsets count from
    the data section) and the data section, aligned as before, are copied as they are."""
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", m, 0)
        assert magic == b"GGUF" and version >= 2, (magic, version)
        pos = 24

        def string(at: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", m, at)
            return m[at + 8 : at + 8 + n].decode("utf-8"), at + 8 + n

        def skip_value(kind: int, at: int) -> int:
            if kind == _STRING:
                return string(at)[1]
            if kind == _ARRAY:
                item, count = struct.unpack_from("<IQ", m, at)
                at += 12
                if item in _FIXED:
                    return at + _FIXED[item] * count
                for _ in range(count):
                    at = skip_value(item, at)
                return at
            return at + _FIXED[kind]

        kept: list[bytes] = []
        alignment = 32
        for _ in range(n_kv):
            start = pos
            name, pos = string(pos)
            (kind,) = struct.unpack_from("<I", m, pos)
            value_at = pos + 4
            pos = skip_value(kind, value_at)
            if name == "general.alignment":
                (alignment,) = struct.unpack_from("<I", m, value_at)
            if name != key:
                kept.append(m[start:pos])
        assert len(kept) == n_kv - 1, f"{src} has no {key}"
        infos_at = pos
        for _ in range(n_tensors):
            pos = string(pos)[1]
            (dims,) = struct.unpack_from("<I", m, pos)
            pos += 4 + 8 * dims + 4 + 8  # the dims, the type, the offset
        infos = m[infos_at:pos]
        data_at = -(-pos // alignment) * alignment
        with open(dst, "wb") as out:
            out.write(struct.pack("<4sIQQ", magic, version, n_tensors, n_kv - 1))
            for kv in kept:
                out.write(kv)
            out.write(infos)
            out.write(b"\0" * (-out.tell() % alignment))
            f.seek(data_at)
            shutil.copyfileobj(f, out, 1 << 22)


@pytest.fixture(scope="module")
def bare_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bundled model, rewritten without its chat template."""
    path = tmp_path_factory.mktemp("gguf") / "smollm2-no-template.gguf"
    without_key(default_model_path(), path, TEMPLATE_KEY)
    return str(path)


def test_the_copy_has_no_template_and_the_same_tensors(bare_model: str) -> None:
    engine = LlamaEngine(bare_model, n_parallel=1)
    try:
        assert TEMPLATE_KEY not in engine._llm.metadata
        assert engine.info().chat_template == TEMPLATE_FALLBACK
        assert engine._renderer.stop_markers == ("<|im_end|>", "<|im_start|>", "<|endoftext|>")
        same = engine._llm.tokenize(b"Aye, three left.", add_bos=False)
    finally:
        trio.run(engine.aclose)
    bundled = LlamaEngine(n_parallel=1)
    try:
        assert bundled.info().chat_template == TEMPLATE_GGUF
        assert bundled._renderer.stop_markers == ("<|im_end|>", "<|im_start|>")  # its own template's
        assert bundled._llm.tokenize(b"Aye, three left.", add_bos=False) == same
    finally:
        trio.run(bundled.aclose)


PROMPTS = [
    "Good evening! What's your name?",
    "Do you have any ale left?",
    "What's the news from the north road?",
    "Can I rent a room for the night?",
    "Tell me about the stranger in the corner.",
    "Goodnight, then.",
]


async def test_without_a_template_the_bridge_says_so_and_never_speaks_a_marker(bare_model: str) -> None:
    async with bridge("--engine", "llama", "--model", bare_model, guard=None) as c:
        await c.initialize()
        for npc, temperature in (("greta", 0.0), ("bram", 0.9)):
            await c.call(
                "npc/create",
                {
                    "npcId": npc,
                    "persona": {"name": npc.title(), "role": "a villager at the Rusty Flagon tavern"},
                    "options": {"temperature": temperature, "maxTokens": 48, "seed": 3},
                },
            )
        status = await c.call("engine/status")
        (llama,) = [e for e in status["engines"] if e["name"] == "llama"]
        assert llama["chatTemplate"] == "chatml-fallback", llama
        lines: list[str] = []
        with trio.fail_after(240):
            for npc in ("greta", "bram"):
                for prompt in PROMPTS:
                    r = await c.call("npc/respond", {"npcId": npc, "prompt": prompt})
                    done = await c.wait_terminal(r["turnId"])
                    assert done["method"] == "turn/completed", done
                    deltas = [
                        e["params"]["delta"] for e in c.turn_events(r["turnId"]) if e["method"] == "turn/textDelta"
                    ]
                    lines += [done["params"]["text"], *deltas]
        await c.finish()
    said = [line for line in lines if any(bit in line for bit in MARKER_BITS)]
    assert not said, said
    assert any(line.strip() for line in lines)
    log = bytes(c.stderr).decode("utf-8", "replace")
    warnings = [line for line in log.splitlines() if "no chat template" in line]
    assert len(warnings) == 1 and bare_model in warnings[0] and "WARNING" in warnings[0], log[-3000:]


@pytest.mark.parametrize("spoken", [False, True])
def test_a_marker_the_model_writes_in_text_pieces_ends_the_step_unsaid(spoken: bool) -> None:
    # A grammar makes the real model spell ChatML's end marker out of plain text pieces (the
    # special token <|im_end|> ends generation, so the grammar never takes it), as a model
    # that does not know ChatML writes it: the step ends where it starts, and the text
    # before it is all that is said.
    engine = LlamaEngine(n_parallel=1)
    try:
        gen = engine._gen
        grammar = 'root ::= "Aye, three left." "<|im_end|>" "\\n<|im_start|>user\\nMore ale!"'
        pieces = [
            gen.llm._model.token_to_piece(t) for t in gen.llm.tokenize(b"<|im_end|>", add_bos=False, special=False)
        ]
        assert len(pieces) > 1, pieces  # written as text, it takes several tokens
        items: list[tuple[object, ...]] = []
        tokens = engine._tokens(engine._renderer.render("You are Greta, a tavern keeper.", [], []))
        result = gen.generate(
            "greta",
            tokens,
            grammar,
            GenerationOptions(max_tokens=40, temperature=0),
            spoken,
            None,
            threading.Event(),
            items.append,
        )
        assert result is not None
        usage, finish = result
        text = "".join(str(i[1]) for i in items if i[0] == "text")
        assert text == "Aye, three left.", json.dumps(text)
        assert finish == "stop" and usage.output_tokens < 40
    finally:
        trio.run(engine.aclose)
