"""`spec.lease.onLost: StopWorkload` against the emulator: the pod of a run whose keeper
reported the lease lost is deleted (once, that pod instance only), with an Event; the
operator without the right says so in an Event instead; `Record` only records."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from guardedcron.handlers.context import OperatorContext, PassMemory
from guardedcron.handlers.registry import build_registry
from guardedcron.kube import KubeClient
from guardedcron.spec import Settings
from tests.operator.passes import SETTINGS, create_gcj, eventually, one_pass
from tests.operator.runs_support import full_pass, store_run
from tests.support import status_objects as k
from tests.support.clock import T0, FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put
from tests.support.status_world import Runs

NS, NAME = k.NAMESPACE, k.CRONJOB
POD_RES, GCJ_RES = "v1/pods", "guardedcron.io/v1alpha1/guardedcronjobs"
AT = T0 - timedelta(minutes=10)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


async def guarded(client: KubeClient, on_lost: str) -> None:
    body = put(put(base_gcj(), "spec.lease.heartbeat", True), "spec.lease.onLost", on_lost)
    await create_gcj(client, body)
    await one_pass(client, NS, NAME, now=T0)  # the CronJob


def events(api: GuardedEmulator) -> list[dict[str, Any]]:
    return [r.data for r in api.writes() if r.method.value == "POST" and r.url.path.endswith("/events")]


def reasons(api: GuardedEmulator) -> list[str]:
    return [e["reason"] for e in events(api)]


def deletes(api: GuardedEmulator) -> list[Any]:
    return [r for r in api.writes() if r.method.value == "DELETE"]


async def test_stop_workload_deletes_the_pod_of_a_lost_run_once(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await guarded(client, "StopWorkload")
    job, pods = runs.lost(AT, 41, finished=False)
    await store_run(client, job, pods)
    memory = PassMemory()

    await full_pass(client, NS, NAME, now=T0, memory=memory, stop_workload=True)

    pod = k.pod_name(job)
    assert api.object(POD_RES, NS, pod) is None
    (delete,) = deletes(api)
    assert delete.url.path == f"/api/v1/namespaces/{NS}/pods/{pod}"
    assert delete.data["preconditions"] == {"uid": pods[0]["metadata"]["uid"]}
    status = (api.object(GCJ_RES, NS, NAME) or {})["status"]
    assert status["lastRun"]["outcome"] == "Lost" and "finishedAt" not in status["lastRun"]
    assert reasons(api)[-2:] == ["LeaseLost", "WorkloadStopped"]
    stopped = events(api)[-1]
    assert stopped["type"] == "Warning"
    assert pod in stopped["message"] and "lease taken over by eu-2/billing/y" in stopped["message"]

    # The pod is gone; later passes neither delete nor post again.
    before = len(api.writes())
    await full_pass(client, NS, NAME, now=T0 + timedelta(seconds=5), memory=memory, stop_workload=True)
    assert [r.data for r in api.writes()[before:]] == []


async def test_a_pod_already_terminating_is_left_to_finish(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await guarded(client, "StopWorkload")
    job, pods = runs.lost(AT, 41, finished=False)
    pods[0]["metadata"]["deletionTimestamp"] = k.ts(T0 - timedelta(seconds=3))
    await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), stop_workload=True)

    assert deletes(api) == []
    assert "WorkloadStopped" not in reasons(api)


async def test_without_the_right_to_delete_pods_an_event_says_so_once(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await guarded(client, "StopWorkload")
    job, pods = runs.lost(AT, 41, finished=False)
    await store_run(client, job, pods)
    memory = PassMemory()

    await full_pass(client, NS, NAME, now=T0, memory=memory, stop_workload=False)
    await full_pass(client, NS, NAME, now=T0 + timedelta(seconds=5), memory=memory, stop_workload=False)

    assert deletes(api) == []
    assert api.object(POD_RES, NS, k.pod_name(job)) is not None
    assert reasons(api).count("StopWorkloadFailed") == 1
    failed = next(e for e in events(api) if e["reason"] == "StopWorkloadFailed")
    assert "stopWorkload.enabled=true" in failed["message"] and k.pod_name(job) in failed["message"]


async def test_record_only_records(api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await guarded(client, "Record")
    job, pods = runs.lost(AT, 41, finished=False)
    await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), stop_workload=True)

    assert deletes(api) == []
    assert reasons(api) == ["LeaseLost"]
    assert (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastRun"]["outcome"] == "Lost"


async def test_a_finished_lost_run_has_nothing_to_stop(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await guarded(client, "StopWorkload")
    job, pods = runs.lost(AT, 41, finished=True)
    pods[0]["status"]["phase"] = "Succeeded"
    await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), stop_workload=True)

    assert deletes(api) == []
    assert json.dumps(reasons(api)) == '["LeaseLost"]'


@pytest.mark.usefixtures("kubeconfig")
async def test_the_running_operator_stops_a_lost_run_from_the_pod_event(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    """Through kopf: the keeper's report arriving as a pod event is enough (the operator's
    switch reaches the pass), and the deletion follows within the pass."""
    body = put(put(base_gcj(), "spec.lease.heartbeat", True), "spec.lease.onLost", "StopWorkload")
    await create_gcj(client, body)
    context = OperatorContext(client=KubeClient(), clock=FakeClock(),
                              settings=Settings(build=SETTINGS, namespaces=(NS,), stop_workload=True))
    runner = KopfRunner(["run", "--standalone", "--namespace", NS], registry=build_registry(context),
                        timeout=30)
    runner.__enter__()
    try:
        await eventually(lambda: api.object("batch/v1/cronjobs", NS, NAME), "the CronJob applied")
        job, pods = runs.lost(AT, 41, finished=False)
        await store_run(client, job, pods)
        await eventually(lambda: api.object(POD_RES, NS, k.pod_name(job)) is None, "the pod deleted")
        await eventually(lambda: "WorkloadStopped" in reasons(api), "the WorkloadStopped Event")
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output
