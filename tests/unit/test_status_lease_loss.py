"""A lost lease while the workload runs: which pods `onLost: StopWorkload` stops, and a
Lost run staying Lost once its pod (and the keeper's report with it) is gone."""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path

import pytest

from guardedcron.status.lease_loss import StopOrder, workloads_to_stop
from tests.support import status_objects as k
from tests.support.gcj import put
from tests.support.status_world import Runs, compute, compute_change, slot, the_gcj


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


def test_the_running_pod_of_an_open_lost_run_is_to_stop(runs: Runs) -> None:
    job, pods = runs.lost(slot(10), 4, finished=False)
    change = compute_change([(job, pods)], None, slot(10) + timedelta(minutes=12))
    status = change.status
    (order,) = workloads_to_stop(change.runs.values(), {job["metadata"]["name"]: pods})
    assert order == StopOrder(job=job["metadata"]["name"], pod=k.pod_name(job),
                              pod_uid=pods[0]["metadata"]["uid"], reason=status["lastRun"]["reason"])
    assert "lease taken over by eu-2/billing/y with fence 5" in order.reason


def test_terminating_ended_or_other_runs_have_nothing_to_stop(runs: Runs) -> None:
    now = slot(16) + timedelta(minutes=5)
    lost_job, lost_pods = runs.lost(slot(10), 4, finished=False)
    terminating = copy.deepcopy(lost_pods[0])
    terminating["metadata"]["deletionTimestamp"] = k.ts(now)
    ended = copy.deepcopy(lost_pods[0]) | {"status": {**lost_pods[0]["status"], "phase": "Failed"}}
    done_job, done_pods = runs.lost(slot(11), 5, finished=True)
    running_job, running_pods = runs.running(slot(16), 6)
    world = [(lost_job, lost_pods), (done_job, done_pods), (running_job, running_pods)]
    change = compute_change(world, None, now)
    status, known = change.status, change.runs.values()
    assert {r["job"]: r["outcome"] for r in status["recentRuns"]}[done_job["metadata"]["name"]] == "Lost"
    others = {done_job["metadata"]["name"]: done_pods, running_job["metadata"]["name"]: running_pods}
    assert workloads_to_stop(known, others) == []
    for pod in (terminating, ended):
        assert workloads_to_stop(known, {lost_job["metadata"]["name"]: [pod]}) == []


def test_a_lost_run_stays_lost_when_its_pod_is_gone_and_ends_with_the_job(runs: Runs) -> None:
    at = slot(10)
    job, pods = runs.lost(at, 4, finished=False)
    seen = compute([(job, pods)], None, at + timedelta(minutes=12))
    assert seen["lastRun"]["outcome"] == "Lost"

    # The pod was deleted (StopWorkload); the Job has not failed yet.
    gone = compute([(job, [])], seen, at + timedelta(minutes=13))
    assert gone["lastRun"] == seen["lastRun"]

    # The Job controller fails the Job: the run ends, still Lost, with the Job's end.
    end = at + timedelta(minutes=14)
    failed = copy.deepcopy(job)
    failed["status"] = {"startTime": job["status"]["startTime"], "failed": 1, "conditions":
                        k.failed_conditions("BackoffLimitExceeded", "Job has reached the specified "
                                            "backoff limit", end)}
    final = compute([(failed, [])], gone, at + timedelta(minutes=15))
    last = final["lastRun"]
    assert last["outcome"] == "Lost" and last["finishedAt"] == k.ts(end)
    assert last["reason"].startswith(seen["lastRun"]["reason"].removesuffix("; workload still running"))
    assert "; then Failed: BackoffLimitExceeded" in last["reason"]
    assert (last["holder"], last["fence"], last["startedAt"]) == (
        seen["lastRun"]["holder"], 4, seen["lastRun"]["startedAt"])
    assert final["runCounts"]["lost"] == 1 and final["runCounts"]["failed"] == 0


def test_pods_to_stop_follow_from_the_status_only_with_stop_workload(runs: Runs) -> None:
    job, pods = runs.lost(slot(10), 4, finished=False)
    now = slot(10) + timedelta(minutes=12)
    assert compute_change([(job, pods)], None, now).stop == ()  # onLost: Record
    gcj = put(the_gcj(), "spec.lease.onLost", "StopWorkload")
    change = compute_change([(job, pods)], None, now, gcj=gcj)
    assert [order.pod for order in change.stop] == [k.pod_name(job)]
    # A pass that changes nothing still names the pod (it may outlive the write that
    # showed the loss), with no transition to count or post.
    again = compute_change([(job, pods)], k.json_roundtrip(change.status), now + timedelta(minutes=1),
                           gcj=gcj)
    assert not again.changed and again.events == () and again.metrics.finished == ()
    assert again.stop == change.stop
