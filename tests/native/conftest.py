"""The native tests: each needs libOamNative (marker ``native``: skipped where it does not
load, failed under CI=true; ``make native`` builds it)."""

from __future__ import annotations

import pytest

from tests.support.needs import mark_folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, __file__, pytest.mark.native)
