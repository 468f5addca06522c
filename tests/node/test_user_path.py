"""The README's install path on a real node: `docker build`, `helm install` with that image,
a GuardedCronJob, and its runs as pods of the kubelet, the guard from the same image."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from guardedcron import contract
from guardedcron_devenv.docker_engine import DockerEngine
from guardedcron_devenv.image import BuiltImage
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.node.cluster import NODE_TEST_TIMEOUT_SECONDS, POD_SUBNET, NodeCluster
from tests.node.user_path import (
    RESTRICTED,
    SYSTEM_NAMESPACE,
    UserPath,
    build_workload_image,
    guarded_cronjob,
    install_chart,
    prepare_database,
    wait_for,
)

pytestmark = [pytest.mark.node, pytest.mark.timeout(NODE_TEST_TIMEOUT_SECONDS)]


@pytest.fixture(scope="module")
def user_path(
    node_cluster: NodeCluster, node_image: BuiltImage, docker_engine: DockerEngine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[UserPath]:
    workload = build_workload_image(docker_engine, node_image.tag, tmp_path_factory.mktemp("workload"))
    for tag in (node_image.tag, workload):
        node_cluster.node.import_saved_image(docker_engine.command("save", tag), docker_engine.env())
    with ThrowawayPostgres(client_networks=[POD_SUBNET]) as db:
        prepare_database(db)
        path = UserPath(node_cluster, db, node_image)
        path.kubectl("create", "namespace", SYSTEM_NAMESPACE)
        path.kubectl("label", "namespace", SYSTEM_NAMESPACE, RESTRICTED)
        install_chart(path)
        yield path


def terminated(pod: dict[str, Any], name: str) -> dict[str, Any]:
    statuses = pod["status"].get("initContainerStatuses", []) + pod["status"].get("containerStatuses", [])
    [status] = [s for s in statuses if s["name"] == name]
    state: dict[str, Any] = status["state"]["terminated"]
    return state


def test_the_operator_runs_as_a_restricted_pod_and_serves_metrics(user_path: UserPath) -> None:
    [pod] = user_path.operator_pods()
    ready = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", pod["status"]
    [operator] = pod["spec"]["containers"]
    assert operator["image"].endswith(user_path.image.tag), operator["image"]
    security = {**pod["spec"].get("securityContext", {}), **operator.get("securityContext", {})}
    assert security.get("runAsUser") == 65532 and security.get("readOnlyRootFilesystem") is True
    # The kubelet ran it: a container id from containerd, not a stand-in.
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    metrics = user_path.metrics()
    assert "guardedcron_" in metrics, metrics[:500]
    logs = user_path.operator_logs()
    assert "forbidden" not in logs.lower(), logs[-3000:]


def test_a_run_on_the_node_takes_the_lease_and_writes_fenced_rows(user_path: UserPath) -> None:
    namespace = user_path.team_namespace("team-run")
    user_path.apply(guarded_cronjob("invoices", namespace))
    user_path.wait_cronjob(namespace, "invoices")
    slot = int(time.time() // 60) - 5
    job = f"invoices-{slot}"
    user_path.kubectl("create", "job", "--from=cronjob/invoices", job, "-n", namespace)
    finished = user_path.wait_job_finished(namespace, job)
    pod = user_path.pod_of(namespace, job)
    assert [c["type"] for c in finished["status"]["conditions"] if c["status"] == "True"][-1] == "Complete"
    guard = terminated(pod, contract.GUARD_CONTAINER)
    message = json.loads(guard["message"])
    assert (guard["exitCode"], message["outcome"]) == (0, "acquired"), message
    lock = f"{namespace}/invoices"
    rows = user_path.query("SELECT fence, holder FROM e2e_work WHERE lock = %s", (lock,))
    assert rows and {fence for fence, _ in rows} == {message["fence"]}, rows

    def status_names_the_run() -> dict[str, Any] | None:
        gcj = user_path.get(f"{contract.PLURAL}.{contract.API_GROUP}", "invoices", "-n", namespace)
        last = gcj.get("status", {}).get("lastRun") or {}
        return last if last.get("job") == job and last.get("outcome") == "Succeeded" else None

    last = wait_for("status reports the run", status_names_the_run, timeout=60)
    assert last["fence"] == message["fence"], last


def test_the_same_slot_fired_again_is_skipped_by_pod_failure_policy(user_path: UserPath) -> None:
    namespace = user_path.team_namespace("team-twice")
    # With the keep sidecar the lease is released when the first run ends, so the second
    # is refused by the slot claim alone, not by a lease still held.
    user_path.apply(guarded_cronjob("ledger", namespace, lease={"heartbeat": True}))
    user_path.wait_cronjob(namespace, "ledger")
    job = f"ledger-{int(time.time() // 60) - 7}"
    user_path.kubectl("create", "job", "--from=cronjob/ledger", job, "-n", namespace)
    user_path.wait_job_finished(namespace, job)
    first_pod = user_path.pod_of(namespace, job)
    first = json.loads(terminated(first_pod, contract.GUARD_CONTAINER)["message"])
    assert first["outcome"] == "acquired", first
    # The native sidecar was stopped by the kubelet after the workload, and released the lease.
    keeper = terminated(first_pod, contract.KEEPER_CONTAINER)
    assert keeper["exitCode"] == 0, keeper
    released = user_path.query("SELECT released_at IS NOT NULL FROM guardedcron.leases WHERE lock_name = %s",
                               (f"{namespace}/ledger",))  # fmt: skip
    assert released == [(True,)], released
    # The same slot again, as a controller restart could fire it: same Job name, new Job.
    user_path.kubectl("delete", "job", job, "-n", namespace, "--wait=true")
    user_path.kubectl("create", "job", "--from=cronjob/ledger", job, "-n", namespace)
    again = user_path.wait_job_finished(namespace, job)
    [failed] = [c for c in again["status"]["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "PodFailurePolicy", failed
    assert f"matching FailJob rule at index {contract.SKIP_RULE_INDEX}" in failed["message"], failed
    guard = terminated(user_path.pod_of(namespace, job), contract.GUARD_CONTAINER)
    skipped = json.loads(guard["message"])
    assert guard["exitCode"] == contract.EXIT_NOT_ACQUIRED
    assert (skipped["outcome"], skipped["reason"]) == ("skipped", "slot-claimed"), skipped
    rows = user_path.query("SELECT count(*) FROM e2e_work WHERE lock = %s", (f"{namespace}/ledger",))
    assert rows == [(3,)], rows  # the first run's three items, once
