"""The bridge's log format (bridge/hosts/_log.py): a record is one line, its message's
control characters escaped; a traceback's lines are indented under it."""

from __future__ import annotations

import io
import logging

from bridge.hosts._log import FORMAT, EscapingFormatter, escape_controls


def _logged(emit: object) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(EscapingFormatter(FORMAT))
    log = logging.getLogger("oam_bridge.test_log_format")
    log.addHandler(handler)
    log.propagate = False
    try:
        emit(log)  # type: ignore[operator]
    finally:
        log.removeHandler(handler)
    return out.getvalue()


def test_control_characters_are_escaped_in_messages_and_their_arguments() -> None:
    assert escape_controls("a\nb\rc\td\x00e\x1bf\x7fg\x85h\u2028i\u2029j") == (
        "a\\nb\\rc\\td\\x00e\\x1bf\\x7fg\\x85h\\u2028i\\u2029j"
    )
    assert escape_controls("plain, ünïcødé and \\n as written") == "plain, ünïcødé and \\n as written"
    text = _logged(lambda log: log.warning("model %s\nis gone", "x.gguf\noam-bridge ERROR forged"))
    assert text == "oam-bridge WARNING oam_bridge.test_log_format: model x.gguf\\noam-bridge ERROR forged\\nis gone\n"


def test_a_traceback_is_indented_under_its_record() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("bad\noam-bridge ERROR forged")
        except ValueError:
            log.exception("turn %s failed", "t1")

    lines = _logged(emit).splitlines()
    assert lines[0] == "oam-bridge ERROR oam_bridge.test_log_format: turn t1 failed"
    assert all(line.startswith("    ") for line in lines[1:]) and len(lines) > 3
    assert not any(line.startswith("oam-bridge") for line in lines[1:])
