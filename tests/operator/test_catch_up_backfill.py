"""Catch-up, backfill and suspension after failures against the emulator: the Jobs a pass
starts for past slots (one at a time, named for the slot, never twice), the backfill
annotation's progress, and the CronJob suspended (never the spec) after failed runs."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kmock
import pytest

from guardedcron import contract
from guardedcron.cli.main import main
from guardedcron.handlers.context import PassMemory
from guardedcron.kube import GUARDED_CRONJOBS, KubeClient
from guardedcron.status.runs import is_manual, scheduled_slot
from guardedcron.status.times import epoch_minute, format_time, parse_time
from tests.operator.passes import create_gcj
from tests.operator.runs_support import full_pass, store_run
from tests.support import status_objects as k
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS, NAME = "billing", "nightly-invoices"
GCJ_RES = "guardedcron.io/v1alpha1/guardedcronjobs"
JOB_RES, CRONJOB_RES = "batch/v1/jobs", "batch/v1/cronjobs"


def jobs(api: GuardedEmulator) -> list[dict[str, Any]]:
    return sorted((obj.raw for key, obj in api.objects.items()
                   if key[0] == kmock.resource(JOB_RES) and not obj.deleted),
                  key=lambda j: j["metadata"]["name"])


def events(api: GuardedEmulator, reason: str) -> list[dict[str, Any]]:
    return [r.data for r in api.writes() if r.method.value == "POST" and r.url.path.endswith("/events")
            and r.data["reason"] == reason]


def status(api: GuardedEmulator) -> dict[str, Any]:
    return dict((api.object(GCJ_RES, NS, NAME) or {}).get("status") or {})


def every_ten_minutes(**spec: Any) -> dict[str, Any]:
    body = put(put(base_gcj(), "spec.schedule", "*/10 * * * *"), "spec.timeZone", "UTC")
    for key, value in spec.items():
        body = put(body, f"spec.{key}", value)
    return body


async def created_at(client: KubeClient, body: dict[str, Any]) -> datetime:
    created = parse_time((await create_gcj(client, body))["metadata"]["creationTimestamp"])
    assert created is not None
    return created


def tens(t: datetime) -> datetime:
    """The ten-minute slot at or before `t`."""
    return t.replace(minute=t.minute - t.minute % 10, second=0, microsecond=0)


async def test_missed_slots_are_made_up_one_at_a_time_oldest_first_never_twice(
        api: GuardedEmulator, client: KubeClient) -> None:
    created = await created_at(client, every_ten_minutes(
        catchUp={"policy": "All", "windowSeconds": 7200, "maxRuns": 2}))
    now = tens(created) + timedelta(minutes=61)  # five slots due since creation, none ran
    memory = PassMemory()
    await full_pass(client, NS, NAME, now=now, memory=memory)

    (job,) = jobs(api)
    newest_due = tens(now - timedelta(minutes=11))
    oldest_chosen = newest_due - timedelta(minutes=10)  # maxRuns 2: the newest two, oldest first
    assert job["metadata"]["name"] == f"{NAME}-{epoch_minute(oldest_chosen)}-c1"
    assert job["metadata"]["annotations"][contract.ANNOTATION_RUN_KIND] == contract.RUN_KIND_CATCH_UP
    assert not is_manual(job) and scheduled_slot(job) == epoch_minute(oldest_chosen)
    assert job["spec"]["template"]["spec"]["initContainers"][0]["name"] == contract.GUARD_CONTAINER
    (event,) = events(api, "MakeUpRunCreated")
    assert job["metadata"]["name"] in event["message"]
    written = status(api)["catchUp"]
    assert parse_time(written["settledThrough"]) == oldest_chosen - timedelta(minutes=10)
    assert len(written["givenUp"]) == 3  # the three older missed slots

    # Its Job is active: nothing more starts.
    await full_pass(client, NS, NAME, now=now, memory=memory)
    assert len(jobs(api)) == 1
    # A restarted operator whose status write was lost tries the same slot: AlreadyExists.
    await client.patch_status(GUARDED_CRONJOBS, NS, NAME, {"catchUp": None, "recentRuns": None,
                                                            "lastRun": None})
    await full_pass(client, NS, NAME, now=now, memory=PassMemory())
    assert [j["metadata"]["name"] for j in jobs(api)] == [job["metadata"]["name"]]


async def test_policy_none_starts_nothing(api: GuardedEmulator, client: KubeClient) -> None:
    created = await created_at(client, every_ten_minutes())
    await full_pass(client, NS, NAME, now=tens(created) + timedelta(minutes=61), memory=PassMemory())
    assert jobs(api) == []
    assert "catchUp" not in status(api)


async def test_a_backfill_starts_with_its_oldest_slot_and_stops_when_the_annotation_goes(
        api: GuardedEmulator, client: KubeClient) -> None:
    await created_at(client, every_ten_minutes())
    now = datetime.now(UTC) + timedelta(minutes=1)
    since = tens(now) - timedelta(hours=2)
    value = f"b1:{format_time(since)}/{format_time(since + timedelta(minutes=30))}"
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME,
                             {"metadata": {"annotations": {contract.ANNOTATION_BACKFILL: value}}})
    memory = PassMemory()
    await full_pass(client, NS, NAME, now=now, memory=memory)

    (job,) = jobs(api)
    assert job["metadata"]["name"] == f"{NAME}-{epoch_minute(since)}-b1"
    assert job["metadata"]["annotations"][contract.ANNOTATION_RUN_KIND] == contract.RUN_KIND_BACKFILL
    backfill = status(api)["backfill"]
    assert backfill["token"] == "b1" and backfill["state"] == "Running"
    assert backfill["running"] == job["metadata"]["name"]
    assert backfill["remaining"] == 3 and parse_time(backfill["next"]) == since
    assert events(api, "BackfillStarted") and events(api, "BackfillRunCreated")

    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME,
                             {"metadata": {"annotations": {contract.ANNOTATION_BACKFILL: None}}})
    await full_pass(client, NS, NAME, now=now, memory=memory)
    backfill = status(api)["backfill"]
    assert backfill["state"] == "Stopped" and "removed" in backfill["message"]
    assert len(jobs(api)) == 1
    (stopped,) = events(api, "BackfillStopped")
    assert stopped["type"] == "Warning"


async def test_a_backfill_older_than_the_guard_keeps_slot_claims_is_refused_with_an_event(
        api: GuardedEmulator, client: KubeClient) -> None:
    """The guard deletes claims older than its --retain-days (90): a slot run 100 days ago
    has no claim left, so a backfill of it would run it a second time."""
    await created_at(client, every_ten_minutes())
    now = datetime.now(UTC)
    since = tens(now) - timedelta(days=100)
    value = f"b1:{format_time(since)}/{format_time(since + timedelta(minutes=30))}"
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME,
                             {"metadata": {"annotations": {contract.ANNOTATION_BACKFILL: value}}})
    memory = PassMemory()
    await full_pass(client, NS, NAME, now=now, memory=memory)

    assert jobs(api) == []
    backfill = status(api)["backfill"]
    assert backfill["token"] == "b1" and backfill["state"] == "Invalid", backfill
    assert "the guard keeps slot claims 90 days (its --retain-days)" in backfill["message"]
    (refused,) = events(api, "BackfillRefused")
    assert refused["type"] == "Warning" and refused["message"] == backfill["message"]
    await full_pass(client, NS, NAME, now=now, memory=memory)
    assert len(events(api, "BackfillRefused")) == 1 and jobs(api) == []  # once per token


async def test_failed_runs_in_a_row_suspend_the_cronjob_and_a_resume_token_resumes_it(
        api: GuardedEmulator, client: KubeClient) -> None:
    created = await created_at(client, every_ten_minutes(suspendAfterFailures=2))
    memory = PassMemory()
    first = tens(created) + timedelta(minutes=10)
    for slot in (first, first + timedelta(minutes=10)):
        failed = k.failed_conditions("BackoffLimitExceeded", "Job has reached the specified backoff limit",
                                     slot + timedelta(minutes=1))
        await store_run(client, k.job(slot_time=slot, created=slot, started=slot, conditions=failed), [])
    now = first + timedelta(minutes=15)
    await full_pass(client, NS, NAME, now=now, memory=memory)  # sees the runs fail
    await full_pass(client, NS, NAME, now=now, memory=memory)

    cronjob = api.object(CRONJOB_RES, NS, NAME) or {}
    assert cronjob["spec"]["suspend"] is True
    gcj = api.object(GCJ_RES, NS, NAME) or {}
    assert gcj["spec"]["suspend"] is False  # the spec is never written
    [condition] = [c for c in status(api)["conditions"] if c["type"] == "Suspended"]
    assert (condition["status"], condition["reason"]) == ("True", "RepeatedFailures")
    assert f"{NAME}-{epoch_minute(first)}" in condition["message"]
    (event,) = events(api, "SuspendedAfterFailures")
    assert event["type"] == "Warning"
    [ready] = [c for c in status(api)["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "True", ready

    # Still suspended on the next pass; a resume token resumes it, once.
    await full_pass(client, NS, NAME, now=now, memory=memory)
    assert (api.object(CRONJOB_RES, NS, NAME) or {})["spec"]["suspend"] is True
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME,
                             {"metadata": {"annotations": {contract.ANNOTATION_RESUME: "r1"}}})
    await full_pass(client, NS, NAME, now=now + timedelta(minutes=1), memory=memory)
    assert (api.object(CRONJOB_RES, NS, NAME) or {})["spec"]["suspend"] is False
    assert status(api)["failures"]["lastResumeToken"] == "r1"
    [condition] = [c for c in status(api)["conditions"] if c["type"] == "Suspended"]
    assert condition["status"] == "False"
    assert events(api, "ResumedAfterFailures")
    await full_pass(client, NS, NAME, now=now + timedelta(minutes=2), memory=memory)
    assert (api.object(CRONJOB_RES, NS, NAME) or {})["spec"]["suspend"] is False


async def cli(*args: str) -> int:
    return await asyncio.to_thread(main, ["backfill", NAME, "-n", NS, *args])


async def test_the_cli_sets_the_annotation_the_operator_acts_on(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    await created_at(client, every_ten_minutes())
    since = tens(datetime.now(UTC)) - timedelta(hours=1)
    until = since + timedelta(minutes=30)
    range_args = ("--since", format_time(since), "--until", format_time(until))

    assert await cli(*range_args, "--token", "b7", "--dry-run") == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["dry_run"] is True and answer["slots"] == 3
    assert [s["slot"] for s in answer["slot_times"]] == [format_time(since + timedelta(minutes=m))
                                                           for m in (0, 10, 20)]
    assert contract.ANNOTATION_BACKFILL not in ((api.object(GCJ_RES, NS, NAME) or {})["metadata"]
                                                .get("annotations") or {})  # dry run: unchanged

    assert await cli(*range_args, "--token", "b7") == 0
    answer = json.loads(capsys.readouterr().out)
    expected = f"b7:{format_time(since)}/{format_time(until)}"
    assert answer["annotation"] == expected
    gcj = api.object(GCJ_RES, NS, NAME) or {}
    assert gcj["metadata"]["annotations"][contract.ANNOTATION_BACKFILL] == expected
    await full_pass(client, NS, NAME, now=datetime.now(UTC), memory=PassMemory())
    assert [j["metadata"]["name"] for j in jobs(api)] == [f"{NAME}-{epoch_minute(since)}-b1"]

    # A used token is refused; nothing changes.
    assert await cli(*range_args, "--token", "b7") == contract.EXIT_USAGE
    assert "was used already" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "words"), [
    (("--since", "yesterday", "--until", "2026-01-01T00:00:00Z"), "--since 'yesterday' is not an RFC 3339"),
    (("--since", "2026-01-02T00:00:00Z", "--until", "2026-01-01T00:00:00Z"), "must be before until"),
    (("--since", "2026-01-01T00:00:00Z", "--until", "2999-01-01T00:00:00Z"), "is in the future"),
    (("--since", "2026-01-01T00:00:00Z", "--until", "2026-01-02T00:00:00Z", "--token", "a:b"),
     "--token must not contain :"),
])
async def test_the_cli_refuses_bad_input_and_changes_nothing(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        capsys: pytest.CaptureFixture[str], args: tuple[str, ...], words: str) -> None:
    await created_at(client, every_ten_minutes())
    assert await cli(*args) == contract.EXIT_USAGE
    assert words in capsys.readouterr().err
    assert contract.ANNOTATION_BACKFILL not in ((api.object(GCJ_RES, NS, NAME) or {})["metadata"]
                                                .get("annotations") or {})


async def test_the_cli_refuses_a_range_of_more_than_1000_slots(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    await created_at(client, every_ten_minutes())
    until = tens(datetime.now(UTC))
    assert await cli("--since", format_time(until - timedelta(days=7)), "--until", format_time(until)) == \
        contract.EXIT_USAGE
    assert "more than 1000 slots" in capsys.readouterr().err


async def test_a_backfill_whose_job_is_refused_stops_with_the_reason(
        api: GuardedEmulator, client: KubeClient) -> None:
    """A refusal that asking again would repeat (422) ends the backfill instead of
    repeating the request on every pass."""
    api[f"post /apis/batch/v1/namespaces/{NS}/jobs"] << 422 << {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
        "message": 'Job.batch "x" is invalid: metadata.name: Invalid value: "x"'}
    await created_at(client, every_ten_minutes())
    now = datetime.now(UTC) + timedelta(minutes=1)
    since = tens(now) - timedelta(hours=2)
    value = f"b1:{format_time(since)}/{format_time(since + timedelta(minutes=30))}"
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME,
                             {"metadata": {"annotations": {contract.ANNOTATION_BACKFILL: value}}})
    memory = PassMemory()
    await full_pass(client, NS, NAME, now=now, memory=memory)

    backfill = status(api)["backfill"]
    assert backfill["state"] == "Stopped" and "Invalid value" in backfill["message"], backfill
    (failed,) = events(api, "MakeUpRunFailed")
    assert "the API server refused Job" in failed["message"]
    assert events(api, "BackfillStopped")
    since_then = len(api.requests_list())
    await full_pass(client, NS, NAME, now=now, memory=memory)
    assert not [r for r in api.writes(since_then) if r.url.path.endswith("/jobs")]  # not asked again
