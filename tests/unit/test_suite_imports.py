"""The test suites stay independent: a module under tests/<suite>/ imports only its own
suite's modules and tests/support/, and nothing imports a conftest (pytest loads those
itself; importing one runs it twice under two names and hides where a fixture comes from).
Read from the source with `ast`, so a violation fails here before any suite runs."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support import REPO

TESTS = REPO / "tests"
SHARED = "support"


def imported_modules(source: str, where: Path) -> Iterator[tuple[int, str]]:
    """Every module the file at `where` (relative to the repository) imports, with its line;
    `from tests.x import y` names the module `tests.x.y` when y is a module, else `tests.x`."""
    package = list(where.parts[:-1])
    for node in ast.walk(ast.parse(source, str(where))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                is_module = any(
                    (REPO / Path(*candidate.split("."))).with_suffix(suffix).exists()
                    for suffix in (".py", "")
                )
                yield node.lineno, candidate if is_module else module


def problems(source: str, where: Path) -> list[str]:
    suite = where.relative_to("tests").parts
    own = suite[0] if len(suite) > 1 else None  # None: a file directly under tests/
    found = []
    for line, module in dict.fromkeys(imported_modules(source, where)):
        parts = module.split(".")
        if parts[0] != "tests" or len(parts) == 1:
            continue
        if parts[-1] == "conftest":
            found.append(f"{where}:{line} imports a conftest ({module})")
        elif parts[1] not in (SHARED, own):
            found.append(f"{where}:{line} imports another suite's {module}")
    return found


def test_no_test_module_imports_a_conftest_or_another_suites_module() -> None:
    found = [
        problem
        for path in sorted(TESTS.rglob("*.py"))
        for problem in problems(path.read_text(), path.relative_to(REPO))
    ]
    assert found == [], "\n".join(found)


def test_the_check_sees_each_kind_of_violation() -> None:
    source = (
        "from tests.operator.conftest import T0\n"
        "from tests.operator import conftest\n"
        "import tests.conftest\n"
        "from tests.unit import status_world\n"
        "from tests.unit.status_world import Runs\n"
        "from . import conftest as mine\n"
        "from tests.support import REPO\n"
        "from tests.support.clock import FakeClock\n"
        "from tests.operator.passes import one_pass\n"
    )
    found = problems(source, Path("tests/operator/test_probe.py"))
    assert [problem.split(":")[1].split(" ")[0] for problem in found] == ["1", "2", "3", "4", "5", "6"]
