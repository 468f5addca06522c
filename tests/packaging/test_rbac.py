"""The rendered RBAC grants exactly the rules of docs/design.md ("RBAC"), no more."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.chart import RELEASE_NAMESPACE, VALUE_SETS, by_kind, render

Grant = tuple[str, str, str]  # (API group, resource, verb)


def grants(*rules: tuple[str, str, str]) -> set[Grant]:
    """Rules as (group, resource, "verb verb ...") rows, expanded to single grants."""
    return {(group, resource, verb) for group, resource, verbs in rules for verb in verbs.split()}


ALWAYS = grants(
    ("guardedcron.io", "guardedcronjobs", "get list watch patch"),
    ("guardedcron.io", "guardedcronjobs/status", "get patch update"),
    # delete: a CronJob whose runs would take a lock its namespace may no longer use
    ("batch", "cronjobs", "get list watch create patch delete"),
    # delete: a skipped run's Job, once status records the skip
    ("batch", "jobs", "get list watch create delete"),
    ("", "pods", "get list watch"),
    ("", "events", "create patch"),
    ("events.k8s.io", "events", "create patch"),
)
CLUSTER_WIDE = grants(("apiextensions.k8s.io", "customresourcedefinitions", "get list watch"))
CLUSTER_PEERING = grants(("kopf.dev", "clusterkopfpeerings", "get list watch patch"))
NAMESPACED_PEERING = grants(("kopf.dev", "kopfpeerings", "get list watch patch"))
SECRETS_GET = grants(("", "secrets", "get"))
PODS_DELETE = grants(("", "pods", "delete"))


def flatten(role: dict[str, Any]) -> set[Grant]:
    found = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    found.add((group, resource, verb))
    return found


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("default", ALWAYS | CLUSTER_WIDE),
        ("peering", ALWAYS | CLUSTER_WIDE | CLUSTER_PEERING),
        ("outcome-recording", ALWAYS | CLUSTER_WIDE | SECRETS_GET),
        ("stop-workload", ALWAYS | CLUSTER_WIDE | PODS_DELETE),
        ("monitoring", ALWAYS | CLUSTER_WIDE),
        ("everything", ALWAYS | CLUSTER_WIDE | CLUSTER_PEERING | SECRETS_GET | PODS_DELETE),
    ],
)
def test_cluster_wide_install_grants_exactly(name: str, expected: set[Grant]) -> None:
    objects = render(VALUE_SETS[name])
    assert not by_kind(objects, "Role") and not by_kind(objects, "RoleBinding")
    (role,) = by_kind(objects, "ClusterRole")
    assert flatten(role) == expected
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [service_account_subject(objects)]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("namespaced", ALWAYS),
        ("peering-namespaced", ALWAYS | NAMESPACED_PEERING),
        ("stop-workload-namespaced", ALWAYS | PODS_DELETE),
    ],
)
def test_namespaced_install_grants_exactly_and_only_in_watched_namespaces(
    name: str, expected: set[Grant]
) -> None:
    values = VALUE_SETS[name]
    objects = render(values)
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")
    roles = by_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(values["watchNamespaces"])
    for role in roles:
        assert flatten(role) == expected
    bindings = by_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(values["watchNamespaces"])
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [service_account_subject(objects)]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_no_wildcards_and_no_secret_access_beyond_get(name: str) -> None:
    objects = render(VALUE_SETS[name])
    roles = by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
    assert roles
    for role in roles:
        for group, resource, verb in flatten(role):
            assert "*" not in (group, resource, verb), role["rules"]
            if resource == "secrets":
                assert verb == "get"
                assert VALUE_SETS[name].get("outcomeRecording", {}).get("enabled")
            if verb == "delete" and resource not in ("cronjobs", "jobs"):  # else only pods, when asked for
                assert resource == "pods"
                assert VALUE_SETS[name].get("stopWorkload", {}).get("enabled")


def test_rbac_can_be_left_to_the_user() -> None:
    objects = render({"rbac": {"create": False}})
    kinds = {obj["kind"] for obj in objects}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def service_account_subject(objects: list[dict[str, Any]]) -> dict[str, str]:
    (account,) = by_kind(objects, "ServiceAccount")
    (deployment,) = by_kind(objects, "Deployment")
    assert account["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    return {"kind": "ServiceAccount", "name": account["metadata"]["name"],
            "namespace": RELEASE_NAMESPACE}
