"""Locks belong to namespaces (issue 11), on the real control plane.

Admission refuses a lease.name that names another namespace's lock (the CRD's CEL
rule); the operator, run as the chart runs it with an allow-list (chart value
sharedLocks), refuses a shared lock to a namespace the list does not name (Invalid, an
Event, no CronJob), lets the two namespaces it names share one lock (a run in one
makes the other's run skip), and deletes a CronJob, Jobs and all, once the list no
longer names its namespace. The two-clusters scenario (test_two_clusters.py) still
shares its lock through the same namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from guardedcron import contract
from guardedcron.builders import locks_in_cronjob
from guardedcron.spec.locks import shared_lock
from guardedcron.spec.settings import CHART_VALUE_SHARED_LOCKS, ENV_SHARED_LOCKS
from tests.e2e.harness import (
    EAST,
    FAILURE_LOGS,
    Cluster,
    Scenario,
    guarded_cronjob,
    job_condition,
    lock_of,
    terminated,
    termination_json,
    wait_for,
    workload_container,
)
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

NAME = "close"
TIMEOUT = 60.0
_RUN = uuid.uuid4().hex[:5]
FINANCE, BILLING, SANDBOX = (f"tenant-{team}-{_RUN}" for team in ("finance", "billing", "sandbox"))
SHARED = f"ledger-close-{_RUN}"


def allow_list(*namespaces: str) -> dict[str, str]:
    """The chart's --set values granting SHARED to `namespaces`."""
    return {f"{CHART_VALUE_SHARED_LOCKS}[0].name": SHARED,
            f"{CHART_VALUE_SHARED_LOCKS}[0].namespaces": "{" + ",".join(namespaces) + "}"}


class TenancyOperator:
    """The east cluster's operator, run with an allow-list instead of the session's one;
    the session's operator is stopped meanwhile and restarted afterwards."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.process: OperatorProcess | None = None
        self.starts = 0
        self.logs: list[tuple[str, Any]] = []

    def run_with(self, values: Mapping[str, str]) -> OperatorProcess:
        self.stop()
        self.starts += 1
        process = OperatorProcess(self.cluster, self.workdir / f"start-{self.starts}",
                                  values=values)
        process.workdir.mkdir(parents=True)
        entry = (f"tenancy operator {self.starts} (log tail)", process.log_tail)
        FAILURE_LOGS.append(entry)
        self.logs.append(entry)
        assert process.chart_env[ENV_SHARED_LOCKS].startswith("[{"), process.chart_env
        process.install()
        process.start()
        self.process = process
        return process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@pytest.fixture(scope="module")
def tenancy_operator(clusters: dict[str, Cluster], operators: dict[str, OperatorProcess],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenancyOperator]:
    session_operator = operators[EAST]
    session_operator.stop()
    tenancy = TenancyOperator(clusters[EAST], tmp_path_factory.mktemp("tenancy-operator"))
    try:
        tenancy.run_with(allow_list(FINANCE, BILLING))
        yield tenancy
    finally:
        tenancy.stop()
        for entry in tenancy.logs:
            FAILURE_LOGS.remove(entry)
        session_operator.start()


def gcj_path(namespace: str, name: str = NAME) -> str:
    return (f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/"
            f"{contract.PLURAL}/{name}")


def cronjob_path(namespace: str, name: str = NAME) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/cronjobs/{name}"


def shared_gcj(namespace: str, name: str = NAME) -> dict[str, Any]:
    return guarded_cronjob(name, namespace, spec={"suspend": True},
                           lease={"sharedLock": SHARED, "heartbeat": True, "durationSeconds": 30},
                           container=workload_container(gate=True))


def condition(cluster: Cluster, namespace: str, kind: str, name: str = NAME
              ) -> dict[str, Any] | None:
    gcj = cluster.get(gcj_path(namespace, name)) or {}
    for item in (gcj.get("status") or {}).get("conditions") or []:
        if item["type"] == kind and item.get("observedGeneration") == gcj["metadata"]["generation"]:
            return dict(item)
    return None


def wait_cronjob(cluster: Cluster, namespace: str, name: str = NAME) -> dict[str, Any]:
    return wait_for(f"the operator applies CronJob {namespace}/{name}",
                    lambda: cluster.get(cronjob_path(namespace, name)), TIMEOUT)


def lock_events(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.api.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["reason"] == "LockNotAllowed"]


def test_a_lease_name_naming_another_namespaces_lock_is_refused_at_admission(
    scenario: Scenario, clusters: dict[str, Cluster], operators: dict[str, OperatorProcess],
) -> None:
    east = clusters[EAST]  # the CRD is applied by the `operators` fixture
    namespace = scenario.namespace("intruder", [east])
    for name in (f"{BILLING}/{NAME}", f"{contract.SHARED_LOCK_PREFIX}{SHARED}"):
        manifest = guarded_cronjob(NAME, namespace, lease={"name": name})
        refused = east.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
        assert refused.returncode != 0, f"the API server admitted lease.name {name!r}"
        assert "lease.name must not contain '/', ':' or control characters" in refused.stderr
        assert east.get(gcj_path(namespace)) is None


def test_a_namespace_not_on_the_allow_list_gets_invalid_an_event_and_no_cronjob(
    scenario: Scenario, clusters: dict[str, Cluster], tenancy_operator: TenancyOperator,
) -> None:
    east = clusters[EAST]
    namespace = scenario.namespace(SANDBOX, [east], exact=True)
    east.apply(shared_gcj(namespace))

    invalid = wait_for("the operator reports the GuardedCronJob Invalid",
                       lambda: condition(east, namespace, "Invalid"), TIMEOUT)
    assert invalid["status"] == "True", invalid
    assert invalid["message"].startswith(
        f"spec.lease.sharedLock: namespace {namespace} may not use shared lock {SHARED!r}")
    assert ENV_SHARED_LOCKS in invalid["message"] and CHART_VALUE_SHARED_LOCKS in invalid["message"]
    ready = condition(east, namespace, "Ready")
    assert ready is not None and ready["status"] == "False", ready
    [event] = wait_for("the LockNotAllowed Event", lambda: lock_events(east, namespace), TIMEOUT)
    assert event["type"] == "Warning" and ENV_SHARED_LOCKS in event["message"]
    assert east.get(cronjob_path(namespace)) is None
    assert tenancy_operator.process is not None and tenancy_operator.process.refusals() == []


def test_the_allow_listed_namespaces_share_one_lock(
    scenario: Scenario, clusters: dict[str, Cluster], tenancy_operator: TenancyOperator,
) -> None:
    east = clusters[EAST]
    finance = scenario.namespace(FINANCE, [east], exact=True)
    billing = scenario.namespace(BILLING, [east], exact=True)
    lock = shared_lock(SHARED)
    for namespace in (finance, billing):
        manifest = shared_gcj(namespace)
        assert lock_of(manifest) == lock
        east.apply(manifest)
    cronjobs = {ns: wait_cronjob(east, ns) for ns in (finance, billing)}
    for namespace, cronjob in cronjobs.items():
        assert cronjob["metadata"]["annotations"][contract.ANNOTATION_LOCK] == lock, namespace
        assert locks_in_cronjob(cronjob) == {lock}, namespace

    # A run in finance holds the shared lock (its workload waits at a gate) ...
    db = scenario.db
    east.create_job_from(finance, NAME, "finance-run")
    held = wait_for("the finance run holds the shared lock",
                    lambda: (db.lease(lock) or {}).get("holder", "").startswith(
                        f"{EAST}/{finance}/") and db.lease(lock), TIMEOUT)
    # ... so billing's run, on the same lock, is skipped and names finance's holder.
    east.create_job_from(billing, NAME, "billing-run")
    skipped = east.wait_job_finished(billing, "billing-run")
    assert job_condition(skipped, "Failed")["reason"] == "PodFailurePolicy"
    pod = east.pod_of(billing, "billing-run")
    assert terminated(pod, contract.GUARD_CONTAINER)["exitCode"] == contract.EXIT_NOT_ACQUIRED
    answer = termination_json(pod, contract.GUARD_CONTAINER)
    assert (answer["outcome"], answer["lock"], answer["holder"]) == ("skipped", lock, held["holder"])

    db.open_gate("finance-run")
    done = east.wait_job_finished(finance, "finance-run")
    assert job_condition(done, "Complete")["status"] == "True"
    assert {row.job for row in db.work(lock)} == {"finance-run"}
    assert tenancy_operator.process is not None and tenancy_operator.process.refusals() == []


def test_taking_a_namespace_off_the_allow_list_deletes_its_cronjob_and_jobs(
    scenario: Scenario, clusters: dict[str, Cluster], tenancy_operator: TenancyOperator,
) -> None:
    east = clusters[EAST]
    billing = scenario.namespace(f"{BILLING}-x", [east], exact=True)
    name = "narrowed"
    tenancy_operator.run_with(allow_list(FINANCE, billing))
    east.apply(shared_gcj(billing, name))
    cronjob = wait_cronjob(east, billing, name)
    east.create_job_from(billing, name, "in-flight")  # waits at its gate, holding the lock
    wait_for("the in-flight run holds the shared lock",
             lambda: (scenario.db.lease(shared_lock(SHARED)) or {}).get("holder", "").startswith(
                 f"{EAST}/{billing}/"), TIMEOUT)

    # The admin takes billing off the list; the operator restarts with the new value.
    process = tenancy_operator.run_with(allow_list(FINANCE))

    wait_for(f"CronJob {billing}/{name} is deleted",
             lambda: east.get(cronjob_path(billing, name)) is None, TIMEOUT)
    wait_for("its Job is garbage-collected with it",
             lambda: east.job(billing, "in-flight") is None, TIMEOUT)
    invalid = wait_for("the GuardedCronJob is Invalid",
                       lambda: condition(east, billing, "Invalid", name), TIMEOUT)
    assert invalid["status"] == "True" and ENV_SHARED_LOCKS in invalid["message"], invalid
    events = wait_for("the deletion's Event", lambda: [
        e for e in lock_events(east, billing) if e["message"].startswith("deleted CronJob")],
        TIMEOUT)
    assert f"deleted CronJob {name} and its Jobs" in events[0]["message"]
    assert repr(shared_lock(SHARED)) in events[0]["message"]
    # The operator does not make it again: no CronJob while the list leaves billing out.
    assert east.get(cronjob_path(billing, name)) is None
    assert cronjob["metadata"]["uid"] != (east.get(cronjob_path(billing, name)) or {}).get(
        "metadata", {}).get("uid")
    assert process.refusals() == []
