"""The suite's order (tests/support/suite_order.py, hooked in by tests/conftest.py): checks
that time the guard run first, before any session-wide server or control plane has started,
then the e2e suite, since its control planes run until the session ends, and the node tier
last (one real node per machine at a time). Checked on a
small suite collected by a real pytest."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO

FILES = {
    # the same two hooks as tests/conftest.py
    "conftest.py": (
        "import pytest\n"
        "from tests.support.suite_order import QUIET_MACHINE_MARKER, quiet_checks_first_e2e_last\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', QUIET_MACHINE_MARKER)\n"
        "@pytest.hookimpl(trylast=True)\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    quiet_checks_first_e2e_last(items)\n"
    ),
    "pytest.ini": (
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    e2e: a control plane\n    node: a node\n"
    ),
    # named so that the collection order is the opposite of the order wanted
    "test_0_node.py": "import pytest\npytestmark = pytest.mark.node\ndef test_pod(): pass\n",
    "test_a_e2e.py": "import pytest\npytestmark = pytest.mark.e2e\ndef test_cluster(): pass\n",
    "test_b_plain.py": "def test_one(): pass\ndef test_two(): pass\n",
    "test_c_timed.py": (
        "import pytest\ndef test_before(): pass\n@pytest.mark.quiet_machine\ndef test_burst(): pass\n"
    ),
}


def test_timed_checks_run_first_then_the_e2e_suite_and_the_node_tier_last(tmp_path: Path) -> None:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected == [
        "test_c_timed.py::test_burst",
        "test_b_plain.py::test_one",
        "test_b_plain.py::test_two",
        "test_c_timed.py::test_before",
        "test_a_e2e.py::test_cluster",
        "test_0_node.py::test_pod",
    ], proc.stdout + proc.stderr


def test_the_seeds_burst_check_is_a_quiet_machine_check() -> None:
    # Read from the guard suite's source (suites never import each other's modules).
    path = REPO / "tests" / "guard" / "test_cli.py"
    check = next(
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and node.name == "test_twenty_processes_one_winner_everyone_answered_within_five_seconds"
    )
    assert "pytest.mark.quiet_machine" in [ast.unparse(mark) for mark in check.decorator_list]
