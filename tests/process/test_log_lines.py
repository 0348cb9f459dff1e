"""What the bridge logs on stderr is one line per record, whatever a message carries: a model
path (or any text the bridge did not write) with a newline cannot start a line that reads as
another record; through the real ``oam-bridge`` subprocess.

Failed on commit a76effb, before the fix: ``--model`` with a newline in it wrote a second,
forged ``oam-bridge ERROR ...`` line at the default level. ``OAM_BRIDGE_ROOT=<a checkout of
it>`` runs this file's bridge from that tree (tests/support/harness.py).
"""

from __future__ import annotations

from tests.support.harness import initialized_bridge

FORGED = "oam-bridge ERROR oam_bridge.server: the game is over"


async def test_a_model_path_with_a_newline_is_logged_on_one_line() -> None:
    model = f"/nowhere/model.gguf\n{FORGED}\r\x1b[2J\u2028.gguf"
    async with initialized_bridge("--model", model) as b:
        engines = {e["name"]: e for e in b.init_result["engines"]} if b.init_result else {}
        assert not engines["llama"]["available"]
    lines = bytes(b.stderr).decode().splitlines()
    assert lines, "the unavailable model is said at the default level"
    assert not [line for line in lines if line.startswith(FORGED)], f"a forged line: {lines}"
    (said,) = [line for line in lines if "/nowhere/model.gguf" in line]
    assert said.startswith("oam-bridge WARNING ")
    assert "/nowhere/model.gguf\\noam-bridge ERROR" in said and "\\r\\x1b[2J\\u2028.gguf" in said
