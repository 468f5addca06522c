"""The README's install path on a real node: `docker build`, `docker push` to a registry
that wants a login, `helm install` of the chart archive with that image, a GuardedCronJob,
and its runs as pods of the kubelet, the guard from the same image."""

from __future__ import annotations

import ipaddress
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
import yaml

from guardedcron import contract
from guardedcron.guard.migrations import LATEST_VERSION, migrate
from guardedcron_devenv.docker_engine import DockerEngine
from guardedcron_devenv.image import BuiltImage
from guardedcron_devenv.node_images import BUSYBOX_IMAGE, ImageFile, build_image_archive, busybox_files
from guardedcron_devenv.pki import make_ca, make_leaf
from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.registry import LocalRegistry
from guardedcron_devenv.release import package_chart
from tests.node.cluster import NODE_TEST_TIMEOUT_SECONDS, POD_SUBNET, NodeCluster
from tests.node.user_path import (
    PULL_SECRET,
    RELEASE,
    RESTRICTED,
    RESTRICTED_CONTAINER,
    SYSTEM_NAMESPACE,
    WORKLOAD_CONTAINER,
    UserPath,
    build_workload_image,
    guarded_cronjob,
    install_chart,
    install_previous_chart,
    migration_values,
    prepare_database,
    previous_chart,
    schema_version,
    wait_for,
    workload_container,
)
from tests.support import REPO
from tests.support.chart import CHART, helm, restricted_violations

# The last chart that landed before lock names changed the CRD (spec.lease.sharedLock).
PREVIOUS_CHART = "9217f81"
UPGRADED_NAMESPACE = "team-upgrade"
# The keeper's release bound (contract.KEEPER_STOP_SECONDS) plus the kubelet noticing the
# workload ended and stopping its sidecar, on a busy 2-core machine.
RELEASED_WITHIN_SECONDS = contract.KEEPER_STOP_SECONDS + 8.0

pytestmark = [pytest.mark.node, pytest.mark.timeout(NODE_TEST_TIMEOUT_SECONDS)]


@pytest.fixture(scope="module")
def user_path(
    node_cluster: NodeCluster, node_image: BuiltImage, docker_engine: DockerEngine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[UserPath]:
    workload = build_workload_image(docker_engine, node_image.tag, tmp_path_factory.mktemp("workload"))
    # The node gets the user's workload image by import; the guardedcron image, under its
    # registry name, only by pulling it (the import here serves the previous chart).
    for tag in (node_image.tag, workload):
        node_cluster.node.import_saved_image(docker_engine.command("save", tag), docker_engine.env())
    with (
        ThrowawayPostgres(client_networks=[POD_SUBNET]) as db,
        LocalRegistry(tmp_path_factory.mktemp("registry")) as registry,
    ):
        prepare_database(db)
        path = UserPath(node_cluster, db, node_image, registry, registry.push(docker_engine, node_image.tag),
                        package_chart(REPO, tmp_path_factory.mktemp("chart")))  # fmt: skip
        path.kubectl("create", "namespace", SYSTEM_NAMESPACE)
        path.kubectl("label", "namespace", SYSTEM_NAMESPACE, RESTRICTED)
        path.add_pull_secret(SYSTEM_NAMESPACE)
        # The upgrade path first: the previous chart, one object, then this chart over it
        # (test_helm_upgrade_from_the_previous_chart_keeps_objects_and_serves_new_fields).
        install_previous_chart(path, previous_chart(PREVIOUS_CHART, tmp_path_factory.mktemp("previous")))
        path.team_namespace(UPGRADED_NAMESPACE)
        path.apply(guarded_cronjob("before-upgrade", UPGRADED_NAMESPACE))
        path.wait_cronjob(UPGRADED_NAMESPACE, "before-upgrade")
        # This chart with its migration hook: the guard's schema is made by a Job in
        # gc-system, under `restricted`, before the upgrade's objects
        # (test_the_charts_hook_job_migrated_the_schema_as_a_restricted_pod).
        path.schema_before_hook = schema_version(path)
        started = time.monotonic()
        install_chart(path, migration=migration_values(path))
        path.hook_install_seconds = time.monotonic() - started
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
    assert operator["image"] == user_path.pushed_image, operator["image"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}], pod["spec"]
    security = {**pod["spec"].get("securityContext", {}), **operator.get("securityContext", {})}
    assert security.get("runAsUser") == 65532 and security.get("readOnlyRootFilesystem") is True
    # The kubelet ran it: a container id from containerd, not a stand-in.
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    metrics = user_path.metrics()
    assert "guardedcron_" in metrics, metrics[:500]
    logs = user_path.operator_logs()
    assert "forbidden" not in logs.lower(), logs[-3000:]


def test_the_charts_hook_job_migrated_the_schema_as_a_restricted_pod(user_path: UserPath) -> None:
    """`migration.enabled`: Helm ran `guardedcron db migrate` as a pre-upgrade hook Job in
    gc-system (enforcing `restricted`), waited for it, and deleted it once it succeeded."""
    print(f"helm upgrade with the migration hook: {user_path.hook_install_seconds:.1f} s")
    # Nothing else makes the schema in this tier: before the upgrade there was none.
    assert user_path.schema_before_hook is None
    assert schema_version(user_path) == LATEST_VERSION
    job = f"{RELEASE}-guardedcron-migrate"
    events = [e for e in user_path.get("events", "-n", SYSTEM_NAMESPACE)["items"]
              if e["involvedObject"].get("kind") == "Job" and e["involvedObject"]["name"] == job]
    reasons = {e["reason"] for e in events}
    # The Job controller's pod passed `restricted` admission, and the Job completed.
    assert {"SuccessfulCreate", "Completed"} <= reasons, events
    assert "FailedCreate" not in reasons, events
    # hook-delete-policy hook-succeeded: the Job is gone, and so is its pod.
    assert job not in {j["metadata"]["name"] for j in user_path.get("jobs", "-n", SYSTEM_NAMESPACE)["items"]}
    kubeconfig = str(user_path.cluster.plane.kubeconfig)
    status = helm(["status", RELEASE, "--namespace", SYSTEM_NAMESPACE, "-o", "json",
                   "--kubeconfig", kubeconfig])  # fmt: skip
    assert status.code == 0, status.stderr
    hooks = {hook["name"]: hook for hook in json.loads(status.stdout).get("hooks") or []}
    assert job in hooks, status.stdout[:3000]
    assert hooks[job]["last_run"]["phase"] == "Succeeded", hooks[job]
    pod = yaml.safe_load(hooks[job]["manifest"])["spec"]["template"]["spec"]
    assert restricted_violations(pod) == [] and pod["automountServiceAccountToken"] is False

    # With the hook off, NOTES.txt's `kubectl run` passes `restricted` admission too
    # (a server-side dry run in gc-system: admitted, nothing created).
    notes = helm(["install", RELEASE, str(CHART), "--dry-run=client", "--namespace", SYSTEM_NAMESPACE],
                 {"image": {"repository": "guardedcron", "tag": "dev"}}).stdout.split("NOTES:", 1)[1]
    overrides = re.search(r"--overrides='([^']*)'", notes)
    assert overrides and "--override-type=strategic" in notes, notes
    admitted = user_path.kubectl(
        "run", "guardedcron-migrate", "-n", SYSTEM_NAMESPACE, "--restart=Never",
        f"--image={user_path.image.tag}", "--env=GUARDEDCRON_DSN=postgresql://x@y/z",
        "--override-type=strategic", f"--overrides={overrides[1]}", "--dry-run=server", "-o", "json",
        "--", "db", "migrate",
    )  # fmt: skip
    spec = json.loads(admitted.stdout)["spec"]
    assert restricted_violations(spec) == [] and spec["containers"][0]["args"] == ["db", "migrate"]


def test_helm_upgrade_from_the_previous_chart_keeps_objects_and_serves_new_fields(
    user_path: UserPath,
) -> None:
    cronjob = user_path.wait_cronjob(UPGRADED_NAMESPACE, "before-upgrade")
    assert cronjob["metadata"]["ownerReferences"][0]["name"] == "before-upgrade"
    assert user_path.gcj_status(UPGRADED_NAMESPACE, "before-upgrade"), "status was lost"
    explained = user_path.kubectl("explain", f"{contract.PLURAL}.spec.lease.sharedLock").stdout
    assert "sharedLock" in explained, explained
    # The upgraded operator keeps serving the object made before the upgrade: a run of it.
    job = f"before-upgrade-{int(time.time() // 60) - 4}"
    user_path.kubectl("create", "job", "--from=cronjob/before-upgrade", job, "-n", UPGRADED_NAMESPACE)
    user_path.wait_job_finished(UPGRADED_NAMESPACE, job)
    user_path.wait_last_run(UPGRADED_NAMESPACE, "before-upgrade", job, "Succeeded")


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

    last = user_path.wait_last_run(namespace, "invoices", job, "Succeeded")
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


def start_gated_run(user_path: UserPath, namespace: str, name: str, **lease: Any) -> tuple[str, str]:
    """A GuardedCronJob whose run stalls after its first item; returns (job, lock)."""
    user_path.apply(guarded_cronjob(name, namespace, lease=lease,
                                    container=workload_container(gate=True)))  # fmt: skip
    user_path.wait_cronjob(namespace, name)
    job = f"{name}-{int(time.time() // 60) - 3}"
    user_path.kubectl("create", "job", f"--from=cronjob/{name}", job, "-n", namespace)
    lock = f"{namespace}/{name}"
    wait_for("the run writes its first item",
             lambda: user_path.query("SELECT 1 FROM e2e_work WHERE job = %s", (job,)), timeout=120)
    return job, lock


def test_keep_renews_a_run_longer_than_its_lease_and_releases_it(user_path: UserPath) -> None:
    namespace = user_path.team_namespace("team-long")
    job, lock = start_gated_run(user_path, namespace, "long", heartbeat=True, durationSeconds=15)
    first = user_path.lease(lock)
    time.sleep(25)  # well past the 15 s lease: only the keeper's renewals keep it
    renewed = user_path.lease(lock)
    assert renewed["holder"] == first["holder"] and renewed["fence"] == first["fence"]
    assert renewed["locked_until"] > first["locked_until"], (first, renewed)
    user_path.open_gate(job)
    finished = user_path.wait_job_finished(namespace, job)
    assert [c["type"] for c in finished["status"]["conditions"] if c["status"] == "True"][-1] == "Complete"
    fences = user_path.query("SELECT DISTINCT fence FROM e2e_work WHERE job = %s", (job,))
    assert fences == [(first["fence"],)], fences
    keeper = terminated(user_path.pod_of(namespace, job), contract.KEEPER_CONTAINER)
    assert keeper["exitCode"] == 0, keeper  # stopped by the kubelet after the workload
    assert user_path.lease(lock)["released"] is True
    user_path.wait_last_run(namespace, "long", job, "Succeeded")


def test_a_lease_taken_over_mid_run_is_lost_and_the_operator_stops_the_pod(user_path: UserPath) -> None:
    namespace = user_path.team_namespace("team-lost")
    job, lock = start_gated_run(user_path, namespace, "lost", heartbeat=True, durationSeconds=15,
                                onLost="StopWorkload")  # fmt: skip
    pod_name = user_path.pod_of(namespace, job)["metadata"]["name"]
    # Someone else takes the lock over in the database, as an expired lease's successor would.
    user_path.query(
        "UPDATE guardedcron.leases SET holder = 'intruder', fence = nextval('guardedcron.fences'),"
        " locked_until = clock_timestamp() + interval '1 hour' WHERE lock_name = %s RETURNING fence",
        (lock,),
    )
    last = user_path.wait_last_run(namespace, "lost", job, "Lost", timeout=120)
    assert "intruder" in json.dumps(last), last
    wait_for("the operator deletes the run's pod", lambda: not [
        p for p in user_path.get("pods", "-n", namespace)["items"]
        if p["metadata"]["name"] == pod_name and not p["metadata"].get("deletionTimestamp")
    ], timeout=60)  # fmt: skip
    assert user_path.events(namespace, "LeaseLost"), "no LeaseLost Event"
    assert user_path.events(namespace, "WorkloadStopped"), "no WorkloadStopped Event"
    assert user_path.query("SELECT count(*) FROM e2e_work WHERE job = %s", (job,)) == [(1,)]


def test_an_unreachable_database_is_a_guard_error_and_a_missed_run(user_path: UserPath) -> None:
    """The CronJob controller fires the slot itself; the guard cannot reach the database."""
    namespace = user_path.team_namespace("team-nodb")
    gateway = user_path.cluster.network.gateway
    # Nothing listens on port 9 of the bridge address: connection refused at once.
    user_path.kubectl("create", "secret", "generic", "nowhere", "-n", namespace,
                      f"--from-literal=dsn=postgresql://nobody:secret@{gateway}:9/none")  # fmt: skip
    manifest = guarded_cronjob("nodb", namespace)
    manifest["spec"].update(schedule="* * * * *", startingDeadlineSeconds=10, missedRunToleranceSeconds=0)
    manifest["spec"]["lease"]["databaseSecretRef"] = {"name": "nowhere"}
    user_path.apply(manifest)
    user_path.wait_cronjob(namespace, "nodb")
    job = wait_for("the CronJob controller fires a slot", lambda: next(
        (j["metadata"]["name"] for j in user_path.get("jobs", "-n", namespace)["items"]), None),
        timeout=100)  # fmt: skip
    failed_job = user_path.wait_job_finished(namespace, job)
    [failed] = [c for c in failed_job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "PodFailurePolicy", failed
    assert f"matching FailJob rule at index {contract.GUARD_ERROR_RULE_INDEX}" in failed["message"]
    guard = terminated(user_path.pod_of(namespace, job), contract.GUARD_CONTAINER)
    assert guard["exitCode"] == contract.EXIT_UNAVAILABLE, guard
    assert "secret" not in guard.get("message", ""), "the DSN's password leaked into the message"
    user_path.wait_last_run(namespace, "nodb", job, "GuardError")
    assert user_path.events(namespace, "GuardError"), "no GuardError Event"

    def missed_run() -> dict[str, Any] | None:
        conditions = user_path.gcj_status(namespace, "nodb").get("conditions") or []
        return next((c for c in conditions if c["type"] == "MissedRun" and c["status"] == "True"), None)

    condition = wait_for("the MissedRun condition says the slot's work never ran", missed_run, timeout=60)
    assert condition["reason"] == "GuardError", condition
    assert user_path.events(namespace, "MissedRun"), "no MissedRun Event"
    metrics = user_path.metrics().splitlines()
    labelled = f'name="nodb",namespace="{namespace}"'
    assert any(line.startswith("guardedcron_runs_total{") and 'outcome="guard_error"' in line
               and labelled in line for line in metrics), metrics[-40:]
    assert any(line.startswith("guardedcron_missed_runs_total{") and labelled in line
               and not line.endswith(" 0.0") for line in metrics), metrics[-40:]
    user_path.kubectl("patch", f"{contract.PLURAL}.{contract.API_GROUP}", "nodb", "-n", namespace,
                      "--type=merge", "-p", '{"spec": {"suspend": true}}')  # fmt: skip


# The registry's access log: a manifest request by containerd that it answered.
PULL_ANSWERED = r'"(?:GET|HEAD) /v2/guardedcron/manifests/\S+ HTTP/1.1" 200 \d+ "[^"]*" "containerd/'


def test_run_pods_pull_the_guard_image_with_the_login_the_chart_adds(user_path: UserPath) -> None:
    """The node's containerd asked the registry for the guardedcron image for the operator
    and for every run pod so far (the guard's pull policy is Always), and was answered:
    the registry answers no one without the login. In a namespace without that login's
    Secret the same pull is refused, so the login is what lets the runs start."""
    answered = re.findall(PULL_ANSWERED, user_path.registry.log_path.read_text())
    assert len(answered) >= 2, "the registry logged no pull of the guardedcron image by the node"
    namespace = user_path.team_namespace("team-nologin", pull_secret=False)
    user_path.apply(guarded_cronjob("nologin", namespace))
    user_path.wait_cronjob(namespace, "nologin")
    job = f"nologin-{int(time.time() // 60) - 3}"
    user_path.kubectl("create", "job", "--from=cronjob/nologin", job, "-n", namespace)

    def refused() -> dict[str, Any] | None:
        return next((e for e in user_path.events(namespace, "Failed")
                     if user_path.pushed_image in e["message"]), None)  # fmt: skip

    event = wait_for("the kubelet reports the guard image's pull refused", refused, timeout=120)
    assert "401" in event["message"] or "nauthorized" in event["message"], event["message"]
    pod = user_path.pod_of(namespace, job)
    assert pod["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}], pod["spec"]
    assert "initContainerStatuses" not in pod["status"] or not any(
        "terminated" in s["state"] for s in pod["status"]["initContainerStatuses"]), pod["status"]
    user_path.kubectl("delete", "namespace", namespace, "--wait=false")


PLATFORM_USER_ID = 1000770000  # as OpenShift's restricted SCC assigns one per namespace
UID_SCRIPT = ('while read -r key uid rest; do if test "$key" = Uid:; then echo "$uid"; fi; done'
              " < /proc/self/status")


def test_a_platform_user_id_and_a_client_certificate_reach_postgres_over_verify_full(
    user_path: UserPath, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """guard.runAsUser null: the guard runs as the user id the pod is given, and copies
    its client key as that user; the server requires TLS, verify-full and a client
    certificate naming the role."""
    gateway = user_path.cluster.network.gateway
    folder = tmp_path_factory.mktemp("database-pki")
    ca = make_ca(folder, "database-ca")
    server = make_leaf(folder, "server", ca, "/CN=database", "serverAuth", (f"IP:{gateway}",))
    with ThrowawayPostgres(client_networks=[POD_SUBNET], tls=server, client_ca=ca.cert) as tls_db:
        client = make_leaf(folder, "client", ca, f"/CN={tls_db.superuser}", "clientAuth")
        tls_db.create_database("leases")
        with psycopg.connect(tls_db.socket_conninfo("leases"), autocommit=True) as conn:
            migrate(conn)
        namespace = user_path.team_namespace("team-tls")
        user_path.kubectl("create", "secret", "generic", "leases-db", "-n", namespace,
                          f"--from-literal=dsn={tls_db.dsn('leases', host=gateway)}?sslmode=verify-full")
        user_path.kubectl("create", "secret", "generic", "database-ca", "-n", namespace,
                          f"--from-file=ca.crt={ca.cert}")  # fmt: skip
        user_path.kubectl("create", "secret", "tls", "database-client", "-n", namespace,
                          f"--cert={client.cert}", f"--key={client.key}")  # fmt: skip
        container = {"name": "task", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                     "command": ["sh", "-c", UID_SCRIPT],
                     "securityContext": {k: v for k, v in RESTRICTED_CONTAINER.items() if k != "runAsUser"}}
        manifest = guarded_cronjob("tls", namespace, container=container, lease={
            "databaseSecretRef": {"name": "leases-db"},
            "tls": {"caSecretRef": {"name": "database-ca"},
                    "clientCertSecretRef": {"name": "database-client"}},
        })  # fmt: skip
        manifest["spec"]["jobTemplate"]["spec"]["template"]["spec"]["securityContext"] = {
            "runAsUser": PLATFORM_USER_ID, "runAsGroup": PLATFORM_USER_ID}
        user_path.apply(manifest)
        cronjob = user_path.wait_cronjob(namespace, "tls")
        pod_spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        [guard] = [c for c in pod_spec["initContainers"] if c["name"] == contract.GUARD_CONTAINER]
        assert "runAsUser" not in guard["securityContext"], guard["securityContext"]
        job = f"tls-{int(time.time() // 60) - 3}"
        user_path.kubectl("create", "job", "--from=cronjob/tls", job, "-n", namespace)
        finished = user_path.wait_job_finished(namespace, job)
        pod = user_path.pod_of(namespace, job)
        message = json.loads(terminated(pod, contract.GUARD_CONTAINER)["message"])
        assert message["outcome"] == "acquired", (finished["status"], message)
        true = [c["type"] for c in finished["status"]["conditions"] if c["status"] == "True"]
        assert true[-1] == "Complete", finished["status"]
        # The workload ran as the platform's id too: the pod's, not the image's.
        said = user_path.kubectl("logs", pod["metadata"]["name"], "-c", "task", "-n", namespace).stdout
        assert said.strip() == str(PLATFORM_USER_ID), said
        with psycopg.connect(tls_db.socket_conninfo("leases"), autocommit=True) as conn:
            [(fence,)] = conn.execute("SELECT fence FROM guardedcron.leases WHERE lock_name = %s",
                                      (f"{namespace}/tls",)).fetchall()  # fmt: skip
        assert fence == message["fence"]
        user_path.wait_last_run(namespace, "tls", job, "Succeeded")


EXAMPLE = REPO / "examples" / "nightly-invoices.yaml"
# What the example's image runs: its command, relative to the image's working folder /.
# Ten seconds: well inside the 60 s lease, and past the keeper's first renewal.
RUN_TASK = b"#!/bin/sh\necho \"task $*\"\nsleep 10\n"


def test_the_readme_example_applied_unchanged_frees_its_lease_when_the_run_ends(user_path: UserPath) -> None:
    """The README's example, with every default: its keeper releases the lease seconds
    after the workload ends, so the next run, right after, wins it instead of being
    skipped as `lease-held`. The example's image is made here, under its own name."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    [task] = manifest["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    user_path.cluster.node.import_image(build_image_archive(
        task["image"], [*busybox_files(), ImageFile("/bin/run-task", RUN_TASK)], ["/bin/sh"],
        {"/bin/sh": "busybox", "/bin/sleep": "busybox", "/bin/echo": "busybox"}))  # fmt: skip
    secret = manifest["spec"]["lease"]["databaseSecretRef"]
    user_path.kubectl("create", "namespace", namespace)
    user_path.add_pull_secret(namespace)  # the chart's guard.imagePullSecrets, as its NOTES say
    user_path.kubectl("create", "secret", "generic", secret["name"], "-n", namespace,
                      f"--from-literal={secret['key']}={user_path.pod_dsn}")  # fmt: skip
    user_path.kubectl("apply", "-f", str(EXAMPLE))
    user_path.wait_cronjob(namespace, name)
    lock = f"{namespace}/{name}"
    slot = int(time.time() // 60) - 10
    for job in (f"{name}-{slot}", f"{name}-{slot + 1}"):  # the second right after the first
        user_path.kubectl("create", "job", f"--from=cronjob/{name}", job, "-n", namespace)
        finished = user_path.wait_job_finished(namespace, job)["status"]["conditions"]
        assert [c["type"] for c in finished if c["status"] == "True"][-1] == "Complete"
        pod = user_path.pod_of(namespace, job)
        guard = json.loads(terminated(pod, contract.GUARD_CONTAINER)["message"])
        assert guard["outcome"] == "acquired", guard
        assert terminated(pod, contract.KEEPER_CONTAINER)["exitCode"] == 0
        ended = datetime.fromisoformat(terminated(pod, task["name"])["finishedAt"])
        [(released_at,)] = user_path.query(
            "SELECT released_at FROM guardedcron.leases WHERE lock_name = %s AND fence = %s",
            (lock, guard["fence"]))  # fmt: skip
        keeper_log = user_path.kubectl("logs", pod["metadata"]["name"], "-c", contract.KEEPER_CONTAINER,
                                       "-n", namespace).stdout  # fmt: skip
        assert released_at is not None, f"the lease was not released; the keeper said:\n{keeper_log}"
        # finishedAt has whole seconds: the release may show up to a second "before" it.
        after = (released_at - ended).total_seconds()
        print(f"{job}: lease released {after:.1f} s after the workload ended")
        assert -1.0 <= after <= RELEASED_WITHIN_SECONDS, (after, keeper_log)
        user_path.wait_last_run(namespace, name, job, "Succeeded")
    # The per-run Events, as the real API server stores them: Normal, one per run.
    succeeded = user_path.events(namespace, "RunSucceeded")
    for job in (f"{name}-{slot}", f"{name}-{slot + 1}"):
        [event] = [e for e in succeeded if f" {job} succeeded" in e["message"]]
        assert event["type"] == "Normal" and event["involvedObject"]["name"] == name, event
    assert not user_path.events(namespace, "RunSkipped")


# kopf's peering lifetime (60 s): a peer that vanished without saying goodbye counts as
# gone when its record is that old; the standby resumes on its next check after that.
PEERING_LIFETIME_SECONDS = 60
TAKEOVER_BOUND_SECONDS = PEERING_LIFETIME_SECONDS + 60
PAUSED = "Pausing operations in favour of"  # kopf's words, at info level
RESUMED = "Resuming operations after the pause"


def pod_logs(user_path: UserPath, pod: dict[str, Any]) -> str:
    return user_path.kubectl("logs", pod["metadata"]["name"], "-n", SYSTEM_NAMESPACE).stdout


def applied(name: str) -> str:
    return f"Applied CronJob {name}:"  # the operator's line when it creates or mends one


def test_the_standby_operator_takes_over_when_the_active_one_is_killed(user_path: UserPath) -> None:
    """Which pod serves is asserted before and after: the active one, then the standby,
    never the Deployment's replacement (a ResourceQuota keeps it from being created). A
    job firing every minute across the handover has every slot run exactly once and
    none reported missed. Last in this module: it leaves the release with two replicas."""
    install_chart(user_path, replicaCount=2, peering={"enabled": True})
    pods = wait_for("two operator pods are Ready", lambda: [
        p for p in user_path.operator_pods()
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ] if len(user_path.operator_pods()) == 2 else None, timeout=240)  # fmt: skip
    assert len(pods) == 2
    # Peering priority is the pod's IPv4 address as an integer: the highest serves.
    active = max(pods, key=lambda p: ipaddress.ip_address(p["status"]["podIP"]))
    [standby] = [p for p in pods if p is not active]
    wait_for("the standby pauses in favour of the active one",
             lambda: PAUSED in pod_logs(user_path, standby), timeout=TAKEOVER_BOUND_SECONDS)
    namespace = user_path.team_namespace("team-ha")
    every_minute = guarded_cronjob("ha", namespace)
    every_minute["spec"]["schedule"] = "* * * * *"
    user_path.apply(every_minute)
    user_path.wait_cronjob(namespace, "ha")
    assert applied("ha") in pod_logs(user_path, active)
    assert applied("ha") not in pod_logs(user_path, standby)
    lock = f"{namespace}/ha"
    first_slot = wait_for("a first slot runs while the active operator serves", lambda: next(iter(
        user_path.query("SELECT min(slot) FROM guardedcron.slot_claims WHERE lock_name = %s", (lock,))[0]),
        None), timeout=120)  # fmt: skip

    # The Deployment's replacement cannot be made while the quota is full: the standby is
    # the only operator left.
    user_path.apply({"apiVersion": "v1", "kind": "ResourceQuota",
                     "metadata": {"name": "no-replacement", "namespace": SYSTEM_NAMESPACE},
                     "spec": {"hard": {"pods": "1"}}})  # fmt: skip
    wait_for("the quota counts the operator pods", lambda: user_path.get(
        "resourcequota", "no-replacement", "-n", SYSTEM_NAMESPACE).get("status", {}).get("used"), timeout=60)
    try:
        # Deleted with --force and no grace: its API object goes at once. The kubelet still
        # gives the container its minimum grace, in which kopf may leave the peering object
        # (then the standby resumes at once); without that goodbye it waits out the peering
        # lifetime.
        killed_at = time.monotonic()
        user_path.kubectl("delete", "pod", active["metadata"]["name"], "-n", SYSTEM_NAMESPACE,
                          "--grace-period=0", "--force")  # fmt: skip
        user_path.apply(guarded_cronjob("ha-after", namespace))
        user_path.wait_cronjob(namespace, "ha-after", timeout=TAKEOVER_BOUND_SECONDS)
        took = time.monotonic() - killed_at
        print(f"the standby served {took:.0f} s after the active operator was killed")
        assert [p["metadata"]["name"] for p in user_path.operator_pods()] == [standby["metadata"]["name"]]
        served = pod_logs(user_path, standby)
        assert RESUMED in served and applied("ha-after") in served, served[-3000:]

        # The next slot after the takeover, then every slot's run in status.
        last_slot = int(time.time() // 60) + 1
        wait_for("the slot after the takeover runs", lambda: user_path.query(
            "SELECT 1 FROM guardedcron.slot_claims WHERE lock_name = %s AND slot >= %s", (lock, last_slot)),
            timeout=180)  # fmt: skip
    finally:
        user_path.kubectl("delete", "resourcequota", "no-replacement", "-n", SYSTEM_NAMESPACE)
    user_path.kubectl("patch", f"{contract.PLURAL}.{contract.API_GROUP}", "ha", "-n", namespace,
                      "--type=merge", "-p", '{"spec": {"suspend": true}}')  # fmt: skip
    slots = range(first_slot, last_slot + 1)
    won = dict(user_path.query(
        "SELECT slot, count(*) FROM guardedcron.runs WHERE lock_name = %s AND outcome <> 'skipped'"
        " GROUP BY slot", (lock,)))  # fmt: skip
    assert {slot: won.get(slot, 0) for slot in slots} == dict.fromkeys(slots, 1), won

    def every_slot_succeeded() -> dict[str, Any] | None:
        status = user_path.gcj_status(namespace, "ha")
        done = {run.get("slot") for run in status.get("recentRuns") or []
                if run.get("outcome") == "Succeeded" and "finishedAt" in run}
        return status if set(slots) <= done else None

    pods = [p["metadata"]["name"] for p in user_path.get("pods", "-n", namespace)["items"]]

    def workload_logs() -> dict[str, str]:
        return {pod: user_path.kubectl("logs", pod, "-c", WORKLOAD_CONTAINER, "-n", namespace).stdout[-500:]
                for pod in pods}

    try:
        status = wait_for("status records every slot Succeeded", every_slot_succeeded, timeout=120)
    except AssertionError as timed_out:
        runs = user_path.gcj_status(namespace, "ha").get("recentRuns")
        raise AssertionError(f"{timed_out}: slots {list(slots)}; recentRuns {runs}; "
                             f"workload logs {workload_logs()}") from None
    rows = user_path.query("SELECT dedupe_key, count(*) FROM e2e_work WHERE lock = %s GROUP BY 1", (lock,))
    assert len(rows) == 3 * len(slots) and all(count == 1 for _, count in rows), (rows, workload_logs())
    [missed] = [c for c in status["conditions"] if c["type"] == "MissedRun"]
    assert missed["status"] != "True", missed
    assert not user_path.events(namespace, "MissedRun")
    logs = user_path.operator_logs()
    assert "forbidden" not in logs.lower(), logs[-3000:]
