"""Event bodies: valid core/v1 Events on the GuardedCronJob, named per transition."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes_validate
import pytest

from guardedcron.observability import build_event, event_name
from guardedcron.status import EventReason, RunEvent
from tests.support import status_objects as k
from tests.support.status_world import Runs, compute_change, slot, the_gcj

NOW = datetime(2025, 5, 10, 0, 45, 12, 345000, tzinfo=UTC)
GCJ = the_gcj(created=slot(10) - timedelta(minutes=1))
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[RunEvent]:
    runs = Runs(tmp_path, monkeypatch)
    return list(compute_change([runs.succeeded(slot(10), 3), runs.guard_error(slot(11))], None,
                               slot(11) + timedelta(minutes=5), gcj=GCJ).events)


def test_an_event_on_the_guardedcronjob(events: list[RunEvent]) -> None:
    succeeded = events[0]
    body = build_event(GCJ, succeeded, NOW, reporting_instance="guardedcron-7d9f-x2")
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(k.CRONJOB, k.GCJ_UID, succeeded),
            "namespace": "billing",
            "labels": {"guardedcron.io/name": k.CRONJOB, "app.kubernetes.io/managed-by": "guardedcron"},
        },
        "involvedObject": {"apiVersion": "guardedcron.io/v1alpha1", "kind": "GuardedCronJob",
                           "name": k.CRONJOB, "namespace": "billing", "uid": k.GCJ_UID},
        "reason": "RunSucceeded",
        "message": succeeded.message,
        "type": "Normal",
        "source": {"component": "guardedcron-operator"},
        "reportingComponent": "guardedcron-operator",
        "reportingInstance": "guardedcron-7d9f-x2",
        "firstTimestamp": "2025-05-10T00:45:12Z",
        "lastTimestamp": "2025-05-10T00:45:12Z",
        "count": 1,
    }
    assert succeeded.message == (f"run {k.CRONJOB}-{k.minute_of(slot(10))} for slot {k.minute_of(slot(10))} "
                                 f"succeeded (holder billing/{k.CRONJOB}-{k.minute_of(slot(10))}-q7xkz, "
                                 "fence 3): workload completed")


@pytest.mark.parametrize("version", ["1.32.0", "1.35.0"])
def test_event_bodies_match_the_kubernetes_schema(events: list[RunEvent], version: str) -> None:
    for event in events:
        kubernetes_validate.validate(build_event(GCJ, event, NOW), version, strict=True)


def test_warnings_and_names(events: list[RunEvent]) -> None:
    bodies = [build_event(GCJ, event, NOW) for event in events]
    assert [(b["reason"], b["type"]) for b in bodies] == [
        ("RunSucceeded", "Normal"), ("GuardError", "Warning")]
    names = [b["metadata"]["name"] for b in bodies]
    assert len(set(names)) == 2
    for name in names:
        assert DNS_SUBDOMAIN.match(name) and len(name) <= 253 and name.startswith(f"{k.CRONJOB}.")
    # The same transition posted again (a retried pass) has the same name...
    assert [build_event(GCJ, e, NOW + timedelta(minutes=1))["metadata"]["name"] for e in events] == names
    # ...and the same transition of another object with the same name (recreated) another.
    other = the_gcj()
    other["metadata"]["uid"] = "a-new-uid"
    assert build_event(other, events[0], NOW)["metadata"]["name"] != names[0]


def test_long_messages_are_cut() -> None:
    event = RunEvent(EventReason.OVERLAP, "x" * 5000, subject="s")
    message = build_event(GCJ, event, NOW)["message"]
    assert len(message) == 1024 and message.endswith("…")


def test_an_object_without_identity_is_refused() -> None:
    event = RunEvent(EventReason.MISSED_RUN, "m", subject="s")
    with pytest.raises(ValueError, match=r"metadata\.name and metadata\.namespace"):
        build_event({"metadata": {"name": "x"}}, event, NOW)


def test_design_lists_every_reason_with_its_type() -> None:
    """docs/design.md's Events table names each reason under the type it is posted as."""
    design = (Path(__file__).parents[2] / "docs" / "design.md").read_text()
    section = design.split("\n### Events\n", 1)[1].split("\n### ", 1)[0]
    listed: dict[str, list[str]] = {"Normal": [], "Warning": []}
    for row in section.splitlines():
        cells = row.split("|")[1:-1]
        if len(cells) == 3 and not cells[0].startswith(("---", " posted")):
            listed["Normal"] += re.findall(r"`(\w+)`", cells[1])
            listed["Warning"] += re.findall(r"`(\w+)`", cells[2])
    bodies = [build_event(GCJ, RunEvent(reason, "m", subject="s"), NOW) for reason in EventReason]
    for kind in listed:
        assert sorted(listed[kind]) == sorted(b["reason"] for b in bodies if b["type"] == kind), kind
