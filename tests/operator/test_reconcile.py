"""The reconcile pass, called directly, against the extended API emulator.

Each test runs passes the way the operator does (objects read back from the API
server) and counts the requests that change something. The emulator's extensions
(server-side apply, uid/generation, status subresource; see emulator.py) are what
these scenarios rely on; the e2e suite runs them on a real API server.
"""

from __future__ import annotations

from typing import Any

import pytest

from guardedcron import contract
from guardedcron.builders import build_cronjob
from guardedcron.handlers.context import PassMemory
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient
from guardedcron.planner.ssa import first_difference
from guardedcron.spec import parse_guarded_cronjob
from tests.operator.passes import SETTINGS, create_gcj, one_pass
from tests.support.clock import T0, FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS, NAME = "billing", "nightly-invoices"
GCJ_RES, CJ_RES = "guardedcron.io/v1alpha1/guardedcronjobs", "batch/v1/cronjobs"


def cronjob(api: GuardedEmulator) -> dict[str, Any] | None:
    return api.object(CJ_RES, NS, NAME)


def gcj(api: GuardedEmulator) -> dict[str, Any]:
    found = api.object(GCJ_RES, NS, NAME)
    assert found is not None
    return found


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def describe(requests: list[Any]) -> list[tuple[str, str, str | None]]:
    return [(r.method.value, r.url.path, r.headers.get("Content-Type")) for r in requests]


async def test_create_applies_the_guarded_cronjob_with_owner_reference_and_writes_status(
        api: GuardedEmulator, client: KubeClient) -> None:
    created = await create_gcj(client, base_gcj())
    since = len(api.requests_list())

    result = await one_pass(client, NS, NAME, now=T0)

    assert result.applied and result.status_written and result.apply_error is None
    writes = api.writes(since)
    assert describe(writes) == [
        ("PATCH", f"/apis/batch/v1/namespaces/{NS}/cronjobs/{NAME}", "application/apply-patch+yaml"),
        ("PATCH", f"/apis/guardedcron.io/v1alpha1/namespaces/{NS}/guardedcronjobs/{NAME}/status",
         "application/merge-patch+json"),
    ]
    assert writes[0].params == {"fieldManager": contract.FIELD_MANAGER, "force": "true"}

    live = cronjob(api)
    assert live is not None
    desired = build_cronjob(parse_guarded_cronjob(created), SETTINGS)
    assert first_difference(desired, live) is None  # every field the builder sets, as built
    assert live["metadata"]["ownerReferences"] == [{
        "apiVersion": "guardedcron.io/v1alpha1", "kind": "GuardedCronJob", "name": NAME,
        "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    assert "finalizers" not in gcj(api)["metadata"]  # deletion is the garbage collector's
    spec = live["spec"]
    assert (spec["schedule"], spec["timeZone"], spec["concurrencyPolicy"], spec["suspend"],
            spec["startingDeadlineSeconds"]) == ("30 2 * * *", "Europe/Stockholm", "Forbid", False, 600)
    job = spec["jobTemplate"]["spec"]
    assert (job["backoffLimit"], job["activeDeadlineSeconds"], job["podReplacementPolicy"]) == \
        (0, 3600, "Failed")
    assert [r["onExitCodes"]["values"] for r in job["podFailurePolicy"]["rules"]] == [
        [75], [64, 69, 70, 77, 78]]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert [c["name"] for c in pod["initContainers"]] == [contract.GUARD_CONTAINER]
    assert pod["volumes"][0]["name"] == contract.RUN_VOLUME

    status = gcj(api)["status"]
    assert status["observedGeneration"] == 1
    assert status["cronJobRef"] == {"name": NAME}
    assert status["nextScheduleTime"] == "2025-01-11T01:30:00Z"  # 02:30 in Stockholm, UTC+1
    ready = condition(gcj(api), "Ready")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("True", "CronJobReady", 1)
    assert ready["lastTransitionTime"] == "2025-01-10T12:00:00Z"
    assert condition(gcj(api), "Invalid")["status"] == "False"
    assert condition(gcj(api), "Stalled")["status"] == "False"
    assert gcj(api)["spec"] == created["spec"]  # spec is never written


async def test_passes_over_up_to_date_objects_write_nothing(api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, base_gcj())
    memory = PassMemory()
    await one_pass(client, NS, NAME, now=T0, memory=memory)
    since = len(api.requests_list())

    again = await one_pass(client, NS, NAME, now=T0.replace(minute=30), memory=memory)
    restarted = await one_pass(client, NS, NAME, now=T0.replace(hour=20))  # a new operator: no memory

    assert not again.applied and not again.status_written
    assert not restarted.applied and not restarted.status_written
    assert api.writes(since) == []


async def test_schedule_change_updates_the_cronjob_and_keeps_unchanged_transition_times(
        api: GuardedEmulator, client: KubeClient, clock: FakeClock) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=clock())
    ready_before = condition(gcj(api), "Ready")
    clock.advance(hours=1)
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"schedule": "15 4 * * 1-5"}})
    since = len(api.requests_list())

    result = await one_pass(client, NS, NAME, now=clock())

    assert result.applied and result.status_written
    assert len(api.writes(since)) == 2
    live = cronjob(api)
    assert live is not None and live["spec"]["schedule"] == "15 4 * * 1-5"
    status = gcj(api)["status"]
    assert status["observedGeneration"] == 2
    assert status["nextScheduleTime"] == "2025-01-13T03:15:00Z"  # Monday 04:15 in Stockholm
    ready = condition(gcj(api), "Ready")
    assert ready["observedGeneration"] == 2
    assert ready["lastTransitionTime"] == ready_before["lastTransitionTime"]  # still True: kept


async def test_a_field_no_longer_set_is_removed_from_the_cronjob(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"timeZone": None}})

    result = await one_pass(client, NS, NAME, now=T0)

    live = cronjob(api)
    assert result.applied and live is not None
    assert "timeZone" not in live["spec"]
    assert gcj(api)["status"]["nextScheduleTime"] == "2025-01-11T02:30:00Z"  # UTC now


async def test_a_cronjob_edited_by_hand_is_repaired(api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await client.merge_patch(CRONJOBS, NS, NAME, {"spec": {
        "concurrencyPolicy": "Allow", "schedule": "* * * * *",
        "jobTemplate": {"spec": {"template": {"spec": {"initContainers": []}}}}}})
    since = len(api.requests_list())

    result = await one_pass(client, NS, NAME, now=T0)

    assert result.applied and not result.status_written  # the status never stopped being true
    assert len(api.writes(since)) == 1
    live = cronjob(api)
    assert live is not None
    assert (live["spec"]["concurrencyPolicy"], live["spec"]["schedule"]) == ("Forbid", "30 2 * * *")
    init = live["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == [contract.GUARD_CONTAINER]


async def test_fields_others_add_to_the_cronjob_are_theirs(api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await client.merge_patch(CRONJOBS, NS, NAME, {"metadata": {
        "labels": {"team": "billing"}, "annotations": {"argocd.argoproj.io/sync-wave": "1"}}},
        field_manager="kubectl-edit")
    since = len(api.requests_list())

    result = await one_pass(client, NS, NAME, now=T0)

    assert not result.applied and api.writes(since) == []


async def test_a_cronjob_deleted_by_hand_is_created_again(api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    first_uid = (cronjob(api) or {})["metadata"]["uid"]
    await client.delete(CRONJOBS, NS, NAME)

    result = await one_pass(client, NS, NAME, now=T0)

    live = cronjob(api)
    assert result.applied and live is not None and live["metadata"]["uid"] != first_uid
    assert not result.status_written


async def test_suspend_passes_through(api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, put(base_gcj(), "spec.suspend", True))

    await one_pass(client, NS, NAME, now=T0)

    live = cronjob(api)
    assert live is not None and live["spec"]["suspend"] is True
    status = gcj(api)["status"]
    assert "nextScheduleTime" not in status  # nothing is scheduled while suspended
    assert condition(gcj(api), "Ready")["status"] == "True"

    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"suspend": False}})
    await one_pass(client, NS, NAME, now=T0)
    live = cronjob(api)
    assert live is not None and live["spec"]["suspend"] is False
    assert gcj(api)["status"]["nextScheduleTime"] == "2025-01-11T01:30:00Z"


INVALID_SPECS = {
    "unparseable schedule": ("spec.schedule", "61 * * * *", "spec.schedule"),
    "unknown time zone": ("spec.timeZone", "Mars/Olympus_Mons", "spec.timeZone"),
    "reserved container name": ("spec.jobTemplate.spec.template.spec.containers[0].name",
                                contract.GUARD_CONTAINER,
                                "spec.jobTemplate.spec.template.spec.containers[0].name"),
}


@pytest.mark.parametrize("case", INVALID_SPECS.values(), ids=INVALID_SPECS.keys())
async def test_an_invalid_spec_is_reported_and_makes_no_cronjob(
        api: GuardedEmulator, client: KubeClient, case: tuple[str, str, str]) -> None:
    path, value, named_field = case
    await create_gcj(client, put(base_gcj(), path, value))
    since = len(api.requests_list())

    result = await one_pass(client, NS, NAME, now=T0)

    assert not result.applied and result.status_written
    assert describe(api.writes(since)) == [
        ("PATCH", f"/apis/guardedcron.io/v1alpha1/namespaces/{NS}/guardedcronjobs/{NAME}/status",
         "application/merge-patch+json"),
        ("POST", f"/api/v1/namespaces/{NS}/events", "application/json")]
    assert api.writes(since)[1].data["reason"] == "SpecInvalid"
    assert cronjob(api) is None
    invalid = condition(gcj(api), "Invalid")
    assert (invalid["status"], invalid["reason"], invalid["observedGeneration"]) == ("True", "SpecInvalid", 1)
    assert invalid["message"].startswith(f"{named_field}: ")
    assert condition(gcj(api), "Ready")["status"] == "False"
    assert "cronJobRef" not in gcj(api)["status"]

    since = len(api.requests_list())
    assert not (await one_pass(client, NS, NAME, now=T0)).status_written
    assert api.writes(since) == []


async def test_fixing_an_invalid_spec_creates_the_cronjob_and_moves_the_transitions(
        api: GuardedEmulator, client: KubeClient, clock: FakeClock) -> None:
    await create_gcj(client, put(base_gcj(), "spec.schedule", "61 * * * *"))
    await one_pass(client, NS, NAME, now=clock())
    clock.advance(minutes=5)
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"schedule": "30 2 * * *"}})

    result = await one_pass(client, NS, NAME, now=clock())

    assert result.applied and cronjob(api) is not None
    invalid, ready = condition(gcj(api), "Invalid"), condition(gcj(api), "Ready")
    assert (invalid["status"], invalid["lastTransitionTime"]) == ("False", "2025-01-10T12:05:00Z")
    assert (ready["status"], ready["lastTransitionTime"]) == ("True", "2025-01-10T12:05:00Z")
    assert ready["observedGeneration"] == invalid["observedGeneration"] == 2


async def test_an_invalid_spec_leaves_the_existing_cronjob_as_it_was(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    before = cronjob(api)
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"timeZone": "Nowhere/Land"}})
    since = len(api.requests_list())

    await one_pass(client, NS, NAME, now=T0)

    assert cronjob(api) == before  # still the last valid, guarded CronJob
    assert [r.url.path for r in api.writes(since)] == [
        f"/apis/guardedcron.io/v1alpha1/namespaces/{NS}/guardedcronjobs/{NAME}/status",
        f"/api/v1/namespaces/{NS}/events"]
    assert condition(gcj(api), "Invalid")["status"] == "True"


async def test_the_api_servers_refusal_is_shown_in_its_own_words(
        api: GuardedEmulator, client: KubeClient) -> None:
    # What kube-apiserver says of a container without an image (validation of the pod template).
    refusal = ('CronJob.batch "nightly-invoices" is invalid: '
               'spec.jobTemplate.spec.template.spec.containers[0].image: Required value')

    def no_image(obj: Any) -> str | None:
        containers = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        return refusal if any("image" not in c for c in containers) else None

    api.validators.append(no_image)
    await create_gcj(client, put(base_gcj(), "spec.jobTemplate.spec.template.spec.containers[0]",
                                 {"name": "task", "command": ["run"]}))

    result = await one_pass(client, NS, NAME, now=T0)

    assert not result.applied and result.apply_error == refusal and cronjob(api) is None
    stalled = condition(gcj(api), "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "CronJobRejected")
    assert refusal in stalled["message"]
    assert condition(gcj(api), "Ready")["status"] == "False"


async def test_a_cronjob_of_the_same_name_that_is_not_ours_is_never_taken_over(
        api: GuardedEmulator, client: KubeClient) -> None:
    theirs = {"apiVersion": "batch/v1", "kind": "CronJob",
              "metadata": {"name": NAME, "namespace": NS},
              "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                  "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}}
    await client.create(CRONJOBS, NS, theirs)
    await create_gcj(client, base_gcj())
    before = cronjob(api)
    since = len(api.requests_list())

    result = await one_pass(client, NS, NAME, now=T0)

    assert result.not_owned and not result.applied
    assert cronjob(api) == before
    assert [r.url.path for r in api.writes(since)] == [
        f"/apis/guardedcron.io/v1alpha1/namespaces/{NS}/guardedcronjobs/{NAME}/status",
        f"/api/v1/namespaces/{NS}/events"]
    assert api.writes(since)[1].data["reason"] == "CronJobNotOwned"
    stalled = condition(gcj(api), "Stalled")
    assert stalled["status"] == "True" and "not controlled by this GuardedCronJob" in stalled["message"]
