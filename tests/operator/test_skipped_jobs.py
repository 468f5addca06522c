"""A skipped run's Job is removed once status records the skip, so it is never left as a
Failed Job for generic alerting (kube-state-metrics' kube_job_status_failed) nor uses up
failedJobsHistoryLimit; real failures and running Jobs stay."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron.handlers.context import PassMemory
from guardedcron.kube import JOBS, PODS, KubeClient
from tests.operator.passes import create_gcj, one_pass
from tests.operator.runs_support import full_pass, store_run
from tests.support import status_objects as k
from tests.support.clock import T0
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj
from tests.support.status_world import Runs

NS, NAME = k.NAMESPACE, k.CRONJOB
JOB_RES, GCJ_RES = "batch/v1/jobs", "guardedcron.io/v1alpha1/guardedcronjobs"
AT = T0 - timedelta(minutes=10)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


def job_deletes(api: GuardedEmulator) -> list[Any]:
    return [r for r in api.writes() if r.method.value == "DELETE" and "/jobs/" in r.url.path]


def reasons(api: GuardedEmulator) -> list[str]:
    return [r.data["reason"] for r in api.writes()
            if r.method.value == "POST" and r.url.path.endswith("/events")]


async def test_a_skipped_runs_job_goes_once_status_names_the_winner(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    job, pods = runs.skipped(AT, 41)
    await store_run(client, job, pods)
    memory = PassMemory()

    await full_pass(client, NS, NAME, now=T0, memory=memory)

    name = job["metadata"]["name"]
    assert api.object(JOB_RES, NS, name) is None
    (delete,) = job_deletes(api)
    assert delete.url.path == f"/apis/batch/v1/namespaces/{NS}/jobs/{name}"
    assert delete.data["preconditions"] == {"uid": job["metadata"]["uid"]}
    assert delete.url.query.get("propagationPolicy") == "Background"
    last = (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastRun"]
    assert (last["job"], last["outcome"], last["holder"]) == (name, "Skipped", "eu-2/billing/x"), last
    assert "SkippedJobKept" not in reasons(api)

    # The Job is gone and status keeps its record: later passes write nothing.
    before = len(api.writes())
    await full_pass(client, NS, NAME, now=T0 + timedelta(seconds=5), memory=memory)
    assert [r.data for r in api.writes()[before:]] == []
    assert (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastRun"]["outcome"] == "Skipped"


async def test_failed_and_running_jobs_stay(api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    for job, pods in (runs.failed(AT - timedelta(hours=1), 40), runs.running(AT, 41)):
        await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory())

    assert job_deletes(api) == []


async def test_a_refused_removal_is_one_warning(api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    job, pods = runs.skipped(AT, 41)
    await store_run(client, job, pods)
    name = job["metadata"]["name"]
    api[f"delete /apis/batch/v1/namespaces/{NS}/jobs/{name}"] << 403 << {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": f'jobs.batch "{name}" is forbidden: cannot delete'}
    memory = PassMemory()

    await full_pass(client, NS, NAME, now=T0, memory=memory)
    await full_pass(client, NS, NAME, now=T0 + timedelta(seconds=5), memory=memory)

    # Asked once (asking again would be refused again), said once; the emulator's own
    # bookkeeping drops the object before the reaction answers, so only the requests tell.
    assert len(job_deletes(api)) == 1
    assert reasons(api).count("SkippedJobKept") == 1




async def running_run_in_status(api: GuardedEmulator, client: KubeClient,
                                runs: Runs) -> Callable[[], Awaitable[None]]:
    """A running run stored and seen by a pass; returns what deletes its Job and pods."""
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    job, pods = runs.running(AT, 41)
    await store_run(client, job, pods)
    await full_pass(client, NS, NAME, now=T0, memory=PassMemory())
    assert (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastRun"]["outcome"] == "Running"

    async def remove_run() -> None:
        await client.delete(JOBS, NS, job["metadata"]["name"])
        for pod in pods:
            await client.delete(PODS, NS, pod["metadata"]["name"])

    return remove_run


async def test_a_run_whose_job_the_index_lacks_is_read_from_the_api_not_closed_as_deleted(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    """A standby operator that resumes re-lists each resource on its own: a pass can come
    before its Jobs are indexed again. Status remembers the run open; its Job is still
    there and has succeeded meanwhile, so the run is Succeeded, not 'Job deleted'."""
    remove_run = await running_run_in_status(api, client, runs)
    await remove_run()
    done, pods = runs.succeeded(AT, 41)
    await store_run(client, done, pods)

    await one_pass(client, NS, NAME, now=T0 + timedelta(minutes=11))  # its index holds no Job

    last = (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastRun"]
    assert (last["job"], last["outcome"]) == (done["metadata"]["name"], "Succeeded"), last


async def test_a_run_whose_job_is_gone_is_closed_as_deleted(
        api: GuardedEmulator, client: KubeClient, runs: Runs) -> None:
    remove_run = await running_run_in_status(api, client, runs)
    await remove_run()

    await one_pass(client, NS, NAME, now=T0 + timedelta(minutes=11))

    last = (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastRun"]
    assert last["outcome"] == "Failed" and last["reason"].startswith("Job deleted before it finished"), last
