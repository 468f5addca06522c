"""The path a user takes, on the real node: the image built from the Dockerfile and pushed
to a registry, the packaged chart installed with it, the operator as a pod, guarded runs
as pods of the kubelet.

`UserPath` holds what the scenarios share: the node cluster, a PostgreSQL the pods reach
on the pod bridge's address, the registry and its login, the workload image imported into
the node's containerd, and the chart installed into a namespace that enforces the
`restricted` Pod Security level.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from guardedcron import contract
from guardedcron_devenv.controlplane import KubectlError
from guardedcron_devenv.docker_engine import DockerEngine
from guardedcron_devenv.image import BuiltImage
from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.registry import LocalRegistry
from tests.node.cluster import NodeCluster
from tests.support import REPO
from tests.support.chart import helm
from tests.support.waiting import wait_for

SYSTEM_NAMESPACE = "gc-system"
RELEASE = "gc"
WORKLOAD_SCRIPT = REPO / "tests" / "e2e" / "workload.py"  # the e2e suite's workload, as a file
WORKLOAD_IMAGE = "guardedcron-node-workload:dev"
WORKLOAD_CONTAINER = "work"
DSN_SECRET = "jobs-db"
# The registry login every namespace gets; the chart adds it to the operator's pod and,
# for the guard's image, to every run's pod.
PULL_SECRET = "registry-login"
# The DSN the chart's migration hook Job reads, in SYSTEM_NAMESPACE.
MIGRATION_SECRET = "guardedcron-migrate"
RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"
# What `restricted` asks of every container; the guard's containers carry it already.
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass
class UserPath:
    cluster: NodeCluster
    db: ThrowawayPostgres
    image: BuiltImage
    registry: LocalRegistry
    pushed_image: str  # the image as the registry serves it (name:tag)
    packaged_chart: Path  # `helm package`'s archive: what a user installs
    # The guard's schema version just before the chart with its migration hook was
    # installed (None: no schema at all), and how long that `helm upgrade` took.
    schema_before_hook: int | None = None
    hook_install_seconds: float = 0.0

    @property
    def host_dsn(self) -> str:
        return self.db.dsn("work")

    @property
    def pod_dsn(self) -> str:
        return self.db.dsn("work", host=self.cluster.network.gateway)

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cluster.plane.kubectl(*args, input=input)

    def get(self, *args: str) -> dict[str, Any]:
        value: dict[str, Any] = self.cluster.plane.kubectl_json("get", *args)
        return value

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def team_namespace(self, name: str, *, pull_secret: bool = True) -> str:
        """A namespace enforcing `restricted`, with the DSN Secret the guard reads and the
        registry login the chart names for the guard's image."""
        self.kubectl("create", "namespace", name)
        self.kubectl("label", "namespace", name, RESTRICTED)
        self.kubectl("create", "secret", "generic", DSN_SECRET, "-n", name,
                     f"--from-literal=dsn={self.pod_dsn}")  # fmt: skip
        if pull_secret:
            self.add_pull_secret(name)
        return name

    def add_pull_secret(self, namespace: str) -> None:
        """The registry login as a kubernetes.io/dockerconfigjson Secret (through stdin:
        the password never is an argument)."""
        login = base64.b64encode(self.registry.docker_config_json().encode()).decode()
        self.apply({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                    "metadata": {"name": PULL_SECRET, "namespace": namespace},
                    "data": {".dockerconfigjson": login}})  # fmt: skip

    def wait_cronjob(self, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The CronJob the operator makes of a GuardedCronJob, once it exists."""

        def made() -> dict[str, Any] | None:
            try:
                return self.get("cronjob", name, "-n", namespace)
            except KubectlError:
                return None

        try:
            return wait_for(f"the operator creates CronJob {namespace}/{name}", made, timeout=timeout)
        except AssertionError as missing:
            gcj = self.get(f"{contract.PLURAL}.{contract.API_GROUP}", name, "-n", namespace)
            raise AssertionError(
                f"{missing}\nstatus: {json.dumps(gcj.get('status'))}\n"
                f"operator log:\n{self.operator_logs()[-4000:]}"
            ) from None

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.host_dsn, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def open_gate(self, job: str) -> None:
        self.query("INSERT INTO e2e_gates (job) VALUES (%s) ON CONFLICT DO NOTHING RETURNING job", (job,))

    def lease(self, lock: str) -> dict[str, Any]:
        [(holder, fence, locked_until, released)] = self.query(
            "SELECT holder, fence, locked_until, released_at IS NOT NULL FROM guardedcron.leases"
            " WHERE lock_name = %s", (lock,))  # fmt: skip
        return {"holder": holder, "fence": fence, "locked_until": locked_until, "released": released}

    def gcj_status(self, namespace: str, name: str) -> dict[str, Any]:
        gcj = self.get(f"{contract.PLURAL}.{contract.API_GROUP}", name, "-n", namespace)
        status: dict[str, Any] = gcj.get("status") or {}
        return status

    def wait_last_run(self, namespace: str, name: str, job: str, outcome: str,
                      timeout: float = 90.0) -> dict[str, Any]:
        """The GuardedCronJob's status naming `job` as its last run with `outcome`."""

        def reported() -> dict[str, Any] | None:
            last = self.gcj_status(namespace, name).get("lastRun") or {}
            return last if last.get("job") == job and last.get("outcome") == outcome else None

        try:
            return wait_for(f"status reports {job} as {outcome}", reported, timeout)
        except AssertionError as missing:
            status = json.dumps(self.gcj_status(namespace, name))
            raise AssertionError(f"{missing}\nstatus: {status}") from None

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        listed = self.get("events", "-n", namespace, "--field-selector", f"reason={reason}")
        events: list[dict[str, Any]] = listed["items"]
        return events

    def operator_pods(self) -> list[dict[str, Any]]:
        listed = self.get("pods", "-n", SYSTEM_NAMESPACE, "-l", "app.kubernetes.io/name=guardedcron")
        pods: list[dict[str, Any]] = listed["items"]
        return pods

    def operator_logs(self) -> str:
        return "\n".join(
            self.kubectl("logs", pod["metadata"]["name"], "-n", SYSTEM_NAMESPACE).stdout
            for pod in self.operator_pods()
        )

    def metrics(self) -> str:
        """/metrics scraped through the chart's Service (kube-proxy routes its ClusterIP)."""
        [service] = [s for s in self.get("services", "-n", SYSTEM_NAMESPACE)["items"]
                     if s["metadata"]["name"].endswith("-metrics")]  # fmt: skip
        port = service["spec"]["ports"][0]["port"]
        url = f"http://{service['spec']['clusterIP']}:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    def wait_job_finished(self, namespace: str, job: str, timeout: float = 180.0) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            live = self.get("job", job, "-n", namespace)
            done = [c for c in live.get("status", {}).get("conditions", [])
                    if c["type"] in ("Complete", "Failed") and c["status"] == "True"]  # fmt: skip
            return live if done else None

        return wait_for(f"job {namespace}/{job} finishes", finished, timeout)

    def pod_of(self, namespace: str, job: str) -> dict[str, Any]:
        [pod] = self.get("pods", "-n", namespace, "-l", f"job-name={job}")["items"]
        return pod


def install_chart(path: UserPath, **more_values: Any) -> None:
    """The README's install path: `helm upgrade --install` of the packaged chart with the
    image pushed to a registry that refuses anonymous pulls. The kubelet pulls the
    operator's image with the release's login, and the guard's in every run pod with the
    login the chart adds there (pull policy Always: every run asks the registry). The
    guard's user id is left to the pod or the image (guard.runAsUser null), as a platform
    that assigns user ids needs."""
    repository, _, tag = path.pushed_image.rpartition(":")
    login = [{"name": PULL_SECRET}]
    values = {"image": {"repository": repository, "tag": tag}, "imagePullSecrets": login,
              "guard": {"imagePullPolicy": "Always", "imagePullSecrets": login, "runAsUser": None},
              "stopWorkload": {"enabled": True}, **more_values}  # fmt: skip
    helm_install(path, path.packaged_chart, values)


def install_previous_chart(path: UserPath, chart: Path) -> None:
    """An earlier chart from the source tree, with the image imported into the node."""
    repository, _, tag = path.image.tag.rpartition(":")
    helm_install(path, chart, {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                               "guard": {"imagePullPolicy": "Never"}, "stopWorkload": {"enabled": True}})


def helm_install(path: UserPath, chart: Path, values: Mapping[str, Any]) -> None:
    result = helm(["upgrade", "--install", RELEASE, str(chart), "--namespace", SYSTEM_NAMESPACE,
                   "--reset-values", "--wait", "--timeout", "4m",
                   "--kubeconfig", str(path.cluster.plane.kubeconfig)], values)  # fmt: skip
    assert result.code == 0, result.stderr


def previous_chart(commit: str, into: Path) -> Path:
    """The chart (and the CRD it links to) as it was at `commit`, from git."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "charts/guardedcron", "crds"],
                             capture_output=True, timeout=60, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, timeout=60, check=True)
    return into / "charts" / "guardedcron"


def build_workload_image(engine: DockerEngine, base: str, context: Path) -> str:
    """The e2e workload script on top of the guardedcron image (its Python and psycopg)."""
    context.mkdir(parents=True, exist_ok=True)
    (context / "workload.py").write_bytes(WORKLOAD_SCRIPT.read_bytes())
    (context / "Dockerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nCOPY workload.py /opt/guardedcron-node/workload.py\n"
        'ENTRYPOINT ["python", "/opt/guardedcron-node/workload.py"]\n'
    )
    result = engine.run("build", "--network", "host", "--build-arg", f"BASE={base}",
                        "--tag", WORKLOAD_IMAGE, str(context), timeout_s=600,
                        env={"DOCKER_BUILDKIT": "0"})  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return WORKLOAD_IMAGE


def prepare_database(db: ThrowawayPostgres) -> None:
    """The workload's tables. Not the guard's schema: the chart's migration hook makes it
    (`migration.enabled`, test_user_path.py's fixture)."""
    db.create_database("work")
    result = subprocess.run([sys.executable, str(WORKLOAD_SCRIPT), "--setup"], capture_output=True,
                            text=True, timeout=120, check=False,
                            env={**os.environ, "WORKLOAD_DSN": db.dsn("work")})  # fmt: skip
    assert result.returncode == 0, result.stderr


def schema_version(path: UserPath) -> int | None:
    """The guard's schema version in the tier's database, as `db status` reads it; None
    before any migration."""
    [(exists,)] = path.query("SELECT to_regclass('guardedcron.schema_migrations') IS NOT NULL")
    if not exists:
        return None
    [(version,)] = path.query("SELECT coalesce(max(version), 0) FROM guardedcron.schema_migrations")
    return int(version)


def migration_values(path: UserPath) -> dict[str, Any]:
    """The chart's migration hook, with a Secret in the release's namespace holding the
    DSN the pods use (made here once)."""
    try:
        path.get("secret", MIGRATION_SECRET, "-n", SYSTEM_NAMESPACE)
    except KubectlError:
        path.kubectl("create", "secret", "generic", MIGRATION_SECRET, "-n", SYSTEM_NAMESPACE,
                     f"--from-literal=dsn={path.pod_dsn}")  # fmt: skip
    return {"enabled": True, "databaseSecretRef": {"name": MIGRATION_SECRET, "key": "dsn"}}


def workload_container(*, items: int = 3, gate: bool = False) -> dict[str, Any]:
    """The e2e workload; `gate`: it stalls after its first item until the test opens the
    gate for its Job (`UserPath.open_gate`)."""
    args = ["--run-dir", contract.RUN_DIR, "--job", "$(JOB_NAME)", "--items", str(items)]
    return {
        "name": WORKLOAD_CONTAINER,
        "image": WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "args": [*args, "--gate"] if gate else args,
        "env": [
            {"name": "JOB_NAME", "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.labels['{contract.LABEL_JOB_NAME}']"}}},
            {"name": "WORKLOAD_DSN", "valueFrom": {"secretKeyRef": {"name": DSN_SECRET, "key": "dsn"}}},
        ],
        "securityContext": RESTRICTED_CONTAINER,
    }  # fmt: skip


def guarded_cronjob(name: str, namespace: str, *, lease: Mapping[str, Any] | None = None,
                    container: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A GuardedCronJob that never fires by itself within a test (runs are made by hand)."""
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedule": "0 0 1 1 *",
            "lease": {"databaseSecretRef": {"name": DSN_SECRET}, **(lease or {})},
            "jobTemplate": {"spec": {"template": {"spec": {
                "containers": [dict(container or workload_container())],
            }}}},
        },
    }  # fmt: skip
