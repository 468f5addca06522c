"""A create writes the CronJob and the status, nothing of kopf's: kopf's record of the
last handled spec stays in the operator's memory (guardedcron.handlers.handled), not in
an annotation (a third write per object on the 5,000-object benchmark). Changes still
reach the CronJob: while the operator runs, across a restart, and after one."""

from __future__ import annotations

import asyncio
import copy
import logging
from pathlib import Path
from typing import Any

import kopf
import pytest

from guardedcron import contract
from guardedcron.handlers.handled import HandledEssences
from guardedcron.kube import GUARDED_CRONJOBS, KubeClient
from tests.operator.passes import create_gcj, eventually
from tests.operator.test_idle_restart import GCJ_RES, NS, operator, ready
from tests.support.clock import FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NAME = "nightly"
SCHEDULES = ("0 3 * * *", "0 4 * * *", "0 5 * * *", "0 6 * * *")


def cronjob_schedule(api: GuardedEmulator) -> str | None:
    cronjob = api.object("batch/v1/cronjobs", NS, NAME) or {}
    return (cronjob.get("spec") or {}).get("schedule")


async def change_schedule(client: KubeClient, schedule: str) -> None:
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"schedule": schedule}})


async def test_a_create_writes_two_objects_and_every_change_still_reaches_the_cronjob(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    runner = operator(clock)
    runner.__enter__()
    try:
        since = len(api.requests_list())
        await create_gcj(client, put(put(base_gcj(), "metadata.name", NAME), "spec.schedule", SCHEDULES[0]))
        await eventually(lambda: ready(api, NAME), "the status Ready")
        await asyncio.sleep(0.5)  # let a late write show
        writes = sorted((w.method.value, w.url.path.split("/namespaces/")[1]) for w in api.writes(since))
        assert writes == [
            ("PATCH", f"{NS}/cronjobs/{NAME}"),  # the server-side apply
            ("PATCH", f"{NS}/guardedcronjobs/{NAME}/status"),
            ("POST", f"{NS}/guardedcronjobs"),  # the test's own create
        ], writes
        annotations = (api.object(GCJ_RES, NS, NAME) or {})["metadata"].get("annotations") or {}
        assert not [key for key in annotations if key.startswith(contract.KOPF_ANNOTATION_PREFIX)]

        await change_schedule(client, SCHEDULES[1])
        await eventually(lambda: cronjob_schedule(api) == SCHEDULES[1], "the change applied")
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)

    # Changed while no operator ran: the restart's resume pass applies it ...
    await change_schedule(client, SCHEDULES[2])
    runner = operator(clock)
    runner.__enter__()
    try:
        await eventually(lambda: cronjob_schedule(api) == SCHEDULES[2], "the change made while down")
        # ... and the essence it resumed is the base for the next change.
        await change_schedule(client, SCHEDULES[3])
        await eventually(lambda: cronjob_schedule(api) == SCHEDULES[3], "a change after the restart")
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


def listed_body(**metadata: Any) -> kopf.Body:
    """A GuardedCronJob as a listing returns it: status, managed fields and the
    annotations kopf's essence keeps or drops."""
    gcj = put(put(base_gcj(), "metadata.name", NAME), "status", {
        "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled"}],
        "history": [{"slot": 1, "outcome": "succeeded"}],
    })
    gcj["metadata"].update(uid="u-1", resourceVersion="7", generation=3,
                           managedFields=[{"manager": "guardedcron", "fieldsV1": {"f:status": {}}}],
                           **metadata)
    return kopf.Body(gcj)


@pytest.mark.parametrize("metadata", [
    {},
    {"labels": {"team": "billing"}},
    {"labels": {}, "annotations": {}},
    {"annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": '{"spec": {}}',
        "example.com/kopf-managed": "yes", "example.com/reconcile": "{}",  # another kopf operator's
        f"{contract.KOPF_ANNOTATION_PREFIX}/reconcile": '{"retries": 1}',
        "team.example.com/owner": "billing",
    }, "labels": {"team": "billing"}},
])
def test_the_essence_is_kopfs_own(metadata: dict[str, Any]) -> None:
    """HandledEssences builds the essence from the parts of the body kopf keeps: the
    same essence as kopf's own build from the whole body, which must not change."""
    handled = HandledEssences()
    body = listed_body(**metadata)
    before = copy.deepcopy(dict(body))
    ours = handled.build(body=body)
    assert ours == kopf.DiffBaseStorage.build(handled, body=body)
    assert "status" not in ours and "managedFields" not in (ours.get("metadata") or {})
    assert dict(body) == before
    # With fields kopf takes from elsewhere (handlers on a status field), kopf's own build.
    extra = handled.build(body=body, extra_fields=["status.history"])
    assert extra == kopf.DiffBaseStorage.build(handled, body=body, extra_fields=["status.history"])
    assert extra["status"]["history"] == [{"slot": 1, "outcome": "succeeded"}]


@pytest.mark.parametrize("labels", [{}, {"labels": {"team": "billing"}}])
def test_a_changed_spec_or_label_is_a_change_and_a_retry_count_is_not(labels: dict[str, Any]) -> None:
    handled = HandledEssences()
    body = listed_body(**labels)
    assert handled.fetch(body=body) == handled.build(body=body)  # listed with a status: a resume
    handled.store(body=body, patch=kopf.Patch(), essence=handled.build(body=body))
    retry_count = {f"{contract.KOPF_ANNOTATION_PREFIX}/reconcile": '{"retries": 2}'}
    retried = listed_body(**labels, annotations=retry_count)
    assert handled.fetch(body=retried) != {}
    for changed in (listed_body(labels={"team": "payments"}),
                    kopf.Body(put(dict(body), "spec.schedule", "0 9 * * *"))):
        assert handled.fetch(body=changed) == {}
