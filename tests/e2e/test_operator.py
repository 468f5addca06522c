"""The operator end to end: a GuardedCronJob in, a guarded CronJob and run status out.

The operator runs as a subprocess with the chart's RBAC (tests/e2e/operator_process.py),
one per cluster; everything else is as in test_two_clusters.py. Each test checks at
the end that the API server refused the operator nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from tests.e2e.harness import (
    EAST,
    FAILURE_LOGS,
    Cluster,
    Scenario,
    first_difference,
    guarded_cronjob,
    job_condition,
    lock_of,
    termination_json,
    wait_for,
    workload_container,
)
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.workload import dedupe_key_for

pytestmark = pytest.mark.e2e

NAME = "nightly"
STATUS_TIMEOUT = 60.0


def gcj_path(namespace: str, name: str = NAME) -> str:
    return (f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/"
            f"{contract.PLURAL}/{name}")


def cronjob_path(namespace: str, name: str = NAME) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/cronjobs/{name}"


def status_of(cluster: Cluster, namespace: str, name: str = NAME) -> dict[str, Any]:
    gcj = cluster.get(gcj_path(namespace, name))
    assert gcj is not None, f"GuardedCronJob {namespace}/{name} is gone from {cluster.name}"
    return dict(gcj.get("status") or {})


def wait_status(cluster: Cluster, namespace: str, what: str,
                check: Callable[[dict[str, Any]], bool], name: str = NAME,
                timeout: float = STATUS_TIMEOUT) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        status = status_of(cluster, namespace, name)
        return status if check(status) else None

    try:
        return wait_for(f"status of {namespace}/{name} in {cluster.name}: {what}", ready, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {status_of(cluster, namespace, name)}") from None


def run_in_status(status: Mapping[str, Any], job: str) -> dict[str, Any] | None:
    for run in status.get("recentRuns") or []:
        if run.get("job") == job:
            return dict(run)
    return None


def final_run(job: str, outcome: str) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        run = run_in_status(status, job)
        return run is not None and run["outcome"] == outcome and "finishedAt" in run

    return check


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    for item in status.get("conditions") or []:
        if item["type"] == kind:
            return dict(item)
    raise AssertionError(f"no {kind} condition in {status.get('conditions')}")


def create_gcj(cluster: Cluster, gcj: Mapping[str, Any]) -> dict[str, Any]:
    cluster.apply(gcj)
    meta = gcj["metadata"]
    created = cluster.get(gcj_path(meta["namespace"], meta["name"]))
    assert created is not None
    return created


def wait_cronjob(cluster: Cluster, namespace: str, *, not_uid: str | None = None,
                 name: str = NAME) -> dict[str, Any]:
    def present() -> dict[str, Any] | None:
        found = cluster.get(cronjob_path(namespace, name))
        if found is None or (not_uid is not None and found["metadata"]["uid"] == not_uid):
            return None
        return found

    return wait_for(f"the operator applies CronJob {namespace}/{name} in {cluster.name}",
                    present, STATUS_TIMEOUT)


def assert_no_refusals(operators: Mapping[str, OperatorProcess]) -> None:
    for name, process in operators.items():
        assert process.running(), f"the operator of {name} is not running"
        assert process.refusals() == [], f"the API server refused the operator of {name}"


# --- the CRD ----------------------------------------------------------------------------


def test_crd_is_established_and_serves_status(
    clusters: dict[str, Cluster], operators: dict[str, OperatorProcess]
) -> None:
    for cluster in clusters.values():
        crd = cluster.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                          f"{contract.PLURAL}.{contract.API_GROUP}")
        assert crd is not None
        established = [c for c in crd["status"]["conditions"] if c["type"] == "Established"]
        assert established and established[0]["status"] == "True"
        [version] = [v for v in crd["spec"]["versions"] if v["name"] == contract.API_VERSION]
        assert version["served"] and version["storage"]
        assert "status" in version.get("subresources", {})
        assert crd["spec"]["names"]["kind"] == contract.KIND


def test_a_permission_missing_from_the_chart_is_noticed(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess], tmp_path: Path,
) -> None:
    """The RBAC check every test ends with can fail: the chart's rules without `patch` on
    guardedcronjobs/status, and the status write is refused in the API server's words."""
    east = clusters[EAST]
    namespace = operator_scenario.namespace("narrow", [east])
    narrow = OperatorProcess(east, tmp_path, release="guardedcron-narrow",
                             without=("guardedcronjobs/status", "patch"))
    narrow.install()
    entry = ("narrowed operator (log tail)", narrow.log_tail)
    FAILURE_LOGS.append(entry)
    operators[EAST].stop()  # one operator per cluster, as the chart runs it
    try:
        narrow.start()
        create_gcj(east, guarded_cronjob(NAME, namespace, spec={"suspend": True}))
        wait_cronjob(east, namespace)  # its other grants are intact
        denied = wait_for("the narrowed operator is refused its status write", narrow.refusals,
                          STATUS_TIMEOUT)
        assert 'cannot patch resource "guardedcronjobs/status"' in denied[0], denied
        assert status_of(east, namespace) == {}
    finally:
        narrow.stop()
        FAILURE_LOGS.remove(entry)
        operators[EAST].start()
    wait_status(east, namespace, "written by the chart's operator", lambda s: bool(s))
    assert_no_refusals(operators)


# --- one cluster: GuardedCronJob -> CronJob -> run -> status -------------------------------


def test_guarded_cronjob_becomes_its_cronjob_and_runs_report_status(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess],
) -> None:
    east = clusters[EAST]
    namespace = operator_scenario.namespace("flow", [east])
    # A lease name that looks like a variable reference reaches the guard as written.
    manifest = guarded_cronjob(NAME, namespace, spec={"suspend": True}, lease={
        "heartbeat": True, "name": "$(HOSTNAME)-lock"})  # the lock: <namespace>/$(HOSTNAME)-lock
    gcj = create_gcj(east, manifest)

    cronjob = wait_cronjob(east, namespace)
    # The operator applied exactly what `guardedcron render` prints for the live object.
    # (The API server adds defaults, so every rendered field must be there, not only them.)
    rendered = east.render(gcj)
    assert first_difference(rendered["spec"], cronjob["spec"], "spec") is None
    assert first_difference(rendered["metadata"], cronjob["metadata"], "metadata") is None
    assert cronjob["metadata"]["labels"] == rendered["metadata"]["labels"]
    assert cronjob["metadata"]["annotations"][contract.ANNOTATION_LOCK] == lock_of(manifest)
    [owner] = cronjob["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
                     "kind": contract.KIND, "name": NAME, "uid": gcj["metadata"]["uid"],
                     "controller": True, "blockOwnerDeletion": True}
    job_spec = cronjob["spec"]["jobTemplate"]["spec"]
    assert job_spec["backoffLimit"] == 0
    assert job_spec["podReplacementPolicy"] == "Failed"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    status = wait_status(east, namespace, "Ready", lambda s: any(
        c["type"] == "Ready" and c["status"] == "True" for c in s.get("conditions") or []))
    assert status["cronJobRef"] == {"name": NAME}
    assert status["observedGeneration"] == gcj["metadata"]["generation"]

    east.create_job_from(namespace, NAME, "by-hand")
    job = east.wait_job_finished(namespace, "by-hand")
    assert job_condition(job, "Complete")["status"] == "True"
    lease = operator_scenario.db.lease(lock_of(manifest))
    assert lease is not None, f"no lease row named {lock_of(manifest)!r}"
    status = wait_status(east, namespace, "by-hand Succeeded", final_run("by-hand", "Succeeded"))
    run = run_in_status(status, "by-hand")
    assert run is not None
    assert run["manual"] is True
    assert run["fence"] == lease["fence"]
    assert run["holder"].startswith(f"{EAST}/{namespace}/by-hand-")
    assert status["lastRun"]["job"] == "by-hand"
    assert status["runCounts"]["succeeded"] == 1
    rows = operator_scenario.db.work(lock_of(manifest))
    assert [(r.dedupe_key, r.fence) for r in rows] == [
        (dedupe_key_for(None, "by-hand", item), lease["fence"]) for item in (1, 2, 3)]
    assert_no_refusals(operators)


# --- two clusters, one database, with status -------------------------------------------


# --- drift and deletion -------------------------------------------------------------------


def test_cronjob_edited_or_deleted_by_hand_is_restored_and_children_are_collected(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess],
) -> None:
    east = clusters[EAST]
    namespace = operator_scenario.namespace("drift", [east])
    manifest = guarded_cronjob(NAME, namespace, schedule="17 3 * * *",
                               lease={"heartbeat": True})
    create_gcj(east, manifest)
    original = wait_cronjob(east, namespace)
    uid = original["metadata"]["uid"]

    # Edited by hand: fields guardedcron sets, then the guard removed (with the failure
    # policy naming it: the API server refuses a policy naming a missing container).
    east.kubectl("patch", "cronjob", NAME, "-n", namespace, "--type=merge",
                 "-p", '{"spec": {"schedule": "* * * * *", "concurrencyPolicy": "Allow"}}')
    east.kubectl("patch", "cronjob", NAME, "-n", namespace, "--type=json", "-p", json.dumps([
        {"op": "remove", "path": "/spec/jobTemplate/spec/podFailurePolicy"},
        {"op": "remove", "path": "/spec/jobTemplate/spec/template/spec/initContainers/0"},
    ]))

    def restored() -> dict[str, Any] | None:
        live = east.get(cronjob_path(namespace))
        if live is None or live["spec"]["schedule"] != "17 3 * * *":
            return None
        if live["spec"]["concurrencyPolicy"] != "Forbid":
            return None
        init = live["spec"]["jobTemplate"]["spec"]["template"]["spec"].get("initContainers")
        if not init or init[0]["name"] != contract.GUARD_CONTAINER:
            return None
        if "podFailurePolicy" not in live["spec"]["jobTemplate"]["spec"]:
            return None
        return live

    repaired = wait_for("the operator restores the edited CronJob", restored, STATUS_TIMEOUT)
    assert repaired["metadata"]["uid"] == uid
    assert repaired["spec"]["jobTemplate"] == original["spec"]["jobTemplate"]

    # Deleted by hand: created again.
    east.kubectl("delete", "cronjob", NAME, "-n", namespace)
    recreated = wait_cronjob(east, namespace, not_uid=uid)
    assert recreated["spec"]["jobTemplate"] == original["spec"]["jobTemplate"]

    # A run, so there are Jobs and Pods to collect too.
    east.create_job_from(namespace, NAME, "before-delete")
    east.wait_job_finished(namespace, "before-delete")
    assert east.pods_of(namespace, "before-delete")

    east.kubectl("delete", contract.PLURAL, NAME, "-n", namespace)

    def collected() -> bool:
        return (east.get(cronjob_path(namespace)) is None
                and not east.jobs(namespace)
                and not east.pods_of(namespace, "before-delete"))

    wait_for("the garbage collector deletes the CronJob, its Jobs and Pods", collected,
             STATUS_TIMEOUT)
    assert_no_refusals(operators)


# --- the operator dies mid-run ------------------------------------------------------------


def test_operator_killed_mid_run_converges_after_restart(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess],
) -> None:
    east = clusters[EAST]
    operator = operators[EAST]
    namespace = operator_scenario.namespace("restart", [east])
    manifest = guarded_cronjob(NAME, namespace, lease={"heartbeat": True},
                               spec={"suspend": True},
                               container=workload_container(gate=True))
    create_gcj(east, manifest)
    cronjob_uid = wait_cronjob(east, namespace)["metadata"]["uid"]
    lock = lock_of(manifest)

    east.create_job_from(namespace, NAME, "mid-run")
    wait_for("the workload writes its first item",
             lambda: operator_scenario.db.work(lock), STATUS_TIMEOUT)
    wait_status(east, namespace, "mid-run Running", lambda s: (
        (run_in_status(s, "mid-run") or {}).get("outcome") == "Running"))

    operator.kill()
    operator_scenario.db.open_gate("mid-run")
    east.wait_job_finished(namespace, "mid-run")
    assert run_in_status(status_of(east, namespace), "mid-run")["outcome"] == "Running"  # type: ignore[index]

    operator.start()
    status = wait_status(east, namespace, "mid-run Succeeded after the restart",
                         final_run("mid-run", "Succeeded"))
    assert status["runCounts"]["succeeded"] == 1
    assert [r["job"] for r in status["recentRuns"]] == ["mid-run"]
    live = east.get(cronjob_path(namespace))
    assert live is not None and live["metadata"]["uid"] == cronjob_uid
    assert [j["metadata"]["name"] for j in east.jobs(namespace)] == ["mid-run"]
    rows = operator_scenario.db.work(lock)
    assert sorted(r.dedupe_key for r in rows) == [
        dedupe_key_for(None, "mid-run", item) for item in (1, 2, 3)]
    assert_no_refusals(operators)


# --- lease takeover -----------------------------------------------------------------------


def test_lease_taken_over_during_a_run_refuses_the_stale_write(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess],
) -> None:
    """No keeper, a lease barely longer than the deadline, and a workload that ignores
    SIGTERM: the Job controller ends the run at its deadline, but the process carries on
    in its grace period past the lease. A second run takes the lease over with a higher
    fence; the first one's next fenced write is refused."""
    east = clusters[EAST]
    namespace = operator_scenario.namespace("takeover", [east])
    manifest = guarded_cronjob(
        NAME, namespace, spec={"suspend": True, "activeDeadlineSeconds": 8},
        lease={"durationSeconds": 10, "heartbeat": False},
        container=workload_container(gate=True, ignore_sigterm=True),
        pod_spec={"terminationGracePeriodSeconds": 30},
    )
    create_gcj(east, manifest)
    wait_cronjob(east, namespace)
    lock = lock_of(manifest)
    db = operator_scenario.db

    east.create_job_from(namespace, NAME, "first")
    [first_row] = wait_for("the first run writes its first item", lambda: db.work(lock),
                           STATUS_TIMEOUT)
    first_fence = first_row.fence
    # The Job controller gives up at the deadline (FailureTarget) and deletes the pod;
    # Failed follows only once the pod is gone, after the grace period.
    wait_for("the first run reaches its deadline", lambda: any(
        c["type"] == "FailureTarget" and c["reason"] == "DeadlineExceeded"
        for c in ((east.job(namespace, "first") or {}).get("status") or {}).get("conditions")
        or []), timeout=30)
    wait_for("the first run's lease runs out",
             lambda: (db.lease(lock) or {}).get("expired"), timeout=30)

    db.open_gate("second")  # the second run does not stall
    east.create_job_from(namespace, NAME, "second")
    second = east.wait_job_finished(namespace, "second")
    assert job_condition(second, "Complete")["status"] == "True"
    second_lease = termination_json(east.pod_of(namespace, "second"), contract.GUARD_CONTAINER)
    assert second_lease["fence"] > first_fence

    db.open_gate("first")  # the stale holder wakes up and tries its next write
    [refused] = wait_for("the first run's next fenced write is refused",
                         lambda: db.rejections(lock), timeout=30)
    holder, fence, job, item, reason = refused
    assert (job, fence, item) == ("first", first_fence, 2)
    assert holder == first_row.holder
    rows = db.work(lock)
    assert [(r.job, r.fence) for r in rows if r.job == "first"] == [("first", first_fence)]
    assert {(r.job, r.fence) for r in rows if r.job == "second"} == {
        ("second", second_lease["fence"])}
    assert reason, "the refusal carries the database's reason"
    first = east.wait_job_finished(namespace, "first")
    assert job_condition(first, "Failed")["reason"] == "DeadlineExceeded"

    status = wait_status(east, namespace, "both runs final", lambda s: (
        final_run("first", "TimedOut")(s) and final_run("second", "Succeeded")(s)))
    first_run = run_in_status(status, "first")
    second_run = run_in_status(status, "second")
    assert first_run is not None and second_run is not None
    assert first_run["fence"] == first_fence
    assert second_run["fence"] == second_lease["fence"] > first_run["fence"]
    assert second_run["holder"] != first_run["holder"]
    # The first run's pod outlived its lease: the status says the two held the lock at once.
    overlap = condition(status, "Overlap")
    assert overlap["status"] == "True", overlap
    assert f"run second (fence {second_run['fence']})" in overlap["message"], overlap
    assert f"run first (fence {first_fence})" in overlap["message"], overlap
    history = {r["fence"]: r["outcome"] for r in db.guard_runs(lock) if r["fence"]}
    assert history[first_fence] == "abandoned", history
    assert_no_refusals(operators)
