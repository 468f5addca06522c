"""Catch-up and backfill on real control planes: two clusters, one database, an operator
in each (under the chart's RBAC), process kubelets running the real guard and workload.

Both clusters act on the same past slots at the same time. Whatever the interleaving,
each slot's work is done exactly once in total: the attempts' guards claim the slot
(a slot run in one cluster is skipped in the other), and an attempt turned away because
the other cluster held the lease is tried again.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.status.times import epoch_minute, format_time
from tests.e2e.harness import (
    DSN_KEY,
    DSN_SECRET,
    EAST,
    WEST,
    Cluster,
    Scenario,
    WorkDb,
    guarded_cronjob,
    lock_of,
    workload_container,
)
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.test_operator import assert_no_refusals, create_gcj, status_of, wait_cronjob, wait_status
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

NAME = "ledger"
ITEMS = 2
# Each run is a pod of the process kubelet: seconds. A slot turned away waits 30 s for
# its retry, and a pass comes at least every 60 s; the machine may be loaded.
SETTLE_SECONDS = 900.0
# The keeper releases the lease when a run ends: without it a run's lease lasts its
# durationSeconds, and the next slot's attempt would find it held for that long.
LEASE = {"heartbeat": True, "durationSeconds": 30}


def annotate(cluster: Cluster, namespace: str, key: str, value: str) -> None:
    cluster.kubectl("annotate", contract.PLURAL, NAME, "-n", namespace, f"{key}={value}", "--overwrite")


def work_by_slot(db: WorkDb, lock: str) -> dict[int, list[Any]]:
    """The workload's fenced rows of `lock`, by the slot in their dedupe key."""
    rows: dict[int, list[Any]] = {}
    for row in db.work(lock):
        slot, _, _ = row.dedupe_key.partition(":")
        rows.setdefault(int(slot), []).append(row)
    return rows


def assert_never_twice(db: WorkDb, lock: str) -> Counter[int]:
    """No slot's work was done twice or under two fences; the guard's wins by slot."""
    assert db.duplicated_keys(lock) == {}
    for slot, rows in work_by_slot(db, lock).items():
        assert len({row.fence for row in rows}) == 1, f"slot {slot} ran under several fences: {rows}"
    won = Counter(run["slot"] for run in db.guard_runs(lock) if run["outcome"] != "skipped")
    assert all(count == 1 for count in won.values()), f"a slot was won twice: {won}"
    return won


def assert_each_slot_ran_once(db: WorkDb, lock: str, slots: list[int]) -> None:
    """Each of `slots` ran exactly once in total: all its work, one fence, one win."""
    won = assert_never_twice(db, lock)
    by_slot = work_by_slot(db, lock)
    for slot in slots:
        rows = by_slot.get(slot, [])
        keys = sorted(row.dedupe_key for row in rows)
        assert keys == [f"{slot}:{i}" for i in range(1, ITEMS + 1)], (slot, rows)  # items count from 1
        assert won[slot] == 1, (slot, won)


@pytest.mark.timeout(1200)
def test_a_backfill_in_two_clusters_at_once_runs_each_slot_once_in_total(
    operator_scenario: Scenario, clusters: dict[str, Cluster], operators: dict[str, OperatorProcess],
    e2e_db: WorkDb,
) -> None:
    both = [clusters[EAST], clusters[WEST]]
    namespace = operator_scenario.namespace("backfill", both)
    # Daily at 03:00 UTC: the schedule itself stays out of the way during the test.
    manifest = guarded_cronjob(NAME, namespace, schedule="0 3 * * *", lease=LEASE,
                               container=workload_container(items=ITEMS))
    for cluster in both:
        create_gcj(cluster, manifest)
        wait_cronjob(cluster, namespace, name=NAME)
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    since, until = midnight - timedelta(days=4), midnight
    slots = [epoch_minute(since + timedelta(days=d, hours=3)) for d in range(4)]
    value = f"b1:{format_time(since)}/{format_time(until)}"
    for cluster in both:
        annotate(cluster, namespace, contract.ANNOTATION_BACKFILL, value)

    finished = {cluster.name: wait_status(
        cluster, namespace, "the backfill completed",
        lambda s: (s.get("backfill") or {}).get("state") == "Completed", name=NAME,
        timeout=SETTLE_SECONDS)["backfill"] for cluster in both}

    assert_each_slot_ran_once(e2e_db, lock_of(manifest), slots)
    assert sorted(work_by_slot(e2e_db, lock_of(manifest))) == sorted(slots)  # and nothing else
    # Each cluster decided every slot: run by it, or skipped (run by the other).
    for progress in finished.values():
        assert progress["done"] + progress["skipped"] == len(slots), progress
        assert progress["remaining"] == 0 and progress["token"] == "b1"
    assert sum(progress["done"] for progress in finished.values()) == len(slots), finished
    # The Jobs are the operator's attempts, marked for the workload.
    for cluster in both:
        for job in cluster.jobs(namespace):
            assert contract.attempt_of(job["metadata"]["name"]) is not None, job["metadata"]["name"]
            assert job["metadata"]["annotations"][contract.ANNOTATION_RUN_KIND] == contract.RUN_KIND_BACKFILL
    assert_no_refusals(operators)


@pytest.mark.timeout(1200)
def test_slots_missed_while_the_database_was_unreachable_are_made_up_once_in_total(
    operator_scenario: Scenario, clusters: dict[str, Cluster], operators: dict[str, OperatorProcess],
    e2e_db: WorkDb,
) -> None:
    """Every minute in both clusters; the guards cannot reach the database until a slot's
    runs ended GuardError in both (the slot is missed), then can again: both operators
    make the missed slot up at once, beside the schedule's own runs."""
    both = [clusters[EAST], clusters[WEST]]
    namespace = operator_scenario.namespace("catchup", both)
    unreachable = "postgresql://nobody@127.0.0.1:9/nowhere?connect_timeout=2"
    for cluster in both:
        set_secret(cluster, namespace, unreachable)
    manifest = guarded_cronjob(NAME, namespace, lease=LEASE, container=workload_container(items=ITEMS), spec={
        "startingDeadlineSeconds": 10, "missedRunToleranceSeconds": 0,
        "catchUp": {"policy": "All", "windowSeconds": 3600, "maxRuns": 10}})
    for cluster in both:
        create_gcj(cluster, manifest)
        wait_cronjob(cluster, namespace, name=NAME)

    def guard_errors(cluster: Cluster) -> set[int]:
        runs = status_of(cluster, namespace, NAME).get("recentRuns") or []
        return {run["slot"] for run in runs if run["outcome"] == "GuardError" and "slot" in run}

    missed = wait_for("a slot ended GuardError in both clusters",
                      lambda: guard_errors(clusters[EAST]) & guard_errors(clusters[WEST]), 180.0)
    for cluster in both:
        set_secret(cluster, namespace, cluster.dsn)

    lock = lock_of(manifest)

    def made_up() -> bool:
        slots_with_work = set(work_by_slot(e2e_db, lock))
        return set(missed) <= slots_with_work

    try:
        wait_for("the missed slots are made up", made_up, SETTLE_SECONDS)
    except AssertionError as error:
        # What each operator saw and decided: its status, and the Jobs it made.
        seen = {cluster.name: {"status": status_of(cluster, namespace, NAME),
                               "jobs": sorted(job["metadata"]["name"] for job in cluster.jobs(namespace))}
                for cluster in both}
        raise AssertionError(f"{error}; missed {sorted(missed)}, work {sorted(work_by_slot(e2e_db, lock))}, "
                             f"clusters {seen}") from None
    # Let attempts still in flight (the other cluster's) finish before counting.
    for cluster in both:
        wait_status(cluster, namespace, "no run active", lambda s: all(
            "finishedAt" in run for run in s.get("recentRuns") or []), name=NAME, timeout=120.0)
    assert_each_slot_ran_once(e2e_db, lock, sorted(missed))
    assert_never_twice(e2e_db, lock)  # the schedule's own slots too
    kinds = {job["metadata"]["annotations"].get(contract.ANNOTATION_RUN_KIND)
             for cluster in both for job in cluster.jobs(namespace)}
    assert contract.RUN_KIND_CATCH_UP in kinds
    assert_no_refusals(operators)


def set_secret(cluster: Cluster, namespace: str, dsn: str) -> None:
    manifest = cluster.kubectl("create", "secret", "generic", DSN_SECRET, "-n", namespace,
                               f"--from-literal={DSN_KEY}={dsn}", "--dry-run=client", "-o", "yaml")
    cluster.kubectl("apply", "-f", "-", input=manifest.stdout)


@pytest.mark.timeout(900)
def test_failed_runs_in_a_row_suspend_the_cronjob_until_a_resume_token(
    operator_scenario: Scenario, clusters: dict[str, Cluster], operators: dict[str, OperatorProcess],
) -> None:
    """A workload that fails every minute: after two failed runs the operator suspends the
    CronJob (the controller then starts nothing), never the GuardedCronJob's spec; a
    resume token lifts it."""
    east = clusters[EAST]
    namespace = operator_scenario.namespace("failing", [east])
    failing = workload_container(items=ITEMS)
    failing["args"] = [*failing["args"], "--items", "not-a-number"]  # the workload exits 2
    manifest = guarded_cronjob(NAME, namespace, lease=LEASE, container=failing,
                               spec={"suspendAfterFailures": 2})
    create_gcj(east, manifest)
    wait_cronjob(east, namespace, name=NAME)

    status = wait_status(east, namespace, "suspended after failures",
                         lambda s: (s.get("failures") or {}).get("suspended") is True, name=NAME,
                         timeout=300.0)
    failed = status["failures"]["failedRuns"]
    assert len(failed) == 2
    assert all(run_outcome(status, job) == "Failed" for job in failed), status["recentRuns"]
    cronjob = east.get(f"/apis/batch/v1/namespaces/{namespace}/cronjobs/{NAME}") or {}
    assert cronjob["spec"]["suspend"] is True
    gcj = east.get(f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/"
                   f"{contract.PLURAL}/{NAME}") or {}
    assert gcj["spec"].get("suspend") is False  # the spec is never written
    [suspended] = [c for c in status["conditions"] if c["type"] == "Suspended"]
    assert suspended["status"] == "True" and suspended["reason"] == "RepeatedFailures"
    assert all(job in suspended["message"] for job in failed)

    annotate(east, namespace, contract.ANNOTATION_RESUME, "r1")
    wait_for("the CronJob is resumed", lambda: (east.get(
        f"/apis/batch/v1/namespaces/{namespace}/cronjobs/{NAME}") or {}).get("spec", {}).get("suspend")
        is False, 60.0)
    status = wait_status(east, namespace, "resumed", lambda s: (s.get("failures") or {}).get(
        "lastResumeToken") == "r1", name=NAME)
    assert (status["failures"].get("suspended") or False) is False
    assert_no_refusals(operators)


def run_outcome(status: dict[str, Any], job: str) -> str | None:
    for run in status.get("recentRuns") or []:
        if run.get("job") == job:
            return str(run["outcome"])
    return None
