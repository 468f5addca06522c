"""The CRD on a real API server: schema defaults applied, invalid GuardedCronJobs refused
with the messages of the CRD's own CEL rules, and nothing stored.

Each case names words its CEL rule's node path and expression must contain; the expected message is
read from that rule in the CRD file, so the test follows the CRD's wording but fails
if the rule is missing or the server does not apply it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from guardedcron import contract
from tests.e2e.harness import REPO, Cluster, crd_source, guarded_cronjob, workload_container
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

NAMESPACE = "admission"
CRD_FILE_NAME = f"{contract.PLURAL}.{contract.API_GROUP}.yaml"
EXAMPLES = REPO / "examples"


def the_crd() -> dict[str, Any]:
    source = crd_source()
    path = source / CRD_FILE_NAME if source.is_dir() else source
    loaded: dict[str, Any] = yaml.safe_load(Path(path).read_text())
    return loaded


def version_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == contract.API_VERSION]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def cel_rules(schema: Mapping[str, Any], path: str = ""
              ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path of the schema node, rule) of every CEL rule, e.g. ('.spec.lease', {...})."""
    for rule in schema.get("x-kubernetes-validations") or ():
        yield path, rule
    for key, sub in (schema.get("properties") or {}).items():
        yield from cel_rules(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from cel_rules(schema[key], f"{path}[*]")


def messages_of_rules_over(*words: str) -> list[str]:
    """The messages of the rules whose node path and expression mention every word."""
    rules = [rule for path, rule in cel_rules(version_schema(the_crd()))
             if all(word in f"{path} {rule['rule']}" for word in words)]
    assert rules, f"the CRD has no CEL rule over {words}"
    return [str(r.get("message") or r["rule"]) for r in rules]


def merged(base: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(dict(base))
    for key, value in change.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def job_spec(**fields: Any) -> dict[str, Any]:
    return {"jobTemplate": {"spec": {"template": {"spec": {
        "containers": [workload_container()]}}, **fields}}}


# (case, change to the spec, words of the CEL rule that must refuse it)
INVALID = [
    ("lease not longer than the deadline, no heartbeat",
     {"activeDeadlineSeconds": 600, "lease": {"heartbeat": False, "durationSeconds": 600}},
     ("durationSeconds", "heartbeat")),
    ("minimum hold longer than the lease",
     {"lease": {"heartbeat": True, "durationSeconds": 60, "minHoldSeconds": 120}},
     ("minHoldSeconds",)),
    ("a Job that retries", job_spec(backoffLimit=2), ("backoffLimit",)),
    ("a failure policy of its own", job_spec(podFailurePolicy={"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}),
     ("podFailurePolicy",)),
    ("a container named like the guard",
     {"jobTemplate": {"spec": {"template": {"spec": {"containers": [
         {**workload_container(), "name": contract.GUARD_CONTAINER}]}}}}},
     (".containers", contract.GUARD_CONTAINER)),
    ("overlapping runs allowed", {"concurrencyPolicy": "Allow"}, ("concurrencyPolicy",)),
    ("a time zone in the schedule", {"schedule": "TZ=UTC 0 3 * * *"}, (".schedule", "TZ")),
    ("several make-up runs with policy Latest", {"catchUp": {"policy": "Latest", "maxRuns": 3}},
     (".catchUp", "maxRuns")),
    ("suspend after zero failures", {"suspendAfterFailures": 0}, (".suspendAfterFailures",)),
    ("H inside a range", {"schedule": "H-5 * * * *"}, (".schedule", "H(")),
    ("a DST policy without a time zone", {"dstPolicy": {"repeatedTime": "Once"}},
     ("dstPolicy", "timeZone")),
    ("TLS naming neither a CA nor a client certificate", {"lease": {"tls": {}}},
     (".lease.tls", "caSecretRef", "clientCertSecretRef")),
]


@pytest.fixture(scope="module")
def admission_namespace(clusters: dict[str, Cluster],
                        operators: dict[str, OperatorProcess]) -> str:
    """CRDs are applied by the `operators` fixture."""
    east = clusters["east"]
    if east.get(f"/api/v1/namespaces/{NAMESPACE}") is None:
        east.kubectl("create", "namespace", NAMESPACE)
    return NAMESPACE


@pytest.mark.parametrize(("change", "words"), [(c, w) for _, c, w in INVALID],
                         ids=[case for case, _, _ in INVALID])
def test_an_invalid_guarded_cronjob_is_refused_with_the_cel_message(
    clusters: dict[str, Cluster], admission_namespace: str, change: dict[str, Any],
    words: tuple[str, ...],
) -> None:
    east = clusters["east"]
    manifest = guarded_cronjob("refused", admission_namespace)
    manifest["spec"] = merged(manifest["spec"], change)
    messages = messages_of_rules_over(*words)
    refused = east.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    if refused.returncode == 0:
        east.kubectl("delete", contract.PLURAL, "refused", "-n", admission_namespace)
    assert refused.returncode != 0, "the API server accepted an invalid GuardedCronJob"
    assert any(m in refused.stderr for m in messages), (refused.stderr, messages)
    assert east.get(f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/"
                    f"{admission_namespace}/{contract.PLURAL}/refused") is None


def test_the_server_fills_in_the_schema_defaults(
    clusters: dict[str, Cluster], admission_namespace: str,
) -> None:
    east = clusters["east"]
    manifest = guarded_cronjob("defaulted", admission_namespace, spec={"suspend": True})
    east.apply(manifest)
    stored = east.get(f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/"
                      f"{admission_namespace}/{contract.PLURAL}/defaulted")
    assert stored is not None
    properties = version_schema(the_crd())["properties"]["spec"]["properties"]
    defaults = {k: v["default"] for k, v in properties.items() if "default" in v}
    lease_defaults = {k: v["default"] for k, v in properties["lease"]["properties"].items()
                      if "default" in v}
    assert defaults, "the CRD declares no defaults under spec"
    given = manifest["spec"]
    for key, value in defaults.items():
        if key not in given:
            assert stored["spec"][key] == value, key
    for key, value in lease_defaults.items():
        if key not in given["lease"]:
            assert stored["spec"]["lease"][key] == value, f"lease.{key}"
    east.kubectl("delete", contract.PLURAL, "defaulted", "-n", admission_namespace)


def test_the_examples_and_their_cronjobs_are_accepted(
    clusters: dict[str, Cluster], operators: dict[str, OperatorProcess],  # CRDs applied
) -> None:
    """Every example is a valid GuardedCronJob, and the CronJob `guardedcron render`
    makes of it passes the real batch/v1 validation (a dry run: nothing is stored)."""
    east = clusters["east"]
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files, f"no examples in {EXAMPLES}"
    for path in files:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for namespace in {d["metadata"].get("namespace", "default") for d in documents}:
            if east.get(f"/api/v1/namespaces/{namespace}") is None:
                east.kubectl("create", "namespace", namespace)
        east.kubectl("apply", "--dry-run=server", "-f", str(path))
        for document in documents:
            if document.get("kind") == contract.KIND:
                east.kubectl("apply", "--dry-run=server", "-f", "-",
                             input=yaml.safe_dump(east.render(document)))
