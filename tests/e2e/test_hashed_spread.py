"""`H` on two real control planes, each with its operator: the GuardedCronJob applied in
both resolves to the same concrete schedule (so their runs claim the same slots), the
CronJobs carry it, status.resolvedSchedule and `kubectl get -o wide` show it."""

from __future__ import annotations

import pytest

from guardedcron import contract
from guardedcron.schedule.hashed import resolve_hashed
from tests.e2e.harness import EAST, WEST, Cluster, Scenario, guarded_cronjob, lock_of
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.test_operator import create_gcj, wait_cronjob, wait_status

pytestmark = pytest.mark.e2e

SCHEDULE = "H H(1-5) * * *"


def test_h_resolves_the_same_in_both_clusters(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess],
) -> None:
    both = [clusters[EAST], clusters[WEST]]
    namespace = operator_scenario.namespace("spread", both)
    # Two jobs sharing one lock in both clusters, and one with a lock of its own.
    manifests = {
        name: guarded_cronjob(name, namespace, schedule=SCHEDULE, spec={"suspend": True},
                              lease={"name": lease})
        for name, lease in (("report-a", "report"), ("report-b", "report"), ("other", "other"))
    }
    expected = {name: resolve_hashed(SCHEDULE, lock_of(gcj)) for name, gcj in manifests.items()}
    assert expected["report-a"] == expected["report-b"] != expected["other"]

    for cluster in both:
        for gcj in manifests.values():
            create_gcj(cluster, gcj)
    for cluster in both:
        for name, resolved in expected.items():
            cronjob = wait_cronjob(cluster, namespace, name=name)
            assert cronjob["spec"]["schedule"] == resolved, (cluster.name, name)
            assert cronjob["metadata"]["annotations"][contract.ANNOTATION_WRITTEN_SCHEDULE] == (
                SCHEDULE)
            wait_status(cluster, namespace, f"resolvedSchedule {resolved}",
                        lambda status, r=resolved: status.get("resolvedSchedule") == r, name=name)
        wide = cluster.kubectl("get", contract.PLURAL, "-n", namespace, "-o", "wide").stdout
        header, *rows = wide.splitlines()
        assert "RESOLVED SCHEDULE" in header, header
        for row in rows:
            name = row.split()[0]
            assert expected[name] in row, row
    for name, process in operators.items():
        assert process.refusals() == [], f"the API server refused the operator of {name}"
