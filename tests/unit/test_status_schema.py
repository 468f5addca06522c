"""The computed status fits the CRD's status schema exactly.

The API server prunes fields a structural schema does not declare. A status field the
CRD lacks would be dropped on every write, the stored status would never equal the
computed one, and `status_changed` would ask for a write on every pass. So every
field compute_status writes must be declared, with the declared type and enum.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support import REPO
from tests.support.status_world import Runs, compute, slot, the_gcj

CRD = REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml"


def status_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    versions = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    assert versions, "the CRD has no v1alpha1 version"
    assert versions[0].get("subresources", {}).get("status") == {}, "status must be a subresource"
    schema: dict[str, Any] = versions[0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def undeclared(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """Paths in `value` that pruning would drop."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        found = []
        for key, item in value.items():
            if properties is not None and key in properties:
                found += undeclared(item, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += undeclared(item, extra, f"{path}.{key}")
            else:
                found.append(f"{path}.{key}")
        return found
    if isinstance(value, list):
        items = schema.get("items", {})
        return [p for i, item in enumerate(value) for p in undeclared(item, items, f"{path}[{i}]")]
    return []


def statuses(runs: Runs) -> list[dict[str, Any]]:
    gcj = the_gcj(created=slot(10) - timedelta(minutes=1))
    world = [runs.succeeded(slot(10), 1), runs.skipped(slot(11), 7), runs.guard_error(slot(12)),
             runs.failed(slot(13), 2), runs.timed_out(slot(14), 3), runs.lost(slot(15), 4, finished=True),
             runs.running(slot(16), 5), runs.running(slot(16) + timedelta(minutes=1), 6, manual=True)]
    busy = compute(world, None, slot(16) + timedelta(minutes=5), gcj=gcj)
    missed = compute([], busy, slot(20), gcj=gcj)
    invalid = compute([], None, slot(20), gcj=the_gcj(schedule="61 * * * *"), cronjob=None,
                      apply_error="refused")
    triggered = compute([], {**missed, "lastTriggerToken": "x" * 253}, slot(20), gcj=gcj)
    assert triggered["lastTriggerToken"] == "x" * 253  # kept from the previous status
    return [busy, missed, invalid, triggered]


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


def test_every_status_field_is_declared_and_valid(runs: Runs) -> None:
    schema = status_schema()
    for status in statuses(runs):
        assert undeclared(status, schema) == []
        jsonschema.validate(status, schema)


def test_outcomes_in_the_crd_are_the_ones_classified() -> None:
    from guardedcron.status import Outcome

    last_run = status_schema()["properties"]["lastRun"]["properties"]["outcome"]
    assert sorted(last_run["enum"]) == sorted(o.value for o in Outcome)


def test_catch_up_backfill_and_failures_are_declared(runs: Runs) -> None:
    """Issue 14's status fields, as compute_status writes them, survive pruning."""
    gcj = the_gcj(created=slot(10) - timedelta(minutes=1))
    previous = {
        "catchUp": {"settledThrough": "2026-12-01T10:00:00Z", "givenUp": ["2026-12-01T09:50:00Z"]},
        "backfill": {"token": "b1", "state": "Running", "since": "2026-12-01T08:00:00Z",
                     "until": "2026-12-01T09:00:00Z", "next": "2026-12-01T08:10:00Z",
                     "running": "nightly-invoices-29408890", "done": 1, "skipped": 0, "remaining": 5,
                     "message": "x"},
        "failures": {"suspended": True, "since": "2026-12-01T10:00:00Z", "generation": 3,
                     "failedRuns": ["a", "b"], "countFrom": "2026-12-01T09:00:00Z",
                     "lastResumeToken": "r1"},
    }
    # Without a decision of this pass (scheduling=None), compute_status keeps them.
    status = compute([], previous, slot(20), gcj=gcj)
    assert {key: status[key] for key in previous} == previous
    schema = status_schema()
    assert undeclared(status, schema) == []
    jsonschema.validate(status, schema)
