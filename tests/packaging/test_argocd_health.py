"""The Argo CD health check, run by a real Lua 5.1 (Argo CD's gopher-lua speaks 5.1)
over the cases in its health_test.yaml, as Argo CD's own test harness does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51

from tests.support.chart import REPO

CHECK = REPO / "docs" / "argocd" / "resource_customizations" / "guardedcron.io" / "GuardedCronJob"
CASES = yaml.safe_load((CHECK / "health_test.yaml").read_text())["tests"]


def to_lua(runtime: Any, value: Any) -> Any:
    """JSON-shaped Python to Lua: objects and arrays become tables (arrays from 1)."""
    if isinstance(value, dict):
        return runtime.table_from({key: to_lua(runtime, item) for key, item in value.items()})
    if isinstance(value, list):
        return runtime.table_from([to_lua(runtime, item) for item in value])
    return value


def health(obj: dict[str, Any]) -> dict[str, Any]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = to_lua(runtime, obj)
    result = runtime.execute((CHECK / "health.lua").read_text())
    return dict(result.items())


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_health_check_case(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECK / case["inputPath"]).read_text())
    assert health(obj) == case["healthStatus"]


def test_every_test_object_is_used_and_every_status_covered() -> None:
    used = {Path(case["inputPath"]).name for case in CASES}
    assert used == {path.name for path in (CHECK / "testdata").glob("*.yaml")}
    statuses = {case["healthStatus"]["status"] for case in CASES}
    assert statuses == {"Healthy", "Progressing", "Degraded", "Suspended"}


def test_healthy_needs_the_current_generation() -> None:
    """Flip one field of the healthy case: the verdict must change with it."""
    obj = yaml.safe_load((CHECK / "testdata" / "healthy.yaml").read_text())
    assert health(obj)["status"] == "Healthy"
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    assert health(obj)["status"] == "Progressing"


def test_test_objects_are_guardedcronjobs() -> None:
    for path in (CHECK / "testdata").glob("*.yaml"):
        obj = yaml.safe_load(path.read_text())
        assert (obj["apiVersion"], obj["kind"]) == ("guardedcron.io/v1alpha1", "GuardedCronJob")
