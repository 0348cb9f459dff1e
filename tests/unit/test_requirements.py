"""The rule behind the ``model`` and ``native`` markers (tests/support/needs.py): a marked test
whose model or library this machine lacks is skipped with the reason, and under CI=true fails
instead, so CI never goes green by skipping. (The contract's native target is always
collected and carries the marker: it cannot vanish from a run unseen.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support import needs


def test_a_marked_test_missing_its_requirement_skips_here_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(needs.PROBLEMS, "native", lambda: "libOamNative does not load: not built")
    monkeypatch.setitem(needs.PROBLEMS, "model", lambda: None)
    native_test = SimpleNamespace(get_closest_marker=lambda name: name == "native" or None)
    model_test = SimpleNamespace(get_closest_marker=lambda name: name == "model" or None)

    monkeypatch.setattr(needs, "CI", False)
    with pytest.raises(pytest.skip.Exception, match="libOamNative does not load: not built"):
        needs.check(native_test)  # type: ignore[arg-type]
    needs.check(model_test)  # type: ignore[arg-type]  # the model is there: nothing happens

    monkeypatch.setattr(needs, "CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true, and libOamNative does not load"):
        needs.check(native_test)  # type: ignore[arg-type]
