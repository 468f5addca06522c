"""The Helm chart installed into a real kube-apiserver + controller-manager: the API
server accepts every object, the RBAC means what the unit tests read from it (asked
of the real authorizer with `kubectl auth can-i`), the pod passes the `restricted`
Pod Security admission, the peering hook finds its CRD, and uninstall keeps CRDs.
What gets installed is the chart archive `make release` publishes, packaged by the same
code (guardedcron_devenv.release.package_chart)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.release import package_chart
from tests.support import REPO
from tests.support.chart import HelmResult, helm

pytestmark = pytest.mark.e2e

NAMESPACE = "gc-system"
PEERED_NAMESPACE = "gc-peered"
TEAMS = ("gc-team-a", "gc-team-b")
OUTSIDER = "gc-outsider"


def helm_on(plane: ControlPlane, args: list[str], values: dict[str, Any] | None = None) -> HelmResult:
    return helm([*args, "--kubeconfig", str(plane.kubeconfig)], values)


def install(plane: ControlPlane, chart: Path, release: str, namespace: str, values: dict[str, Any]) -> None:
    # --reset-values: with no values given, helm upgrade would reuse the last ones.
    result = helm_on(plane, ["upgrade", "--install", release, str(chart), "--namespace", namespace,
                             "--reset-values", "--timeout", "2m"], values)
    assert result.code == 0, result.stderr


def can(plane: ControlPlane, account: str, namespace: str, verb: str, resource: str,
        where: str | None = None) -> bool:
    """Ask the API server's authorizer (a SubjectAccessReview) whether the service
    account may do `verb` on `resource[.group][/subresource]`, in `where` or everywhere.
    Unlike `kubectl auth can-i`, this works before the resource's CRD exists."""
    name, _, subresource = resource.partition("/")
    plural, _, group = name.partition(".")
    attributes = {"verb": verb, "resource": plural, "group": group, "subresource": subresource}
    if where is not None:
        attributes["namespace"] = where
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{account}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                       "system:authenticated"],
            "resourceAttributes": attributes,
        },
    }
    answer = plane.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review))
    return bool(json.loads(answer.stdout)["status"].get("allowed"))


def eventually(check: Callable[[], bool], seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.fixture(scope="module")
def packaged_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return package_chart(REPO, tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, packaged_chart: Path) -> Iterator[ControlPlane]:
    for namespace in (NAMESPACE, PEERED_NAMESPACE, *TEAMS, OUTSIDER):
        control_plane.kubectl("create", "namespace", namespace)
    # Pods of the operator must pass the strictest Pod Security level.
    control_plane.kubectl("label", "namespace", NAMESPACE,
                          "pod-security.kubernetes.io/enforce=restricted")
    install(control_plane, packaged_chart, "gc", NAMESPACE, {})
    yield control_plane


def test_cluster_wide_rbac_as_the_authorizer_sees_it(cluster: ControlPlane) -> None:
    account = "gc-guardedcron"
    allowed = [
        ("list", "guardedcronjobs.guardedcron.io"), ("watch", "guardedcronjobs.guardedcron.io"),
        ("patch", "guardedcronjobs.guardedcron.io/status"), ("create", "cronjobs.batch"),
        ("patch", "cronjobs.batch"), ("create", "jobs.batch"), ("watch", "pods"),
        # a CronJob whose runs would take a lock its namespace may no longer use
        ("delete", "cronjobs.batch"),
        # a skipped run's Job, once status records the skip
        ("delete", "jobs.batch"),
        ("create", "events"), ("create", "events.events.k8s.io"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ]
    refused = [
        ("delete", "pods"),
        ("get", "secrets"), ("list", "secrets"), ("create", "guardedcronjobs.guardedcron.io"),
        ("update", "guardedcronjobs.guardedcron.io"), ("list", "namespaces"),
        ("patch", "clusterkopfpeerings.kopf.dev"),
    ]
    for verb, resource in allowed:
        assert can(cluster, account, NAMESPACE, verb, resource), (verb, resource)
    for verb, resource in refused:
        assert not can(cluster, account, NAMESPACE, verb, resource), (verb, resource)


def test_operator_pod_passes_restricted_pod_security(cluster: ControlPlane) -> None:
    """The Deployment's pod, created (server-side dry run) in a namespace that enforces
    the restricted level: admission lets it in, and refuses a weakened copy."""
    deployment = cluster.kubectl_json("get", "deployment", "gc-guardedcron", "-n", NAMESPACE)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "gc-pss-probe", "namespace": NAMESPACE},
           "spec": deployment["spec"]["template"]["spec"]}
    admitted = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod),
                               check=False)
    assert admitted.returncode == 0, admitted.stderr
    assert "violate" not in admitted.stderr  # not even a warning
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod),
                              check=False)
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr


def test_outcome_recording_grants_get_on_secrets_only(cluster: ControlPlane, packaged_chart: Path) -> None:
    install(cluster, packaged_chart, "gc", NAMESPACE, {"outcomeRecording": {"enabled": True}})
    try:
        assert eventually(lambda: can(cluster, "gc-guardedcron", NAMESPACE, "get", "secrets",
                                      where=TEAMS[0]))
        assert not can(cluster, "gc-guardedcron", NAMESPACE, "list", "secrets", where=TEAMS[0])
        assert not can(cluster, "gc-guardedcron", NAMESPACE, "watch", "secrets", where=TEAMS[0])
    finally:
        install(cluster, packaged_chart, "gc", NAMESPACE, {})
    # The authorizer reads roles from a watch cache: give the revocation a moment.
    assert eventually(lambda: not can(cluster, "gc-guardedcron", NAMESPACE, "get", "secrets",
                                      where=TEAMS[0]))


def test_namespaced_install_reaches_only_its_namespaces(cluster: ControlPlane, packaged_chart: Path) -> None:
    values = {"watchNamespaces": list(TEAMS), "crds": {"enabled": False},
              "peering": {"enabled": True, "name": "gc-teams", "installCRDs": False},
              "replicaCount": 2}
    # The kopf CRDs come from the peered release below; install it first if needed.
    install(cluster, packaged_chart, "gc-peered", PEERED_NAMESPACE,
            {"crds": {"enabled": False}, "replicaCount": 2, "peering": {"enabled": True}})
    install(cluster, packaged_chart, "gc-teams", PEERED_NAMESPACE, values)
    account = "gc-teams-guardedcron"
    for team in TEAMS:
        assert can(cluster, account, PEERED_NAMESPACE, "watch", "guardedcronjobs.guardedcron.io", team)
        assert can(cluster, account, PEERED_NAMESPACE, "patch", "kopfpeerings.kopf.dev", team)
        peering = cluster.kubectl_json("get", "kopfpeering", "gc-teams", "-n", team)
        assert peering["kind"] == "KopfPeering"
    assert not can(cluster, account, PEERED_NAMESPACE, "watch", "guardedcronjobs.guardedcron.io",
                   OUTSIDER)
    assert not can(cluster, account, PEERED_NAMESPACE, "list",
                   "customresourcedefinitions.apiextensions.k8s.io")
    assert not can(cluster, account, PEERED_NAMESPACE, "list", "guardedcronjobs.guardedcron.io")


def test_peering_object_is_created_once_its_crd_exists(cluster: ControlPlane, packaged_chart: Path) -> None:
    install(cluster, packaged_chart, "gc-peered", PEERED_NAMESPACE,
            {"crds": {"enabled": False}, "replicaCount": 2, "peering": {"enabled": True}})
    peering = cluster.kubectl_json("get", "clusterkopfpeering", "guardedcron")
    assert peering["metadata"]["labels"]["app.kubernetes.io/instance"] == "gc-peered"
    assert can(cluster, "gc-peered-guardedcron", PEERED_NAMESPACE, "patch",
               "clusterkopfpeerings.kopf.dev")
    deployment = cluster.kubectl_json("get", "deployment", "gc-peered-guardedcron",
                                      "-n", PEERED_NAMESPACE)
    assert deployment["spec"]["replicas"] == 2


def test_uninstall_keeps_the_crds(cluster: ControlPlane) -> None:
    before = {crd["metadata"]["name"] for crd in cluster.kubectl_json("get", "crd")["items"]}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= before
    for release, namespace in (("gc-teams", PEERED_NAMESPACE), ("gc-peered", PEERED_NAMESPACE),
                               ("gc", NAMESPACE)):
        result = helm_on(cluster, ["uninstall", release, "--namespace", namespace])
        assert result.code == 0, result.stderr
    after = {crd["metadata"]["name"] for crd in cluster.kubectl_json("get", "crd")["items"]}
    assert before <= after
    assert cluster.kubectl("get", "clusterrole", "gc-guardedcron", check=False).returncode != 0
