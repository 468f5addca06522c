"""`guardedcron demo`: two local clusters, one database, one guarded job.

It shows the product's promise on a machine with no cluster: the same
GuardedCronJob is declared in two clusters (as two clusters syncing the same Git
repository would), both CronJobs fire every minute, and each minute exactly one
workload charges its invoice batch while the other run is Skipped, naming the
winner. Everything is real but the kubelet: PostgreSQL, etcd, kube-apiserver,
kube-controller-manager (CronJob and Job controllers), the operator, the guard; pods
run as local processes under the process-kubelet stand-in. Ctrl-C tears it all down.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardedcron.contract import (
    API_GROUP,
    API_VERSION,
    ENV_DSN,
    PLURAL,
    RUN_DIR,
    AcquireReason,
)
from guardedcron.status.runs import SLOT_CLAIMED_WORDS
from guardedcron_devenv.admin_api import AdminApi, ApiError
from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.demo_workload import INVOICE_TABLE
from guardedcron_devenv.kubelet import Image, ProcessKubelet
from guardedcron_devenv.postgres import ThrowawayPostgres

NAMESPACE = "billing"
JOB = "nightly-invoices"
WORKLOAD_IMAGE = "guardedcron-demo/invoices:1"
REPO = Path(__file__).resolve().parents[3]
Say = Callable[[str], None]
GCJ_PATH = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{NAMESPACE}/{PLURAL}/{JOB}"


def demo_guarded_cronjob() -> dict[str, Any]:
    """Every minute (so the demo shows a run soon); the lease outlasts the deadline."""
    return {
        "apiVersion": "guardedcron.io/v1alpha1",
        "kind": "GuardedCronJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {
            "schedule": "* * * * *",
            "startingDeadlineSeconds": 30,
            "activeDeadlineSeconds": 30,
            "lease": {"databaseSecretRef": {"name": "jobs-db", "key": "dsn"}, "durationSeconds": 45},
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "task",
                                    "image": WORKLOAD_IMAGE,
                                    "env": [
                                        {
                                            "name": ENV_DSN,
                                            "valueFrom": {"secretKeyRef": {"name": "jobs-db", "key": "dsn"}},
                                        },
                                        # Spelled out so the process-kubelet maps it to its host folder.
                                        {"name": "GUARDEDCRON_RUN_DIR", "value": RUN_DIR},
                                    ],
                                }
                            ]
                        }
                    }
                }
            },
        },
    }


@dataclass
class Cluster:
    name: str
    plane: ControlPlane
    api: AdminApi
    kubelet: ProcessKubelet
    operator: subprocess.Popen[bytes]
    operator_log: Path
    reported: set[str] = field(default_factory=set)


def crds_dir() -> Path:
    from_env = os.environ.get("GUARDEDCRON_CRD")
    return Path(from_env).parent if from_env else REPO / "crds"


def start_cluster(name: str, dsn: str, plane: ControlPlane, stack: ExitStack, say: Say) -> Cluster:
    plane.kubectl("apply", "-f", str(crds_dir()))
    plane.wait_established("guardedcronjobs.guardedcron.io")
    api = AdminApi(plane.server, plane.ca_file, plane.admin_cert_file, plane.admin_key_file)
    api.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    api.post(
        f"/api/v1/namespaces/{NAMESPACE}/secrets",
        {
            "metadata": {"name": "jobs-db"},
            "data": {"dsn": base64.b64encode(dsn.encode()).decode()},
        },
    )
    bin_dir = str(Path(sys.executable).parent)
    images = {
        guard_image(): Image(entrypoint=["guardedcron"]),
        WORKLOAD_IMAGE: Image(entrypoint=[sys.executable, "-m", "guardedcron_devenv.demo_workload"]),
    }
    kubelet = stack.enter_context(
        ProcessKubelet(
            api,
            images,
            namespaces=[NAMESPACE],
            node_name=f"{name}-node",
            extra_path=[bin_dir],
            keep_pod_dirs=True,  # removed with the kubelet; kept until then for failure output
            report=lambda line: say(f"[{name}] {line}"),
        )
    )
    log = plane.logs_dir / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "GUARDEDCRON_CLUSTER_NAME": name}
    with log.open("ab") as sink:
        operator = subprocess.Popen(
            [
                str(Path(bin_dir) / "guardedcron"),
                "operator",
                "--standalone",
                "--metrics-port",
                "0",
                "--namespace",
                NAMESPACE,
            ],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    stack.callback(stop_process, operator)
    return Cluster(name, plane, api, kubelet, operator, log)


def guard_image() -> str:
    from guardedcron.spec.settings import DEFAULTS, ENV_GUARD_IMAGE

    return os.environ.get(ENV_GUARD_IMAGE, DEFAULTS[ENV_GUARD_IMAGE])


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def describe_run(cluster: Cluster, run: dict[str, Any]) -> str | None:
    """One line for a finished run, as the GuardedCronJob's status records it (a skipped
    run's Job is removed once recorded, so the status is where every run ends up)."""
    if "finishedAt" not in run:
        return None
    name, outcome, fence = run["job"], run["outcome"], run.get("fence")
    if outcome == "Skipped":
        # The other cluster's run is either still holding the lease or already done with
        # this minute (it ended before this guard asked): both turn this run away.
        claimed = SLOT_CLAIMED_WORDS in run["reason"]
        why = AcquireReason.SLOT_CLAIMED if claimed else AcquireReason.LEASE_HELD
        verb = "ran this slot with" if claimed else "holds"
        return f"{name}: Skipped -- {why}: {run.get('holder')} {verb} fence {fence}"
    if outcome == "Succeeded":
        return f"{name}: guard won the lease with fence {fence} -> workload Succeeded"
    if fence is not None and outcome in ("Failed", "TimedOut"):
        pods = cluster.api.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"batch.kubernetes.io/job-name={name}"
        )["items"]
        output = "".join(
            cluster.kubelet.container_log(NAMESPACE, p["metadata"]["name"], "task") for p in pods
        )
        return f"{name}: guard won the lease with fence {fence} -> workload {outcome}:\n{output[-1500:]}"
    return f"{name}: {outcome} ({run['reason']})"


def run_demo(*, slots: int | None, say: Say = print, stop: threading.Event | None = None) -> int:
    """Run until `slots` scheduled minutes have been seen in both clusters (None: until Ctrl-C)."""
    from guardedcron.guard.migrations import migrate
    from guardedcron_devenv.binaries import ensure_binaries

    stop = stop or threading.Event()
    say("guardedcron demo: two clusters share one PostgreSQL; the same GuardedCronJob runs in both.")
    binaries = ensure_binaries(progress=say)
    with ExitStack() as stack:
        say("starting PostgreSQL ...")
        db = stack.enter_context(ThrowawayPostgres())
        import psycopg

        with psycopg.connect(db.dsn(), autocommit=True) as conn:
            migrate(conn)
            conn.execute(INVOICE_TABLE)
        clusters = []
        for name in ("east", "west"):
            say(f"starting cluster {name!r} (etcd, kube-apiserver, kube-controller-manager) ...")
            plane = stack.enter_context(ControlPlane(binaries, name=name, progress=say))
            clusters.append(start_cluster(name, db.dsn(), plane, stack, say))
        manifest = json.dumps(demo_guarded_cronjob())
        for cluster in clusters:
            cluster.plane.kubectl("apply", "-f", "-", input=manifest)
        say(
            f"applied GuardedCronJob {NAMESPACE}/{JOB} (schedule '* * * * *') in both clusters;"
            " waiting for the next minute ..."
        )
        return watch(clusters, db, slots, say, stop)


def watch(
    clusters: list[Cluster], db: ThrowawayPostgres, slots: int | None, say: Say, stop: threading.Event
) -> int:
    import psycopg

    seen_slots: dict[str, int] = {}
    completed = 0
    while not stop.is_set():
        for cluster in clusters:
            if cluster.operator.poll() is not None:
                say(
                    f"[{cluster.name}] the operator exited ({cluster.operator.returncode}); its log:\n"
                    + cluster.operator_log.read_text(errors="replace")[-3000:]
                )
                return 1
            try:
                gcj = cluster.api.get(GCJ_PATH)
            except ApiError as exc:
                say(f"[{cluster.name}] cannot read the GuardedCronJob: {exc}")
                continue
            for run in (gcj.get("status") or {}).get("recentRuns") or []:
                name = run["job"]
                line = None if name in cluster.reported else describe_run(cluster, run)
                if line is None:
                    continue
                cluster.reported.add(name)
                say(f"[{cluster.name}] {line}")
                seen_slots[name] = seen_slots.get(name, 0) + 1
                if seen_slots[name] == len(clusters):
                    completed += 1
                    say(status_table(clusters))
        if slots is not None and completed >= slots:
            break
        stop.wait(1.0)
    with psycopg.connect(db.dsn()) as conn:
        rows = conn.execute(
            "SELECT dedupe_key, count(*) FROM demo_invoice_batches GROUP BY 1 ORDER BY 1"
        ).fetchall()
    twice = [key for key, count in rows if count > 1]
    say(f"invoice batches charged: {len(rows)}; charged twice: {len(twice)}")
    return 1 if twice else 0


def status_table(clusters: list[Cluster]) -> str:
    lines = []
    for cluster in clusters:
        out = cluster.plane.kubectl("get", "gcj", "-n", NAMESPACE, check=False)
        lines.append(f"--- kubectl get gcj -n {NAMESPACE}   (cluster {cluster.name})\n{out.stdout.rstrip()}")
    return "\n".join(lines)


def main(slots: int | None) -> int:
    stop = threading.Event()

    def interrupt(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, interrupt)
    try:
        return run_demo(slots=slots, stop=stop)
    except KeyboardInterrupt:  # run_demo's ExitStack has torn everything down by now
        print("\ninterrupted; everything was torn down")
        return 130
