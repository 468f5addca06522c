"""Options of the unit tests.

`--update-golden` rewrites tests/unit/golden/ from the current `guardedcron render`
output instead of comparing with it; review the diff before committing. Pass it with
the test path, e.g. `.venv/bin/python -m pytest tests/unit/test_render.py --update-golden`.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="write tests/unit/golden/*.yaml from render output instead of comparing")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False))

