"""The operator's settings have one home: every variable the chart gives the operator is
named in guardedcron/spec/settings.py, read by `read_settings`, and spelled nowhere
else in the package's code."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import guardedcron
from guardedcron.spec import settings as settings_module
from guardedcron.spec.locks import SharedLock
from guardedcron.spec.settings import ENV_SHARED_LOCKS, SettingsError, read_settings
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


# --- the allow-list of shared locks (issue 11) -------------------------------------------
def test_without_an_allow_list_no_lock_is_shared() -> None:
    assert read_settings({}).shared_locks == ()
    assert read_settings({ENV_SHARED_LOCKS: "  "}).shared_locks == ()


def test_the_allow_list_is_read_from_json() -> None:
    text = json.dumps([{"name": "ledger-close", "namespaces": ["finance", "billing"]},
                       {"name": "month-end.v2", "namespaces": ["finance"]}])
    assert read_settings({ENV_SHARED_LOCKS: text}).shared_locks == (
        SharedLock("ledger-close", frozenset({"finance", "billing"})),
        SharedLock("month-end.v2", frozenset({"finance"})))


@pytest.mark.parametrize(("value", "path", "words"), [
    pytest.param("ledger-close=finance", ENV_SHARED_LOCKS, "is not JSON", id="not-json"),
    pytest.param({"name": "x", "namespaces": ["a"]}, ENV_SHARED_LOCKS, "must be a JSON list",
                 id="not-a-list"),
    pytest.param([{"name": "x"}], f"{ENV_SHARED_LOCKS}[0]", 'exactly "name" and "namespaces"',
                 id="no-namespaces"),
    pytest.param([{"name": "x", "namespaces": ["a"], "prefix": "y"}], f"{ENV_SHARED_LOCKS}[0]",
                 'exactly "name" and "namespaces"', id="unknown-key"),
    pytest.param([{"name": "Ledger", "namespaces": ["a"]}], f"{ENV_SHARED_LOCKS}[0].name",
                 "is not a shared lock name", id="upper-case-name"),
    pytest.param([{"name": "fin/close", "namespaces": ["a"]}], f"{ENV_SHARED_LOCKS}[0].name",
                 "is not a shared lock name", id="slash-in-name"),
    pytest.param([{"name": "x\n", "namespaces": ["a"]}], f"{ENV_SHARED_LOCKS}[0].name",
                 "is not a shared lock name", id="newline-after-name"),
    pytest.param([{"name": "x", "namespaces": []}], f"{ENV_SHARED_LOCKS}[0].namespaces",
                 "non-empty list", id="no-namespace"),
    pytest.param([{"name": "x", "namespaces": ["Finance"]}], f"{ENV_SHARED_LOCKS}[0].namespaces",
                 "'Finance' is not a namespace name", id="bad-namespace"),
    pytest.param([{"name": "x", "namespaces": ["a"]}, {"name": "x", "namespaces": ["b"]}],
                 f"{ENV_SHARED_LOCKS}[1].name", "is listed twice", id="listed-twice"),
])
def test_a_bad_allow_list_is_refused_naming_the_entry(value: object, path: str, words: str) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    with pytest.raises(SettingsError) as caught:
        read_settings({ENV_SHARED_LOCKS: text})
    [problem] = caught.value.problems
    assert problem.field_path == path and words in problem.message, problem


def test_namespace_names_are_dns_labels_only() -> None:
    # Namespaces such as "0" are valid; non-ASCII letters are not (isalnum() said yes).
    assert read_settings({"GUARDEDCRON_NAMESPACES": "0,a-1"}).namespaces == ("0", "a-1")
    with pytest.raises(SettingsError):
        read_settings({"GUARDEDCRON_NAMESPACES": "café"})


# --- the schedule-aware alerts' slot count (issue 36) -------------------------------------
@pytest.mark.parametrize(("text", "slots"), [("", 2), ("1", 1), (" 5 ", 5), ("1000", 1000)])
def test_the_no_success_slot_count_is_read(text: str, slots: int) -> None:
    assert read_settings({"GUARDEDCRON_NO_SUCCESS_SLOTS": text}).no_success_slots == slots


@pytest.mark.parametrize("text", ["0", "1001", "-1", "2.5", "two"])
def test_a_bad_no_success_slot_count_is_refused(text: str) -> None:
    with pytest.raises(SettingsError) as caught:
        read_settings({"GUARDEDCRON_NO_SUCCESS_SLOTS": text})
    assert [p.field_path for p in caught.value.problems] == ["GUARDEDCRON_NO_SUCCESS_SLOTS"]
