"""Two clusters, one database: every scheduled slot runs once, however many clusters fire it.

No operator here: the CronJob is what `guardedcron render` prints (exactly what the
operator applies), applied with kubectl. What runs is all real but the kubelet: the
CronJob controller fires the slot in both clusters, the Job controller creates the
pods and reads the guard's exit code through the podFailurePolicy, the guard runs
`guardedcron acquire` against PostgreSQL, and the workload writes fenced rows.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.builders import SKIP_RULE_INDEX
from tests.e2e.harness import (
    EAST,
    WEST,
    WORKLOAD_CONTAINER,
    Cluster,
    Scenario,
    current_slot,
    guarded_cronjob,
    job_condition,
    lock_of,
    slot_job_name,
    terminated,
    termination_json,
    wait_for,
)
from tests.e2e.workload import dedupe_key_for

pytestmark = pytest.mark.e2e

ITEMS = 3
NAME = "billing"


def holder_env(cronjob: dict[str, Any]) -> str:
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [guard] = [c for c in pod["initContainers"] if c["name"] == contract.GUARD_CONTAINER]
    [holder] = [e["value"] for e in guard["env"] if e["name"] == "GUARDEDCRON_HOLDER"]
    return str(holder)


def settle_slot(clusters: list[Cluster], namespace: str, job: str) -> tuple[str, dict[str, Any]]:
    """Wait for `job` to finish in every cluster; exactly one ran. Returns the winner's
    cluster name and the guard's answer in its pod."""
    finished = {c.name: c.wait_job_finished(namespace, job) for c in clusters}
    outcome = {name: _finished_as(j) for name, j in finished.items()}
    winners = [name for name, kind in outcome.items() if kind == "Complete"]
    assert len(winners) == 1, f"slot job {job}: expected one Complete, got {outcome}"
    [winner] = winners
    by_name = {c.name: c for c in clusters}
    won = termination_json(by_name[winner].pod_of(namespace, job), contract.GUARD_CONTAINER)
    assert won["outcome"] == "acquired", won
    assert won["holder"].startswith(f"{winner}/{namespace}/{job}-"), won

    for loser in (name for name in outcome if name != winner):
        job_obj = finished[loser]
        failed = job_condition(job_obj, "Failed")
        # The Job controller's own reading of the guard's exit 75: rule 0 of our policy.
        assert failed["reason"] == "PodFailurePolicy", failed
        assert f"matching FailJob rule at index {SKIP_RULE_INDEX}" in failed["message"], failed
        pod = by_name[loser].pod_of(namespace, job)
        guard = terminated(pod, contract.GUARD_CONTAINER)
        assert guard["exitCode"] == contract.EXIT_NOT_ACQUIRED, guard
        skipped = termination_json(pod, contract.GUARD_CONTAINER)
        assert skipped["outcome"] == "skipped", skipped
        assert skipped["holder"] == won["holder"], (skipped, won)
        assert skipped["requester"].startswith(f"{loser}/"), skipped
        # The workload never started in the skipped pod.
        [work] = [s for s in pod["status"]["containerStatuses"] if s["name"] == WORKLOAD_CONTAINER]
        assert "terminated" not in work["state"] and "running" not in work["state"], work
    return winner, won


def _finished_as(job: dict[str, Any]) -> str:
    for condition in job["status"]["conditions"]:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return str(condition["type"])
    raise AssertionError(f"job {job['metadata']['name']} has not finished")


def at_once(*calls: Any) -> None:
    """Run the callables in parallel threads (two clusters firing the same minute)."""
    errors: list[BaseException] = []

    def run(call: Any) -> None:
        try:
            call()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_each_slot_runs_once_across_two_clusters(
    scenario: Scenario, clusters: dict[str, Cluster]
) -> None:
    both = [clusters[EAST], clusters[WEST]]
    namespace = scenario.namespace("twin", both)
    # The keeper releases the lease when a run ends, so the next slot need not wait it out.
    gcj = guarded_cronjob(NAME, namespace, lease={"heartbeat": True})
    lock = lock_of(gcj)

    # Apply both well inside one minute, so both CronJobs first fire the same slot.
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)
    for cluster in both:
        cronjob = cluster.render(gcj)
        assert holder_env(cronjob).startswith(f"{cluster.name}/")
        cluster.apply(cronjob)
    applied_at = current_slot()

    # 1. The CronJob controllers' own firing: the first minute after the apply.
    scheduled = slot_job_name(NAME, applied_at + 1)
    for cluster in both:
        wait_for(f"the cronjob controller of {cluster.name} creates {scheduled}",
                 lambda c=cluster: c.job(namespace, scheduled), timeout=100, interval=1)
    for cluster in both:
        cluster.kubectl("patch", "cronjob", NAME, "-n", namespace, "--type=merge",
                        "-p", '{"spec": {"suspend": true}}')
    job = both[0].job(namespace, scheduled)
    assert job is not None
    annotations = job["metadata"].get("annotations") or {}
    assert contract.ANNOTATION_SCHEDULED_TIMESTAMP in annotations
    winners = [settle_slot(both, namespace, scheduled)[0]]

    # 2. More slots, fired in both clusters at once (Jobs named as the controller names
    #    them, so the guard derives the same slot); earlier minutes nobody fired yet.
    slots = [applied_at - 10 - i for i in range(3)]
    for slot in slots:
        job_name = slot_job_name(NAME, slot)
        at_once(*(lambda c=c, j=job_name: c.create_job_from(namespace, NAME, j) for c in both))
        winners.append(settle_slot(both, namespace, job_name)[0])

    # 3. A slot fired late in the second cluster, after the first finished and released
    #    the lease: the slot claim alone refuses it.
    late = slot_job_name(NAME, applied_at - 20)
    clusters[EAST].create_job_from(namespace, NAME, late)
    clusters[EAST].wait_job_finished(namespace, late)
    clusters[WEST].create_job_from(namespace, NAME, late)
    winner, _ = settle_slot(both, namespace, late)
    assert winner == EAST
    west_pod = clusters[WEST].pod_of(namespace, late)
    assert termination_json(west_pod, contract.GUARD_CONTAINER)["reason"] == "slot-claimed"

    # Every slot's items were written once, all by the winner; none twice.
    all_slots = [applied_at + 1, *slots, applied_at - 20]
    rows = scenario.db.work(lock)
    assert scenario.db.duplicated_keys(lock) == {}
    assert sorted(r.dedupe_key for r in rows) == sorted(
        dedupe_key_for(slot, None, item) for slot in all_slots for item in range(1, ITEMS + 1))
    # The guard's history agrees: per slot one run that held the lease, one skipped.
    history = scenario.db.guard_runs(lock)
    for slot in all_slots:
        outcomes = sorted(r["outcome"] for r in history if r["slot"] == slot)
        assert outcomes == ["finished", "skipped"], (slot, outcomes)
    print(f"slot winners: {[*winners, winner]}")
