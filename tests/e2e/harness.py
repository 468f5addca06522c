"""What the e2e scenarios share: clusters with a process-kubelet, one database, manifests.

A `Cluster` is one real control plane (tests/e2e/conftest.py starts them) seen through
the admin's kubectl and a small JSON client. A test asks its `Scenario` for a
namespace; the scenario creates it in each cluster it names, with the DSN Secret, and
starts a process-kubelet (guardedcron_devenv.kubelet) serving exactly that namespace
there, so tests never run each other's pods. At the end of the test the kubelets stop
(their processes get SIGTERM, then SIGKILL) and the namespaces are deleted.

The process-kubelet maps two image names to host commands: the guard image the
operator puts into every CronJob (the real `guardedcron` command of this checkout's
venv) and the workload image (tests/e2e/workload.py run by this venv's Python).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml

from guardedcron import contract
from guardedcron.spec.locks import namespace_lock, shared_lock
from guardedcron.spec.settings import DEFAULT_GUARD_IMAGE, ENV_CLUSTER_NAME
from guardedcron_devenv.admin_api import AdminApi, ApiError
from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.kubelet import Image, ProcessKubelet
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
CHART_DIR = REPO / "charts" / "guardedcron"
WORKLOAD_SCRIPT = Path(__file__).with_name("workload.py")
VENV_BIN = Path(sys.executable).parent
GUARDEDCRON = str(VENV_BIN / "guardedcron")

GUARD_IMAGE = DEFAULT_GUARD_IMAGE  # what the operator and `render` put into CronJobs
WORKLOAD_IMAGE = "localhost/guardedcron-e2e-workload:dev"
WORKLOAD_CONTAINER = "work"
# Cluster names double as GUARDEDCRON_CLUSTER_NAME, the prefix of every lease holder.
EAST, WEST = "east", "west"
DSN_SECRET = "e2e-db"
DSN_KEY = "dsn"
# A stalled workload outlives its pod's deadline within the grace period, as with a kubelet.
GRACE_SECONDS_CAP = 30.0

# Sections added to a failed e2e test's report: (title, text source); see conftest.py.
FAILURE_LOGS: list[tuple[str, Callable[[], str]]] = []

_serial = itertools.count(1)


def images(guard_images: Sequence[str] = ()) -> dict[str, Image]:
    """The process-kubelet's images: every name the guard may carry (render's default
    and the chart's), and the workload."""
    guard = Image(entrypoint=["guardedcron"])
    return {
        **{name: guard for name in (GUARD_IMAGE, *guard_images)},
        WORKLOAD_IMAGE: Image(entrypoint=[sys.executable, str(WORKLOAD_SCRIPT)]),
    }


def crd_source() -> Path:
    """What `kubectl apply -f` gets: the CRD file render uses ($GUARDEDCRON_CRD), else crds/."""
    return Path(os.environ.get("GUARDEDCRON_CRD") or CRD_DIR)


# --- manifests ----------------------------------------------------------------------------


def workload_container(*, items: int = 3, gate: bool = False,
                       ignore_sigterm: bool = False) -> dict[str, Any]:
    args = ["--run-dir", contract.RUN_DIR, "--job", "$(JOB_NAME)", "--items", str(items)]
    if gate:
        args.append("--gate")
    if ignore_sigterm:
        args.append("--ignore-sigterm")
    return {
        "name": WORKLOAD_CONTAINER,
        "image": WORKLOAD_IMAGE,
        "args": args,
        "env": [
            {"name": "JOB_NAME", "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.labels['{contract.LABEL_JOB_NAME}']"}}},
            {"name": "WORKLOAD_DSN", "valueFrom": {"secretKeyRef": {
                "name": DSN_SECRET, "key": DSN_KEY}}},
        ],
    }


def guarded_cronjob(name: str, namespace: str, *, schedule: str = "* * * * *",
                    lease: Mapping[str, Any] | None = None,
                    spec: Mapping[str, Any] | None = None,
                    container: Mapping[str, Any] | None = None,
                    pod_spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A GuardedCronJob running the e2e workload; `lease`/`spec`/`pod_spec` add fields."""
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedule": schedule,
            "lease": {"databaseSecretRef": {"name": DSN_SECRET}, **(lease or {})},
            "jobTemplate": {"spec": {"template": {"spec": {
                "containers": [dict(container or workload_container())],
                **(pod_spec or {}),
            }}}},
            **(spec or {}),
        },
    }


def first_difference(wanted: Any, live: Any, path: str = "") -> str | None:
    """Where `live` does not hold `wanted`: mappings may carry more keys (server defaults),
    lists must match item by item. None when every wanted value is there."""
    if isinstance(wanted, Mapping):
        if not isinstance(live, Mapping):
            return f"{path or '.'}: {live!r} is not a mapping"
        for key, value in wanted.items():
            if key not in live:
                return f"{path}.{key}: missing"
            found = first_difference(value, live[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(wanted, list):
        if not isinstance(live, list) or len(live) != len(wanted):
            return f"{path}: {live!r} is not a list of {len(wanted)} items"
        for index, (want, have) in enumerate(zip(wanted, live, strict=True)):
            found = first_difference(want, have, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if wanted == live else f"{path}: {live!r}, expected {wanted!r}"


def lock_of(gcj: Mapping[str, Any]) -> str:
    """The lock a GuardedCronJob's runs take (guardedcron.spec.locks)."""
    lease, metadata = gcj["spec"]["lease"], gcj["metadata"]
    if lease.get("sharedLock"):
        return shared_lock(str(lease["sharedLock"]))
    return namespace_lock(str(metadata["namespace"]), str(lease.get("name") or metadata["name"]))


def slot_job_name(cronjob: str, slot: int) -> str:
    """The name the CronJob controller gives the Job of a scheduled minute."""
    return f"{cronjob}-{slot}"


def current_slot() -> int:
    return int(time.time() // 60)


# --- the shared database ---------------------------------------------------------------


@dataclass(frozen=True)
class WorkRow:
    dedupe_key: str
    item: int
    holder: str
    fence: int
    job: str


class WorkDb:
    """The e2e tables the workload writes (see workload.py) and the guard's own tables."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def work(self, lock: str) -> list[WorkRow]:
        rows = self.query(
            "SELECT dedupe_key, item, holder, fence, job FROM e2e_work WHERE lock = %s"
            " ORDER BY id", (lock,))
        return [WorkRow(*row) for row in rows]

    def duplicated_keys(self, lock: str) -> dict[str, int]:
        rows = self.query(
            "SELECT dedupe_key, count(*) FROM e2e_work WHERE lock = %s"
            " GROUP BY dedupe_key HAVING count(*) > 1", (lock,))
        return {key: count for key, count in rows}

    def rejections(self, lock: str) -> list[tuple[str, int, str, int, str]]:
        """(holder, fence, job, item, reason) of each refused fenced write."""
        return [(r[0], r[1], r[2], r[3], r[4]) for r in self.query(
            "SELECT holder, fence, job, item, reason FROM e2e_rejections WHERE lock = %s"
            " ORDER BY at", (lock,))]

    def lease(self, lock: str) -> dict[str, Any] | None:
        rows = self.query(
            "SELECT holder, fence, locked_until, locked_until <= clock_timestamp()"
            " FROM guardedcron.leases WHERE lock_name = %s", (lock,))
        if not rows:
            return None
        holder, fence, locked_until, expired = rows[0]
        return {"holder": holder, "fence": fence, "locked_until": locked_until,
                "expired": expired}

    def guard_runs(self, lock: str) -> list[dict[str, Any]]:
        """The guard's run history of `lock`, oldest first."""
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(
                "SELECT * FROM guardedcron.runs WHERE lock_name = %s ORDER BY id", (lock,))
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def open_gate(self, job: str) -> None:
        self.query("INSERT INTO e2e_gates (job) VALUES (%s) ON CONFLICT DO NOTHING RETURNING job",
                   (job,))


# --- clusters -------------------------------------------------------------------------


def job_finished(job: Mapping[str, Any]) -> str | None:
    """'Complete' or 'Failed' once the Job controller has decided, else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return str(condition["type"])
    return None


def job_condition(job: Mapping[str, Any], kind: str) -> dict[str, Any]:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition["type"] == kind:
            return dict(condition)
    raise AssertionError(f"job {job['metadata']['name']} has no {kind} condition: "
                         f"{json.dumps(job.get('status'))}")


def container_status(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    status = pod.get("status") or {}
    for item in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []):
        if item["name"] == name:
            return dict(item)
    raise AssertionError(f"pod {pod['metadata']['name']} has no status for container {name}")


def terminated(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    state = container_status(pod, name)["state"]
    assert "terminated" in state, f"container {name} has not terminated: {state}"
    return dict(state["terminated"])


def termination_json(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    message: str = terminated(pod, name).get("message", "")
    try:
        parsed: dict[str, Any] = json.loads(message)
    except ValueError:
        raise AssertionError(f"container {name}'s termination message is not JSON: "
                             f"{message!r}") from None
    return parsed


@dataclass
class Cluster:
    """One running control plane; `name` is also its GUARDEDCRON_CLUSTER_NAME."""

    name: str
    plane: ControlPlane
    dsn: str

    def __post_init__(self) -> None:
        self.api = AdminApi(self.plane.server, self.plane.ca_file, self.plane.admin_cert_file,
                            self.plane.admin_key_file)

    def kubectl(self, *args: str, input: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.plane.kubectl(*args, input=input, check=check)

    def get(self, path: str) -> dict[str, Any] | None:
        """GET an API path; None when the object does not exist."""
        try:
            found: dict[str, Any] = self.api.get(path)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        return found

    def apply(self, *objects: Mapping[str, Any]) -> None:
        text = "\n---\n".join(json.dumps(o) for o in objects)
        self.kubectl("apply", "-f", "-", input=text)

    def apply_crds(self) -> None:
        self.kubectl("apply", "-f", str(crd_source()))
        self.plane.wait_established(f"{contract.PLURAL}.{contract.API_GROUP}")

    def create_namespace(self, namespace: str) -> None:
        self.kubectl("create", "namespace", namespace)
        # Pods are refused until the service-account controller has made "default" here.
        wait_for(f"service account default exists in {namespace} ({self.name})",
                 lambda: self.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"))
        self.kubectl("create", "secret", "generic", DSN_SECRET, "-n", namespace,
                     f"--from-literal={DSN_KEY}={self.dsn}")

    def render(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """`guardedcron render` of one GuardedCronJob, with this cluster's name as the
        operator here would have it."""
        env = {**os.environ, ENV_CLUSTER_NAME: self.name}
        result = subprocess.run([GUARDEDCRON, "render", "-f", "-"], input=json.dumps(manifest),
                                capture_output=True, text=True, env=env, timeout=60,
                                check=False)
        assert result.returncode == 0, f"render failed: {result.stderr}"
        [cronjob] = list(yaml.safe_load_all(result.stdout))
        return dict(cronjob)

    def create_job_from(self, namespace: str, cronjob: str, job: str) -> None:
        """`kubectl create job --from=cronjob/...`: a run without waiting for the schedule."""
        self.kubectl("create", "job", job, f"--from=cronjob/{cronjob}", "-n", namespace)

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")

    def jobs(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api.get(
            f"/apis/batch/v1/namespaces/{namespace}/jobs")["items"]
        return items

    def wait_job_finished(self, namespace: str, name: str,
                          timeout: float = 120.0) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            job = self.job(namespace, name)
            return job if job is not None and job_finished(job) else None

        return wait_for(f"job {namespace}/{name} finishes in {self.name}", finished, timeout)

    def pods_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api.get(
            f"/api/v1/namespaces/{namespace}/pods",
            labelSelector=f"{contract.LABEL_JOB_NAME}={job}")["items"]
        return items

    def pod_of(self, namespace: str, job: str) -> dict[str, Any]:
        pods = self.pods_of(namespace, job)
        assert len(pods) == 1, f"job {job} has {len(pods)} pods in {self.name}, expected one"
        return pods[0]


class Scenario:
    """One test's namespaces, kubelets and clean-up across the clusters it uses."""

    def __init__(self, clusters: Mapping[str, Cluster], db: WorkDb,
                 guard_images: Sequence[str] = ()) -> None:
        self.clusters = clusters
        self.db = db
        self.guard_images = tuple(guard_images)
        self._stack = ExitStack()
        self._kubelets: list[tuple[Cluster, str, ProcessKubelet]] = []

    def __enter__(self) -> Scenario:
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()

    def namespace(self, prefix: str, clusters: Sequence[Cluster], *, exact: bool = False) -> str:
        """A new namespace of the same name in each of `clusters`, served by a kubelet;
        named `prefix` itself with `exact` (for settings that list namespaces)."""
        namespace = prefix if exact else f"{prefix}-{next(_serial)}-{uuid.uuid4().hex[:5]}"
        for cluster in clusters:
            cluster.create_namespace(namespace)
            self._stack.callback(cluster.kubectl, "delete", "namespace", namespace,
                                 "--wait=false", check=False)
            kubelet = ProcessKubelet(
                cluster.api, images(self.guard_images), namespaces=[namespace], extra_path=[str(VENV_BIN)],
                keep_pod_dirs=True, report=lambda line: print(line, flush=True),
                max_grace_seconds=GRACE_SECONDS_CAP,
            )
            kubelet.start()
            self._stack.callback(kubelet.stop)
            self._kubelets.append((cluster, namespace, kubelet))
        return namespace

    def container_logs(self) -> str:
        """Every container's output of this test's pods, for a failure report."""
        parts = []
        for cluster, namespace, kubelet in self._kubelets:
            try:
                pods = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
            except Exception as exc:  # a report must not hide the test's own failure
                parts.append(f"[{cluster.name}] cannot list pods: {exc}")
                continue
            for pod in pods:
                spec = pod["spec"]
                for container in (spec.get("initContainers") or []) + spec["containers"]:
                    name = pod["metadata"]["name"]
                    log = kubelet.container_log(namespace, name, container["name"])
                    parts.append(f"[{cluster.name}] {namespace}/{name} {container['name']}:\n"
                                 f"{log.rstrip()}")
        return "\n".join(parts)


def iter_yaml(text: str) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(text):
        if isinstance(document, dict):
            yield document
