"""values.schema.json turns bad values into a failed `helm template` naming the key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.chart import CHART, helm, template

# (case id, values, the location helm must name in its message)
BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", {"replicas": 2}, "additional properties 'replicas'"),
    ("unknown nested key", {"image": {"name": "x"}}, "additional properties 'name'"),
    ("latest tag", {"image": {"tag": "latest"}}, "/image/tag"),
    ("tag with a space", {"image": {"tag": "1.0 beta"}}, "/image/tag"),
    ("bad digest", {"image": {"digest": "sha256:xyz"}}, "/image/digest"),
    ("pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("empty repository", {"image": {"repository": ""}}, "/image/repository"),
    ("guard image latest", {"guard": {"image": "shop/guard:latest"}}, "/guard/image"),
    ("guard memory quantity", {"guard": {"resources": {"requests": {"memory": "48 MB"}}}},
     "/guard/resources/requests/memory"),
    ("guard pull policy", {"guard": {"imagePullPolicy": "always"}}, "/guard/imagePullPolicy"),
    ("namespace not a DNS label", {"watchNamespaces": ["Billing_Team"]}, "/watchNamespaces/0"),
    ("namespace as a string", {"watchNamespaces": "billing"}, "/watchNamespaces"),
    ("duplicate namespaces", {"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
    ("negative replicas", {"replicaCount": -1}, "/replicaCount"),
    ("replicas as a string", {"replicaCount": "2"}, "/replicaCount"),
    ("peering flag as a string", {"peering": {"enabled": "yes"}}, "/peering/enabled"),
    ("peering name", {"peering": {"name": "Not Valid"}}, "/peering/name"),
    ("crds switch as a string", {"crds": {"enabled": "false"}}, "/crds/enabled"),
    ("outcome recording typo", {"outcomeRecording": {"enable": True}},
     "additional properties 'enable'"),
    ("metrics port too high", {"metrics": {"port": 70000}}, "/metrics/port"),
    ("health port zero", {"health": {"port": 0}}, "/health/port"),
    ("probe period zero", {"health": {"livenessProbe": {"periodSeconds": 0}}},
     "/health/livenessProbe/periodSeconds"),
    ("service type", {"metrics": {"service": {"type": "Ingress"}}}, "/metrics/service/type"),
    ("scrape interval", {"metrics": {"serviceMonitor": {"interval": "30 seconds"}}},
     "/metrics/serviceMonitor/interval"),
    ("no-success slots zero", {"metrics": {"prometheusRule": {"noSuccessSlots": 0}}},
     "/metrics/prometheusRule/noSuccessSlots"),
    ("no-success slots renamed", {"metrics": {"prometheusRule": {"noSuccessPeriods": 2}}},
     "additional properties 'noSuccessPeriods'"),
    ("severity", {"metrics": {"prometheusRule": {"severity": {"overlap": "page"}}}},
     "/metrics/prometheusRule/severity/overlap"),
    ("new alert's severity", {"metrics": {"prometheusRule": {"severity": {"neverSucceeded": "high"}}}},
     "/metrics/prometheusRule/severity/neverSucceeded"),
    ("runbook page with an anchor", {"metrics": {"prometheusRule": {
        "runbookUrl": "https://wiki.example/runbooks#top"}}}, "/metrics/prometheusRule/runbookUrl"),
    ("runbook page not a URL", {"metrics": {"prometheusRule": {"runbookUrl": "docs/runbooks.md"}}},
     "/metrics/prometheusRule/runbookUrl"),
    ("memory quantity", {"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    ("unknown resource", {"resources": {"limits": {"gpu": 1}}}, "additional properties 'gpu'"),
    ("log level", {"logLevel": "verbose"}, "/logLevel"),
    ("log format", {"logFormat": "yaml"}, "/logFormat"),
    ("extra arg not a string", {"extraArgs": [5]}, "/extraArgs/0"),
    ("extra env without a name", {"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
    ("honor labels as a string", {"metrics": {"serviceMonitor": {"honorLabels": "true"}}},
     "/metrics/serviceMonitor/honorLabels"),
    ("dashboard namespace", {"metrics": {"dashboard": {"namespace": "Mon itoring"}}},
     "/metrics/dashboard/namespace"),
    ("pod security context as a list", {"podSecurityContext": []}, "/podSecurityContext"),
    ("label value not a string", {"podLabels": {"team": 7}}, "/podLabels/team"),
    ("cluster name", {"clusterName": "eu west"}, "/clusterName"),
    ("pull secret", {"imagePullSecrets": ["regcred"]}, "/imagePullSecrets/0"),
    ("guard pull secret as a name", {"guard": {"imagePullSecrets": ["regcred"]}},
     "/guard/imagePullSecrets/0"),
    ("guard pull secret name", {"guard": {"imagePullSecrets": [{"name": "Reg_Cred"}]}},
     "/guard/imagePullSecrets/0/name"),
    ("guard pull secret twice", {"guard": {"imagePullSecrets": [{"name": "a"}, {"name": "a"}]}},
     "/guard/imagePullSecrets"),
    ("guard user root", {"guard": {"runAsUser": 0}}, "/guard/runAsUser"),
    ("guard user as a string", {"guard": {"runAsUser": "65532"}}, "/guard/runAsUser"),
    ("guard user past int32", {"guard": {"runAsUser": 2**31}}, "/guard/runAsUser"),
    # High availability and network policy
    ("budget with both bounds", {"podDisruptionBudget": {"minAvailable": 1}}, "/podDisruptionBudget"),
    ("budget with neither bound", {"podDisruptionBudget": {"maxUnavailable": ""}}, "/podDisruptionBudget"),
    ("budget bound not an integer", {"podDisruptionBudget": {"maxUnavailable": 1.5}},
     "/podDisruptionBudget/maxUnavailable"),
    ("budget bound a word", {"podDisruptionBudget": {"maxUnavailable": "one"}},
     "/podDisruptionBudget/maxUnavailable"),
    ("budget percentage over 100", {"podDisruptionBudget": {"maxUnavailable": "150%"}},
     "/podDisruptionBudget/maxUnavailable"),
    ("budget key misspelt", {"podDisruptionBudget": {"minAvaliable": 1}},
     "additional properties 'minAvaliable'"),
    ("budget switch as a string", {"podDisruptionBudget": {"enabled": "true"}},
     "/podDisruptionBudget/enabled"),
    ("spread not a list", {"topologySpreadConstraints": {"maxSkew": 1}}, "/topologySpreadConstraints"),
    ("spread without topologyKey", {"topologySpreadConstraints": [
        {"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]}, "/topologySpreadConstraints/0"),
    ("spread key misspelt", {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelecter": {}}]}, "additional properties 'labelSelecter'"),
    ("spread skew zero", {"topologySpreadConstraints": [
        {"maxSkew": 0, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]},
     "/topologySpreadConstraints/0/maxSkew"),
    ("affinity key misspelt", {"affinity": {"podAntiAfinity": {}}}, "additional properties 'podAntiAfinity'"),
    ("policy key misspelt", {"networkPolicy": {"enable": True}}, "additional properties 'enable'"),
    ("API server address not a CIDR", {"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.1"]}}},
     "/networkPolicy/apiServer/cidrs/0"),
    ("API server port as a string", {"networkPolicy": {"apiServer": {"ports": ["443"]}}},
     "/networkPolicy/apiServer/ports/0"),
    ("no database port", {"networkPolicy": {"database": {"ports": []}}}, "/networkPolicy/database/ports"),
    ("metrics peer misspelt", {"networkPolicy": {"metrics": {"from": [{"namespaceSelecter": {}}]}}},
     "additional properties 'namespaceSelecter'"),
    ("empty peer", {"networkPolicy": {"dns": {"to": [{}]}}}, "/networkPolicy/dns/to/0"),
    ("extra egress protocol",
     {"networkPolicy": {"extraEgress": [{"ports": [{"port": 3128, "protocol": "tcp"}]}]}},
     "/networkPolicy/extraEgress/0/ports/0/protocol"),
]


@pytest.mark.parametrize(("case", "values", "where"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_values_fail_with_the_key_named(case: str, values: dict[str, Any], where: str) -> None:
    result = template(values)
    assert result.code != 0, f"{case}: helm accepted {values}"
    assert "don't meet the specifications of the schema" in result.stderr, result.stderr
    assert where in result.stderr, result.stderr
    assert result.stdout.strip() == "", "nothing may be rendered from bad values"


def test_good_variants_pass_the_schema() -> None:
    """The strict schema still accepts every documented kind of value."""
    result = template({
        "image": {"tag": "0.1.0-rc.1", "digest": "sha256:" + "0" * 64, "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "guard": {"image": "registry.example:5000/team/guard@sha256:" + "1" * 64,
                  "resources": {"requests": {"cpu": ""}, "limits": {"memory": "256Mi"}}},
        "clusterName": "eu-west-1.prod",
        "watchNamespaces": ["billing", "reports-2"],
        "resources": {"requests": {"cpu": 0.1, "memory": "64Mi"}, "limits": {"cpu": "1"}},
        "metrics": {"prometheusRule": {"enabled": True, "window": "1h30m"}},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "global": {"imageRegistry": "mirror.example"},
    })
    assert result.code == 0, result.stderr


def test_the_guards_pull_secrets_and_a_platform_user_pass_the_schema() -> None:
    result = template({"guard": {"imagePullSecrets": [{"name": "regcred"}, {"name": "mirror.pull"}],
                                 "runAsUser": None}})
    assert result.code == 0, result.stderr
    assert template({"guard": {"runAsUser": 1000650000}}).code == 0


def test_helm_install_refuses_bad_values_too() -> None:
    """`helm install` validates the same schema before it talks to any cluster."""
    result = helm(
        ["install", "gc", str(CHART), "--dry-run=client", "--namespace", "guardedcron-system"],
        {"watchNamespaces": ["Billing_Team"]},
    )
    assert result.code != 0
    assert "INSTALLATION FAILED" in result.stderr and "/watchNamespaces/0" in result.stderr
    good = helm(["install", "gc", str(CHART), "--dry-run=client", "--namespace", "guardedcron-system"])
    assert good.code == 0, good.stderr


def schema_properties(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every property the schema declares, at any depth (items and $defs included)."""
    found: list[tuple[str, dict[str, Any]]] = []
    for name, child in (node.get("properties") or {}).items():
        found.append((f"{path}.{name}".lstrip("."), child))
        found += schema_properties(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += schema_properties(node["items"], f"{path}[]")
    for name, definition in (node.get("$defs") or {}).items():
        found += schema_properties(definition, f"$defs.{name}")
    return found


def test_every_schema_property_has_a_description() -> None:
    """Editors and `helm show values` readers see what each key means."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    properties = schema_properties(schema)
    assert len(properties) > 80
    undescribed = [path for path, child in properties
                   if not str(child.get("description", "")).strip()]
    assert undescribed == [], f"values.schema.json properties without a description: {undescribed}"

