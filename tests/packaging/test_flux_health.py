"""The Flux health expressions (docs/flux/kustomization.yaml), run by a CEL interpreter
over the Argo CD check's test objects: both tools must judge every object alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from tests.packaging.test_argocd_health import CASES, CHECK
from tests.support.chart import REPO

KUSTOMIZATION = REPO / "docs" / "flux" / "kustomization.yaml"
# Argo CD's verdict -> the kstatus verdict Flux should reach.
EXPECTED = {"Healthy": "current", "Suspended": "current", "Degraded": "failed",
            "Progressing": "inProgress"}


def expressions() -> dict[str, str]:
    spec = yaml.safe_load(KUSTOMIZATION.read_text())["spec"]
    (check,) = [c for c in spec["healthCheckExprs"] if c["kind"] == "GuardedCronJob"]
    assert check["apiVersion"] == "guardedcron.io/v1alpha1"
    return {key: check[key] for key in ("current", "failed", "inProgress")}


def verdicts(obj: dict[str, Any]) -> set[str]:
    """Every expression that holds; an evaluation error counts as not holding."""
    environment = celpy.Environment()
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    held = set()
    for name, text in expressions().items():
        result = environment.program(environment.compile(text)).evaluate(activation)
        if result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            held.add(name)
    return held


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_flux_agrees_with_argocd(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECK / case["inputPath"]).read_text())
    assert verdicts(obj) == {EXPECTED[case["healthStatus"]["status"]]}


def test_expressions_compile() -> None:
    environment = celpy.Environment()
    for text in expressions().values():
        environment.compile(text)
