"""Smoke tests of the local control plane: the real API server and controllers do their part.

These are the behaviours the operator's e2e suite leans on and an emulator cannot give:
CEL validation, RBAC, the Job and CronJob controllers, garbage collection, two clusters
at once.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from guardedcron_devenv.admin_api import AdminApi
from guardedcron_devenv.controlplane import ControlPlane, KubectlError
from guardedcron_devenv.kubelet import Image, ProcessKubelet

pytestmark = pytest.mark.e2e

_names = itertools.count(1)

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.guardedcron.io
spec:
  group: smoke.guardedcron.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                low: {type: integer}
                high: {type: integer}
              x-kubernetes-validations:
                - rule: "self.low <= self.high"
                  message: "low must not be greater than high"
"""


def widget(namespace: str, name: str, low: int, high: int) -> str:
    return json.dumps(
        {
            "apiVersion": "smoke.guardedcron.io/v1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"low": low, "high": high},
        }
    )


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.5)


def fresh_namespace(cluster: ControlPlane) -> str:
    name = f"smoke-{next(_names)}-{int(time.time())}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the service-account controller has made "default" here.
    wait_for(
        f"service account default exists in {name}",
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False)
        .returncode == 0,
    )
    return name


def items(cluster: ControlPlane, *args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cluster.kubectl_json("get", *args)["items"]
    return found


def test_cel_rule_of_a_crd_rejects_a_violating_object(control_plane: ControlPlane) -> None:
    namespace = fresh_namespace(control_plane)
    control_plane.kubectl("apply", "-f", "-", input=WIDGET_CRD)
    control_plane.wait_established("widgets.smoke.guardedcron.io")
    # Discovery of the new resource lags a little behind Established.
    wait_for(
        "kubectl knows the widgets resource",
        lambda: control_plane.kubectl("get", "widgets", "-n", namespace, check=False).returncode
        == 0,
    )

    control_plane.kubectl("apply", "-f", "-", input=widget(namespace, "fine", 1, 2))

    with pytest.raises(KubectlError) as rejected:
        control_plane.kubectl("apply", "-f", "-", input=widget(namespace, "inverted", 3, 2))
    assert "low must not be greater than high" in str(rejected.value)
    listed = items(control_plane, "widgets", "-n", namespace)
    assert [w["metadata"]["name"] for w in listed] == ["fine"]


def test_job_and_cronjob_controllers_create_pods(control_plane: ControlPlane) -> None:
    namespace = fresh_namespace(control_plane)
    control_plane.kubectl(
        "create", "cronjob", "tick", "-n", namespace,
        "--image=registry.invalid/never-pulled", "--schedule=* * * * *", "--", "true",
    )  # fmt: skip
    control_plane.kubectl("create", "job", "by-hand", "--from=cronjob/tick", "-n", namespace)

    def pods_of(job: str) -> list[dict[str, Any]]:
        return items(control_plane, "pods", "-n", namespace, "-l", f"job-name={job}")

    wait_for("the job controller creates a pod for by-hand", lambda: bool(pods_of("by-hand")))
    [pod] = pods_of("by-hand")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert pod["metadata"]["ownerReferences"][0]["name"] == "by-hand"
    # No scheduler and no kubelet: the pod waits to be bound, as the process-kubelet will.
    assert pod["status"].get("phase") == "Pending"
    assert "nodeName" not in pod["spec"]

    # The CronJob controller fires at the next minute boundary, so this waits up to a minute.
    def scheduled_jobs() -> list[dict[str, Any]]:
        return [
            job
            for job in items(control_plane, "jobs", "-n", namespace)
            if job["metadata"]["name"] != "by-hand"
        ]

    wait_for("the cronjob controller schedules a job", lambda: bool(scheduled_jobs()), 90)
    job = scheduled_jobs()[0]
    assert job["metadata"]["ownerReferences"][0]["name"] == "tick"
    assert "batch.kubernetes.io/cronjob-scheduled-timestamp" in job["metadata"]["annotations"]
    wait_for(
        "the scheduled job gets its pod",
        lambda: bool(pods_of(job["metadata"]["name"])),
    )


def test_garbage_collector_removes_dependents_of_a_deleted_owner(
    control_plane: ControlPlane,
) -> None:
    namespace = fresh_namespace(control_plane)
    control_plane.kubectl("create", "configmap", "owner", "-n", namespace)
    owner_uid = control_plane.kubectl_json("get", "configmap", "owner", "-n", namespace)[
        "metadata"
    ]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}
            ],
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(dependent))

    control_plane.kubectl("delete", "configmap", "owner", "-n", namespace, "--wait=true")

    def dependent_gone() -> bool:
        found = control_plane.kubectl(
            "get", "configmap", "dependent", "-n", namespace, "--ignore-not-found", "-o", "name"
        )
        return found.stdout.strip() == ""

    wait_for("the garbage collector deletes the dependent", dependent_gone)


def test_two_control_planes_run_at_once_and_stay_apart(
    control_plane: ControlPlane, control_plane_factory: Callable[[str], ControlPlane]
) -> None:
    second = control_plane_factory("secondary")
    assert second.server != control_plane.server
    assert second.etcd_url != control_plane.etcd_url

    namespace = fresh_namespace(control_plane)
    absent = second.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name")
    assert absent.stdout.strip() == ""

    # Each cluster has its own CA: the second's admin cannot even connect to the first.
    crossed = second.kubectl("--server", control_plane.server, "get", "namespaces", check=False)
    assert crossed.returncode != 0
    assert "certificate" in crossed.stderr

    # The same name is free in the second cluster: two stores, not one.
    second.kubectl("create", "namespace", namespace)
    for cluster in (control_plane, second):
        assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"


def test_rbac_confines_a_service_account_token(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    namespace = fresh_namespace(control_plane)
    control_plane.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    control_plane.kubectl(
        "create", "role", "read-configmaps", "-n", namespace, "--verb=get,list",
        "--resource=configmaps",
    )  # fmt: skip
    control_plane.kubectl(
        "create", "rolebinding", "reader", "-n", namespace, "--role=read-configmaps",
        f"--serviceaccount={namespace}:reader",
    )  # fmt: skip
    token = control_plane.kubectl("create", "token", "reader", "-n", namespace).stdout.strip()
    kubeconfig = control_plane.write_token_kubeconfig(tmp_path / "reader.kubeconfig", token)

    def as_reader(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(control_plane.kubectl_path), f"--kubeconfig={kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    whoami = as_reader("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert whoami.stdout == f"system:serviceaccount:{namespace}:reader", whoami.stderr
    assert as_reader("get", "configmaps", "-n", namespace).returncode == 0
    denied = as_reader("get", "secrets", "-n", namespace)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()


def test_the_process_kubelet_starts_the_workload_once_a_sidecars_startup_probe_passes(
    control_plane: ControlPlane,
) -> None:
    """The stand-in keeps the kubelet's order that the keeper's startupProbe relies on
    (tests/node shows the real kubelet's): a sidecar whose probe passes only after 3 s
    holds the main container back until then."""
    namespace = fresh_namespace(control_plane)
    api = AdminApi(control_plane.server, control_plane.ca_file, control_plane.admin_cert_file,
                   control_plane.admin_key_file)
    shared = [{"name": "run", "mountPath": "/run/shared"}]

    def container(name: str, script: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "image": "shell", "command": ["sh", "-c", script],
                "volumeMounts": shared, **extra}  # fmt: skip

    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "probed-sidecar", "namespace": namespace},
           "spec": {"restartPolicy": "Never", "volumes": [{"name": "run", "emptyDir": {}}],
                    "initContainers": [container(
                        "sidecar", "sleep 3; touch /run/shared/ready; exec sleep 3600",
                        restartPolicy="Always",
                        startupProbe={"exec": {"command": ["test", "-e", "/run/shared/ready"]},
                                      "periodSeconds": 1, "failureThreshold": 60})],
                    "containers": [container("main", "test -e /run/shared/ready")]}}  # fmt: skip
    with ProcessKubelet(api, {"shell": Image(entrypoint=["sh"])}, namespaces=[namespace],
                        report=lambda line: None):
        api.post(f"/api/v1/namespaces/{namespace}/pods", pod)

        def finished() -> dict[str, Any] | None:
            live: dict[str, Any] = api.get(f"/api/v1/namespaces/{namespace}/pods/probed-sidecar")
            return live if live.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        wait_for("the pod finishes", lambda: finished() is not None)
        live = finished()
    assert live is not None
    [main] = live["status"]["containerStatuses"]
    assert main["state"]["terminated"]["exitCode"] == 0, live["status"]
    assert live["status"]["phase"] == "Succeeded"
