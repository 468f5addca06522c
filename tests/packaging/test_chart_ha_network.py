"""The chart's HA and network options: podDisruptionBudget, topologySpreadConstraints,
affinity and networkPolicy. Off by default, rendered as asked, combinations a schema cannot
see refused by the template's `fail` (bad values: test_values_schema.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.chart import VALUE_SETS, by_kind, one, render, template

OPERATOR_PODS = {
    "app.kubernetes.io/name": "guardedcron",
    "app.kubernetes.io/instance": "gc",
    "app.kubernetes.io/component": "operator",
}
PEERED: dict[str, Any] = {"replicaCount": 2, "peering": {"enabled": True}}
API_SERVER = {"cidrs": ["172.18.0.2/32", "fd00:10::1/128"]}
MONITORING_NAMESPACE = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
IN_CLUSTER_POSTGRES = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "databases"}},
    "podSelector": {"matchLabels": {"cnpg.io/cluster": "locks"}},
}
DNS_EGRESS = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def network_policy(values: dict[str, Any]) -> dict[str, Any]:
    return one(render(values), "NetworkPolicy")


# --- defaults


def test_default_render_has_no_budget_policy_spread_or_affinity() -> None:
    objects = render()
    assert by_kind(objects, "PodDisruptionBudget") == []
    assert by_kind(objects, "NetworkPolicy") == []
    spec = pod_spec(objects)
    assert "topologySpreadConstraints" not in spec
    assert "affinity" not in spec


def test_enabling_only_the_parents_renders_nothing_new() -> None:
    """Peering alone (two replicas) adds no budget and no spread: each is asked for."""
    objects = render(PEERED)
    assert by_kind(objects, "PodDisruptionBudget") == []
    assert "topologySpreadConstraints" not in pod_spec(objects)


def test_the_ha_value_set_covers_every_new_object() -> None:
    """VALUE_SETS["ha-network"] runs through helm lint --strict and the strict Kubernetes
    schema check in test_chart.py; it must really render what this file is about."""
    objects = render(VALUE_SETS["ha-network"])
    assert by_kind(objects, "PodDisruptionBudget") and by_kind(objects, "NetworkPolicy")
    spec = pod_spec(objects)
    assert spec["topologySpreadConstraints"] and spec["affinity"]["podAntiAffinity"]


# --- PodDisruptionBudget


def test_budget_defaults_to_one_unavailable_over_the_operator_pods() -> None:
    objects = render({**PEERED, "podDisruptionBudget": {"enabled": True}})
    budget = one(objects, "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["metadata"]["name"] == "gc-guardedcron"
    assert budget["metadata"]["namespace"] == "guardedcron-system"
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": OPERATOR_PODS}}
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert OPERATOR_PODS.items() <= pod_labels.items(), "the budget must select the operator pods"


@pytest.mark.parametrize(("given", "rendered"), [
    ({"minAvailable": 1, "maxUnavailable": ""}, {"minAvailable": 1}),
    ({"minAvailable": "50%", "maxUnavailable": ""}, {"minAvailable": "50%"}),
    ({"maxUnavailable": "50%"}, {"maxUnavailable": "50%"}),
    ({"minAvailable": 0, "maxUnavailable": ""}, {"minAvailable": 0}),
])
def test_budget_renders_the_one_bound_given(given: dict[str, Any], rendered: dict[str, Any]) -> None:
    budget = one(render({**PEERED, "podDisruptionBudget": {"enabled": True, **given}}),
                 "PodDisruptionBudget")
    assert budget["spec"] == {**rendered, "selector": {"matchLabels": OPERATOR_PODS}}


def test_budget_over_one_replica_is_refused() -> None:
    result = template({"podDisruptionBudget": {"enabled": True}})
    assert result.code != 0
    assert "podDisruptionBudget.enabled needs replicaCount >= 2" in result.stderr
    assert result.stdout.strip() == ""


# --- topology spread and affinity


def test_spread_constraints_count_the_operator_pods_unless_told_otherwise() -> None:
    by_host = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
               "whenUnsatisfiable": "DoNotSchedule", "matchLabelKeys": ["pod-template-hash"]}
    by_zone = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
               "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 1,
               "labelSelector": {"matchLabels": {"team": "platform"}}}
    spec = pod_spec(render({**PEERED, "topologySpreadConstraints": [by_host, by_zone]}))
    assert spec["topologySpreadConstraints"] == [
        {**by_host, "labelSelector": {"matchLabels": OPERATOR_PODS}},
        by_zone,
    ]


def test_affinity_reaches_the_pod_as_given() -> None:
    anti = {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": OPERATOR_PODS}},
    }]}
    spec = pod_spec(render({"affinity": {"podAntiAffinity": anti}}))
    assert spec["affinity"] == {"podAntiAffinity": anti}


# --- NetworkPolicy


def test_network_policy_allows_metrics_in_and_the_api_server_and_dns_out() -> None:
    policy = network_policy({"networkPolicy": {"enabled": True, "apiServer": API_SERVER}})
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["metadata"]["name"] == "gc-guardedcron"
    assert policy["metadata"]["namespace"] == "guardedcron-system"
    assert policy["spec"] == {
        "podSelector": {"matchLabels": OPERATOR_PODS},
        "policyTypes": ["Ingress", "Egress"],
        # no `from`: any source may scrape, on the metrics port alone
        "ingress": [{"ports": [{"port": 9090, "protocol": "TCP"}]}],
        "egress": [
            {"to": [{"ipBlock": {"cidr": "172.18.0.2/32"}}, {"ipBlock": {"cidr": "fd00:10::1/128"}}],
             "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]},
            DNS_EGRESS,
        ],
    }


def test_network_policy_ports_follow_the_metrics_and_api_server_values() -> None:
    objects = render({"metrics": {"port": 9464},
                      "networkPolicy": {"enabled": True,
                                        "apiServer": {"cidrs": ["10.0.0.1/32"], "ports": [8443]},
                                        "metrics": {"from": [MONITORING_NAMESPACE]}}})
    policy = one(objects, "NetworkPolicy")
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    metrics_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    assert metrics_port == 9464
    assert policy["spec"]["ingress"] == [{"ports": [{"port": metrics_port, "protocol": "TCP"}],
                                          "from": [MONITORING_NAMESPACE]}]
    assert policy["spec"]["egress"][0]["ports"] == [{"port": 8443, "protocol": "TCP"}]


def test_database_egress_only_with_outcome_recording() -> None:
    database = {"cidrs": ["10.20.0.0/16"], "to": [IN_CLUSTER_POSTGRES]}
    off = network_policy({"networkPolicy": {"enabled": True, "apiServer": API_SERVER,
                                            "database": database}})
    assert len(off["spec"]["egress"]) == 2, "no database rule without outcome recording"
    on = network_policy({"outcomeRecording": {"enabled": True},
                         "networkPolicy": {"enabled": True, "apiServer": API_SERVER,
                                           "database": database}})
    assert on["spec"]["egress"][2] == {
        "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}, IN_CLUSTER_POSTGRES],
        "ports": [{"port": 5432, "protocol": "TCP"}],
    }


def test_dns_peers_and_extra_egress_are_passed_through() -> None:
    kube_dns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    proxy = {"to": [{"ipBlock": {"cidr": "10.9.9.9/32"}}], "ports": [{"port": 3128, "protocol": "TCP"}]}
    policy = network_policy({"networkPolicy": {"enabled": True, "apiServer": API_SERVER,
                                               "dns": {"to": [kube_dns]}, "extraEgress": [proxy]}})
    assert policy["spec"]["egress"][1:] == [{**DNS_EGRESS, "to": [kube_dns]}, proxy]


@pytest.mark.parametrize(("values", "message"), [
    ({"networkPolicy": {"enabled": True}}, "networkPolicy.enabled needs networkPolicy.apiServer.cidrs"),
    ({"outcomeRecording": {"enabled": True}, "networkPolicy": {"enabled": True, "apiServer": API_SERVER}},
     "needs networkPolicy.database.cidrs or networkPolicy.database.to"),
], ids=["no API server address", "outcome recording with no database"])
def test_a_policy_that_would_cut_the_operator_off_is_refused(values: dict[str, Any], message: str) -> None:
    result = template(values)
    assert result.code != 0
    assert message in result.stderr, result.stderr
    assert result.stdout.strip() == ""
