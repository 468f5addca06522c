"""The operator's settings have one home: every variable the chart gives the operator is
named in guardedcron/spec/settings.py, read by `read_settings`, and spelled nowhere
else in the package's code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import guardedcron
from guardedcron.spec import settings as settings_module
from guardedcron.spec.settings import SettingsError, read_settings
from tests.support import REPO

PACKAGE = Path(guardedcron.__file__).parent
DEPLOYMENT = REPO / "charts" / "guardedcron" / "templates" / "deployment.yaml"
CHART_VARIABLES = sorted(set(re.findall(r"- name: (GUARDEDCRON_[A-Z_]+)", DEPLOYMENT.read_text())))
# Malformed for every variable that is checked (all but the free-text peering name).
BAD = "@ not valid @"


def code_strings(path: Path) -> list[str]:
    """The string constants of a module, f-string parts included, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_chart_sets_the_operators_variables() -> None:
    assert len(CHART_VARIABLES) >= 15, CHART_VARIABLES  # the template's shape changed: fix the pattern


def test_every_chart_variable_is_named_in_the_settings_module_only() -> None:
    names = {value for key, value in vars(settings_module).items() if key.startswith("ENV_")}
    assert [v for v in CHART_VARIABLES if v not in names] == []
    spelled = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == Path(settings_module.__file__) or "devenv" in path.parts:
            continue
        found = [v for text in code_strings(path) for v in CHART_VARIABLES if re.search(rf"\b{v}\b", text)]
        if found:
            spelled[str(path.relative_to(PACKAGE))] = found
    assert spelled == {}


@pytest.mark.parametrize("variable", [v for v in CHART_VARIABLES if v != "GUARDEDCRON_PEERING"])
def test_read_settings_reads_every_chart_variable(variable: str) -> None:
    env = {variable: BAD}
    if variable == "GUARDEDCRON_POD_IP":
        env["GUARDEDCRON_PRIORITY"] = "pod-ip"  # the pod's address counts only then
    with pytest.raises(SettingsError) as caught:
        read_settings(env)
    assert [p.field_path for p in caught.value.problems] == [variable]


def test_the_peering_name_is_read_too() -> None:
    assert read_settings({"GUARDEDCRON_PEERING": "guardedcron"}).peering == "guardedcron"
