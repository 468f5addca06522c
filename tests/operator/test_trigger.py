"""Manual runs against the emulator: the `guardedcron.io/trigger` annotation (one Job
per token, across retries and restarts) and `guardedcron trigger` (the CLI, through a
kubeconfig, with its refusals)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from guardedcron import contract
from guardedcron.builders.manual import trigger_job_name
from guardedcron.cli.main import main
from guardedcron.handlers.context import PassMemory
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, JOBS, KubeClient
from guardedcron.status.runs import is_manual
from tests.operator.passes import create_gcj, one_pass, server_url
from tests.operator.runs_support import full_pass
from tests.support.clock import T0
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS, NAME = "billing", "nightly-invoices"
GCJ_RES, JOB_RES = "guardedcron.io/v1alpha1/guardedcronjobs", "batch/v1/jobs"


def jobs(api: GuardedEmulator) -> list[dict[str, Any]]:
    return [obj.raw for key, obj in api.objects.items()
            if key[0] == kmock.resource(JOB_RES) and not obj.deleted]


def posted_events(api: GuardedEmulator) -> list[dict[str, Any]]:
    return [r.data for r in api.writes() if r.method.value == "POST" and r.url.path.endswith("/events")]


async def annotate(client: KubeClient, token: str | None) -> None:
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME,
                             {"metadata": {"annotations": {contract.ANNOTATION_TRIGGER: token}}})


async def test_a_new_token_makes_one_guarded_manual_job(api: GuardedEmulator, client: KubeClient) -> None:
    uid = (await create_gcj(client, base_gcj()))["metadata"]["uid"]
    memory = PassMemory()
    await full_pass(client, NS, NAME, now=T0, memory=memory)
    assert jobs(api) == []  # no annotation, no run

    await annotate(client, "2025-06-01 rerun")
    await full_pass(client, NS, NAME, now=T0, memory=memory)

    (job,) = jobs(api)
    assert job["metadata"]["name"] == trigger_job_name(NAME, uid, "2025-06-01 rerun")
    assert job["metadata"]["annotations"][contract.ANNOTATION_TRIGGER] == "2025-06-01 rerun"
    assert job["metadata"]["annotations"][contract.ANNOTATION_MANUAL] == "trigger-annotation"
    assert is_manual(job)
    cronjob = api.object("batch/v1/cronjobs", NS, NAME) or {}
    assert job["metadata"]["ownerReferences"][0]["uid"] == cronjob["metadata"]["uid"]
    assert job["spec"]["template"]["spec"]["initContainers"][0]["name"] == contract.GUARD_CONTAINER
    status = (api.object(GCJ_RES, NS, NAME) or {})["status"]
    assert status["lastTriggerToken"] == "2025-06-01 rerun"
    (event,) = [e for e in posted_events(api) if e["reason"] == "ManualRunCreated"]
    assert job["metadata"]["name"] in event["message"] and event["type"] == "Normal"

    # The Job's own pass sees the run as manual; the same token makes nothing more.
    await full_pass(client, NS, NAME, now=T0, memory=memory)
    status = (api.object(GCJ_RES, NS, NAME) or {})["status"]
    assert status["lastRun"]["job"] == job["metadata"]["name"] and status["lastRun"]["manual"] is True
    assert len(jobs(api)) == 1

    # A new token: one more run. Removing the annotation: nothing.
    await annotate(client, "second")
    await full_pass(client, NS, NAME, now=T0, memory=memory)
    await annotate(client, None)
    await full_pass(client, NS, NAME, now=T0, memory=memory)
    assert len(jobs(api)) == 2
    assert (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastTriggerToken"] == "second"


async def test_a_token_seen_again_after_a_lost_status_write_makes_no_second_job(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, put(base_gcj(), "metadata.annotations", {contract.ANNOTATION_TRIGGER: "t1"}))
    await full_pass(client, NS, NAME, now=T0, memory=PassMemory())
    assert len(jobs(api)) == 1
    # As if the status write had failed: the stored status forgets the token, and a
    # restarted operator (a new memory) acts on it again.
    await client.patch_status(GUARDED_CRONJOBS, NS, NAME, {"lastTriggerToken": None})
    since = len(api.requests_list())

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory())

    assert len(jobs(api)) == 1
    creates = [r for r in api.writes(since) if r.method.value == "POST" and r.url.path.endswith("/jobs")]
    assert len(creates) == 1  # tried, answered AlreadyExists
    assert (api.object(GCJ_RES, NS, NAME) or {})["status"]["lastTriggerToken"] == "t1"


async def test_a_bad_token_is_refused_once_and_changes_nothing(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, put(base_gcj(), "metadata.annotations",
                                 {contract.ANNOTATION_TRIGGER: "x" * 300}))
    memory = PassMemory()
    await full_pass(client, NS, NAME, now=T0, memory=memory)
    await full_pass(client, NS, NAME, now=T0, memory=memory)

    assert jobs(api) == []
    assert "lastTriggerToken" not in (api.object(GCJ_RES, NS, NAME) or {})["status"]
    (event,) = [e for e in posted_events(api) if e["reason"] == "TriggerFailed"]
    assert "at most 253" in event["message"] and event["type"] == "Warning"


async def test_a_trigger_waits_for_the_cronjob_it_copies(api: GuardedEmulator, client: KubeClient) -> None:
    # A CronJob of that name that is not ours: no apply, no copy of it, no token recorded.
    await client.create(CRONJOBS, NS, {"apiVersion": "batch/v1", "kind": "CronJob",
                                       "metadata": {"name": NAME, "namespace": NS},
                                       "spec": {"schedule": "* * * * *", "jobTemplate": {}}})
    await create_gcj(client, put(base_gcj(), "metadata.annotations", {contract.ANNOTATION_TRIGGER: "t1"}))
    await one_pass(client, NS, NAME, now=T0)
    assert jobs(api) == []
    assert "lastTriggerToken" not in (api.object(GCJ_RES, NS, NAME) or {})["status"]


# --- guardedcron trigger ----------------------------------------------------------

@pytest.fixture
def kubeconfig(api: GuardedEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server_url(api)}}],
        "users": [{"name": "tester", "user": {"token": "secret-token-value"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                      "namespace": NS}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    yield path


async def cli(*args: str) -> int:
    import asyncio

    # The command runs its own event loop, so it gets a thread of its own here.
    return await asyncio.to_thread(main, ["trigger", *args])


async def test_the_cli_creates_a_manual_job_in_the_contexts_namespace(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)

    assert await cli(NAME) == 0

    answer = json.loads(capsys.readouterr().out)
    (job,) = jobs(api)
    assert answer == {"namespace": NS, "guarded_cronjob": NAME, "job": job["metadata"]["name"]}
    assert job["metadata"]["name"].startswith(f"{NAME}-manual-")
    assert job["metadata"]["annotations"][contract.ANNOTATION_MANUAL] == "guardedcron-trigger"
    assert job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    assert contract.ANNOTATION_TRIGGER not in job["metadata"]["annotations"]
    assert job["spec"]["template"]["spec"]["initContainers"][0]["name"] == contract.GUARD_CONTAINER
    assert (await client.get(JOBS, NS, job["metadata"]["name"]))["metadata"]["name"]

    assert await cli(NAME, "-n", NS) == 0
    assert len(jobs(api)) == 2  # a new name each time


async def test_the_cli_names_what_is_missing(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert await cli("absent") == 1
    assert f"GuardedCronJob {NS}/absent not found" in capsys.readouterr().err

    await create_gcj(client, base_gcj())  # no pass: the operator is not running
    assert await cli(NAME) == 1
    err = capsys.readouterr().err
    assert f"CronJob {NS}/{NAME} does not exist: is the operator running?" in err
    assert jobs(api) == []
    assert "secret-token-value" not in err


async def test_the_cli_refuses_a_cronjob_guardedcron_did_not_build(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    await client.create(CRONJOBS, NS, {"apiVersion": "batch/v1", "kind": "CronJob",
                                       "metadata": {"name": NAME, "namespace": NS},
                                       "spec": {"schedule": "* * * * *", "jobTemplate": {}}})
    await create_gcj(client, base_gcj())
    assert await cli(NAME) == 1
    assert "is not controlled by GuardedCronJob" in capsys.readouterr().err
    assert jobs(api) == []


async def test_the_cli_checks_its_input_before_connecting(
        api: GuardedEmulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert await cli("Not_A_Name") == 64
    assert await cli("ok", "-n", "x" * 64) == 64
    assert api.requests_list() == []
    assert "'Not_A_Name' is not a valid name" in capsys.readouterr().err


async def test_the_cli_says_when_the_api_server_is_unreachable(
        closed_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KUBECONFIG", str(closed_kubeconfig))
    assert await cli(NAME) == 69
    assert "cannot reach the API server" in capsys.readouterr().err
