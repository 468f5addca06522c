"""`helm lint` and `helm template` over the chart's value sets, with the rendered
objects validated offline against the Kubernetes OpenAPI schemas."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from guardedcron.spec import settings_from_env
from tests.support.chart import (
    CHART,
    RELEASE_NAMESPACE,
    VALUE_SETS,
    by_kind,
    helm,
    one,
    render,
    restricted_violations,
    template,
)

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest
# schema set kubernetes-validate ships that we pin to.
KUBERNETES_VERSIONS = ("1.32.0", "1.35.0")
# Kinds from CRDs, checked by the tests below rather than by the built-in schemas.
CUSTOM_KINDS = {"ClusterKopfPeering", "KopfPeering", "ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_passes(name: str) -> None:
    result = helm(["lint", "--strict", str(CHART)], VALUE_SETS[name])
    assert result.code == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendered_objects_validate_against_kubernetes_schemas(name: str) -> None:
    objects = render(VALUE_SETS[name])
    builtin = [obj for obj in objects if obj["kind"] not in CUSTOM_KINDS]
    assert builtin, "nothing rendered"
    for obj in builtin:
        for version in KUBERNETES_VERSIONS:
            # strict: unknown fields are errors too, not only wrong types
            kubernetes_validate.validate(obj, version, strict=True)


def test_validation_catches_a_broken_object() -> None:
    """The schema check above is not vacuous: a misspelt field fails it."""
    deployment = copy.deepcopy(one(render(), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("name", ["peering", "peering-namespaced", "everything"])
def test_peering_objects_match_the_peering_crds_the_chart_installs(name: str) -> None:
    objects = render(VALUE_SETS[name])
    crds = {crd["spec"]["names"]["kind"]: crd for crd in by_kind(objects, "CustomResourceDefinition")}
    peerings = by_kind(objects, "ClusterKopfPeering") + by_kind(objects, "KopfPeering")
    assert peerings
    for peering in peerings:
        crd = crds[peering["kind"]]
        assert peering["apiVersion"] == f"{crd['spec']['group']}/v1"
        assert ("namespace" in peering["metadata"]) == (crd["spec"]["scope"] == "Namespaced")
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.validate(peering, schema)
        # a hook: Helm builds a release's objects before creating its CRDs
        assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]


def test_peering_uses_one_object_per_watched_namespace() -> None:
    objects = render(VALUE_SETS["peering-namespaced"])
    assert [p["metadata"]["namespace"] for p in by_kind(objects, "KopfPeering")] == ["billing"]
    assert not by_kind(objects, "ClusterKopfPeering")
    assert not by_kind(objects, "ClusterRole")


def test_default_install_is_standalone_with_recreate() -> None:
    objects = render()
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert env_of(deployment)["GUARDEDCRON_PEERING"] == ""
    groups = {crd["spec"]["group"] for crd in by_kind(objects, "CustomResourceDefinition")}
    assert "kopf.dev" not in groups


def test_two_replicas_get_distinct_priorities_from_their_pod_ip() -> None:
    deployment = one(render(VALUE_SETS["peering"]), "Deployment")
    env = env_of(deployment)
    assert deployment["spec"]["replicas"] == 2
    assert env["GUARDEDCRON_PEERING"] == "guardedcron"
    assert env["GUARDEDCRON_PRIORITY"] == "pod-ip"
    assert env["GUARDEDCRON_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_two_replicas_without_peering_are_refused() -> None:
    result = template({"replicaCount": 2})
    assert result.code != 0
    assert "replicaCount > 1 needs peering.enabled" in result.stderr


def test_operator_settings_reach_the_environment() -> None:
    deployment = one(render(VALUE_SETS["everything"]), "Deployment")
    env = env_of(deployment)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/guardedcron/guardedcron@sha256:" + "ab" * 32
    assert container["args"] == [
        "operator", "--liveness=http://0.0.0.0:8080/healthz", "--log-format=text",
    ]
    assert env["GUARDEDCRON_GUARD_IMAGE"] == "registry.example/guard:1.2.3"
    assert env["GUARDEDCRON_GUARD_CPU_LIMIT"] == ""  # left unset by the operator
    assert env["GUARDEDCRON_GUARD_MEMORY_LIMIT"] == "128Mi"
    assert env["GUARDEDCRON_GUARD_IMAGE_PULL_POLICY"] == "IfNotPresent"
    assert env["GUARDEDCRON_CLUSTER_NAME"] == "eu-west-1"
    assert env["GUARDEDCRON_OUTCOME_RECORDING"] == "true"
    assert env["GUARDEDCRON_STOP_WORKLOAD"] == "true"
    assert env["GUARDEDCRON_PEERING"] == "gc-peers"
    assert env["GUARDEDCRON_METRICS_PORT"] == "9090"
    namespaced = env_of(one(render(VALUE_SETS["namespaced"]), "Deployment"))
    assert namespaced["GUARDEDCRON_NAMESPACES"] == "billing,reports"
    default = env_of(one(render(), "Deployment"))
    assert default["GUARDEDCRON_NAMESPACES"] == ""
    assert default["GUARDEDCRON_GUARD_IMAGE"] == "ghcr.io/guardedcron/guardedcron:0.1.0"
    assert default["GUARDEDCRON_STOP_WORKLOAD"] == "false"


@pytest.mark.parametrize(("guard", "secrets", "user"), [
    pytest.param({}, (), 65532, id="defaults"),
    pytest.param({"imagePullSecrets": [{"name": "regcred"}, {"name": "mirror.pull"}],
                  "runAsUser": None}, ("regcred", "mirror.pull"), None, id="openshift"),
    pytest.param({"runAsUser": 1000650000}, (), 1000650000, id="large-uid-not-in-e-notation"),
])
def test_the_guards_pull_secrets_and_user_reach_the_operator(
        guard: dict[str, Any], secrets: tuple[str, ...], user: int | None) -> None:
    """Rendered into the Deployment, then read back by the operator's own settings."""
    deployment = one(render({"imagePullSecrets": [{"name": "operator-pull"}], "guard": guard}),
                     "Deployment")
    env = env_of(deployment)
    assert env["GUARDEDCRON_GUARD_IMAGE_PULL_SECRETS"] == ",".join(secrets)
    assert env["GUARDEDCRON_GUARD_RUN_AS_USER"] == ("" if user is None else str(user))
    settings = settings_from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert (settings.guard_image_pull_secrets, settings.guard_run_as_user) == (secrets, user)
    # the operator pod's own pull secrets stay its own
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "operator-pull"}]


def test_log_format_extra_args_and_extra_env_reach_the_container() -> None:
    container = one(render({
        "logFormat": "json",
        "extraArgs": ["--verbose", "--peering-timeout=5"],
        "extraEnv": [
            {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
            {"name": "DB_HOST", "valueFrom": {"secretKeyRef": {"name": "db", "key": "host"}}},
        ],
    }), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "operator", "--liveness=http://0.0.0.0:8080/healthz", "--log-format=json",
        "--verbose", "--peering-timeout=5",
    ]
    env = {var["name"]: var for var in container["env"]}
    assert env["HTTPS_PROXY"]["value"] == "http://proxy.example:3128"
    assert env["DB_HOST"]["valueFrom"] == {"secretKeyRef": {"name": "db", "key": "host"}}
    assert [var["name"] for var in container["env"]][-2:] == ["HTTPS_PROXY", "DB_HOST"]


def test_security_contexts_and_priority_class_come_from_values() -> None:
    pod = one(render({
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
        "priorityClassName": "system-cluster-critical",
    }), "Deployment")["spec"]["template"]["spec"]
    # null drops a default (OpenShift assigns its own UID); the rest stays restricted
    assert pod["securityContext"] == {"runAsNonRoot": True,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    context = pod["containers"][0]["securityContext"]
    assert context["capabilities"]["add"] == ["NET_BIND_SERVICE"]
    assert context["readOnlyRootFilesystem"] is True
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert restricted_violations(pod) == []
    default = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert default["securityContext"]["runAsUser"] == 65532
    assert "priorityClassName" not in default


def test_every_operator_env_name_is_documented_in_the_design() -> None:
    design = (CHART.parents[1] / "docs" / "design.md").read_text()
    # The first cell of a settings row names one variable or several: "| `A`, `B` |".
    first_cells = re.findall(r"^\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \|", design, flags=re.MULTILINE)
    documented = {name for cell in first_cells for name in re.findall(r"`([A-Z_]+)`", cell)}
    env = env_of(one(render(VALUE_SETS["everything"]), "Deployment"))
    assert set(env) <= documented, set(env) - documented


@pytest.mark.parametrize("name", VALUE_SETS)
def test_pods_meet_the_restricted_pod_security_standard(name: str) -> None:
    pod = one(render(VALUE_SETS[name]), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []


def test_restricted_check_finds_violations() -> None:
    pod = copy.deepcopy(one(render(), "Deployment")["spec"]["template"]["spec"])
    container = pod["containers"][0]
    container["securityContext"]["allowPrivilegeEscalation"] = True
    container["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    pod["hostNetwork"] = True
    assert len(restricted_violations(pod)) == 4


def test_probes_call_kopfs_health_endpoint() -> None:
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["limits"]["memory"]


def test_metrics_service_selects_the_operator_pods() -> None:
    objects = render(VALUE_SETS["monitoring"])
    service = one(objects, "Service")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_service_monitor_needs_the_metrics_service() -> None:
    result = template({"metrics": {"service": {"enabled": False},
                                   "serviceMonitor": {"enabled": True}}})
    assert result.code != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in result.stderr


def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {obj["kind"] for obj in render()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}


def test_render_is_fast() -> None:
    result = template(VALUE_SETS["everything"])
    assert result.code == 0, result.stderr
    print(f"helm template (everything on): {result.seconds * 1000:.0f} ms")
    assert result.seconds < 5


# --- README in step with values.yaml


def values_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of values.yaml; a map with children contributes its children."""
    keys: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            keys |= values_keys(value, f"{path}.")
        else:
            keys.add(path)
    return keys


def test_readme_documents_every_value_and_nothing_else() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.-]+)` \|", readme, flags=re.MULTILINE))
    keys = values_keys(values)
    assert keys - documented == set(), "values missing from charts/guardedcron/README.md"
    assert documented - keys == set(), "README documents values that do not exist"


def test_readme_defaults_match_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    rows = re.findall(r"^\| `([A-Za-z0-9_.-]+)` \| `([^`]*)` \|", readme, flags=re.MULTILINE)
    assert rows
    for key, default in rows:
        value: Any = values
        for part in key.split("."):
            value = value[part]
        assert yaml.safe_load(default) == value, f"README default of {key} is {default!r}"


# --- helpers


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}
