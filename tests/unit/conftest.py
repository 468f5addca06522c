"""Options of the unit tests.

`--update-golden` rewrites tests/unit/golden/ from the current `guardedcron render`
output instead of comparing with it; review the diff before committing. Pass it with
the test path, e.g. `.venv/bin/python -m pytest tests/unit/test_render.py --update-golden`.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="write tests/unit/golden/*.yaml from render output instead of comparing")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False))


@pytest.fixture
def closed_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig for a cluster nobody listens on: any request would exit 69, not 64."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path
