"""The GuardedCronJob CRD: its schema and CEL rules, read from crds/ and evaluated here.

Admission is reproduced in two steps, in the API server's order: schema defaults are
applied (by guardedcron.spec.defaults, the code `render` uses), then the object must
satisfy the OpenAPI schema (checked with `jsonschema`, unknown fields refused as
`kubectl apply`'s strict field validation does) and every `x-kubernetes-validations`
rule of every schema node that has a value (evaluated with cel-python, `self` bound to
that value). Nothing about the rules is copied here: they come from the CRD file.
The e2e suite applies the same CRD and examples to a real kube-apiserver.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError

from guardedcron import contract
from guardedcron.spec.defaults import apply_schema_defaults

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
CRD: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA: dict[str, Any] = VERSION["schema"]["openAPIV3Schema"]


# --- admission, reproduced

@dataclass(frozen=True)
class Refusal:
    path: str
    message: str
    by: str  # "schema" or "cel"


def _json_schema(node: Mapping[str, Any], *, root: bool = False) -> dict[str, Any]:
    """The structural schema as plain JSON Schema; objects refuse unknown fields unless the
    CRD preserves them (the API server would prune them; kubectl's strict validation,
    the default since 1.27, refuses them instead)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "default", "format"):
            continue
        if key == "properties":
            out[key] = {name: _json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = _json_schema(value)
        else:
            out[key] = value
    if (node.get("type") == "object" and "properties" in node and not root
            and not node.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in node):
        out["additionalProperties"] = False
    return out


JSON_SCHEMA = _json_schema(SCHEMA, root=True)
_CEL = celpy.Environment()


@functools.cache
def _program(rule: str) -> celpy.Runner:
    return _CEL.program(_CEL.compile(rule))


def _passes(rule: str, value: Any) -> bool:
    """True only for a rule that evaluates to true; an evaluation error refuses, as in
    the API server."""
    try:
        result = _program(rule).evaluate({"self": json_to_cel(value)})
    except CELEvalError:
        return False
    return isinstance(result, BoolType) and bool(result)


def _rules(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[Refusal]:
    for validation in schema.get("x-kubernetes-validations", ()):
        if not _passes(validation["rule"], value):
            yield Refusal(path + validation.get("fieldPath", ""), validation["message"], "cel")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key, sub in value.items():
            sub_schema = properties.get(key, schema.get("additionalProperties"))
            if isinstance(sub_schema, Mapping):
                yield from _rules(sub, sub_schema, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from _rules(item, schema["items"], f"{path}[{index}]")


def admit(obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[Refusal]]:
    """The object as stored (defaults filled in) and every reason to refuse it."""
    stored = apply_schema_defaults(obj, CRD)
    refusals = [
        Refusal("." + ".".join(str(p) for p in error.absolute_path), error.message, "schema")
        for error in jsonschema.Draft7Validator(JSON_SCHEMA).iter_errors(stored)
    ]
    if not refusals:  # CEL rules see only objects that passed the schema, as in the API server
        refusals = list(_rules(stored, SCHEMA, ""))
    return stored, refusals


# --- the API's shape

def test_names_scope_and_version() -> None:
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == f"{contract.PLURAL}.{contract.API_GROUP}"
    assert spec["group"] == contract.API_GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": contract.KIND, "listKind": f"{contract.KIND}List", "plural": contract.PLURAL,
        "singular": "guardedcronjob", "shortNames": ["gcj"], "categories": ["guardedcron"],
    }
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [
        (contract.API_VERSION, True, True)]
    assert VERSION["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    default_view = [c["name"] for c in VERSION["additionalPrinterColumns"]
                    if c.get("priority", 0) == 0]
    assert default_view == ["Schedule", "Suspend", "Ready", "Last Run", "Outcome", "Fence", "Age"]
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Outcome"]["jsonPath"] == ".status.lastRun.outcome"
    assert columns["Fence"]["jsonPath"] == ".status.lastRun.fence"
    assert columns["Fence"]["type"] == "integer"
    # A date column shows the age of its time, "<invalid>" for a time to come: the next run
    # is shown as its RFC 3339 time; date columns are kept for times that have passed.
    assert (columns["Next Run"]["type"], columns["Next Run"]["jsonPath"]) == (
        "string", ".status.nextScheduleTime")
    assert {c["jsonPath"] for c in columns.values() if c["type"] == "date"} == {
        ".status.lastRun.startedAt", ".metadata.creationTimestamp"}
    for column in columns.values():  # each column reads a field the schema defines
        path = column["jsonPath"].split("[")[0].strip(".").split(".")
        if path[0] != "metadata":
            _schema_at(path)


def _schema_at(path: list[str]) -> Mapping[str, Any]:
    node: Mapping[str, Any] = SCHEMA
    for key in path:
        node = node["items"] if node.get("type") == "array" else node
        node = node["properties"][key]
    return node


def _nodes(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path or ".", node
    for key, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            yield from _nodes(node[key], f"{path}.{key}")


def test_every_field_has_a_description() -> None:
    # The API server allows nothing on metadata but restrictions of name and generateName.
    assert SCHEMA["properties"]["metadata"] == {"type": "object"}
    missing = [path for path, node in _nodes(SCHEMA)
               if path != ".metadata" and not str(node.get("description", "")).strip()]
    assert missing == []


def test_rules_use_reasons_the_api_server_accepts() -> None:
    reasons = {validation.get("reason", "FieldValueInvalid")
               for _, node in _nodes(SCHEMA)
               for validation in node.get("x-kubernetes-validations", ())}
    assert reasons <= {"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired",
                       "FieldValueDuplicate"}


def test_the_api_server_can_bound_the_cost_of_every_rule() -> None:
    """Rules on strings need maxLength, and every list above a rule needs maxItems, or the
    API server's cost estimate for the rule is unbounded and the CRD is refused."""
    unbounded = []
    for path, node in _nodes(SCHEMA):
        if not node.get("x-kubernetes-validations"):
            continue
        if node.get("type") == "string" and "maxLength" not in node:
            unbounded.append(path)
        prefix = ""
        for part in path.split(".")[1:]:
            prefix = f"{prefix}.{part}"
            above = dict(_nodes(SCHEMA)).get(prefix, {})
            if above.get("type") == "array" and "maxItems" not in above:
                unbounded.append(prefix)
    assert unbounded == []


def test_status_conditions_are_a_map_keyed_by_type() -> None:
    conditions = _schema_at(["status", "conditions"])
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {
        "type", "status", "lastTransitionTime", "reason", "message"}


def test_run_items_have_one_shape() -> None:
    last_run = _schema_at(["status", "lastRun"])["properties"]
    assert _schema_at(["status", "recentRuns"])["items"]["properties"] == last_run
    assert _schema_at(["status", "recentRuns"])["maxItems"] == 100
    assert last_run["outcome"]["enum"] == [
        "Running", "Succeeded", "Failed", "Skipped", "TimedOut", "Lost", "GuardError"]


def test_fits_in_the_last_applied_annotation() -> None:
    # `kubectl apply` (client-side) stores the whole object as compact JSON in an
    # annotation; all annotations together may not exceed 256 KiB.
    size = len(json.dumps(CRD, separators=(",", ":")).encode())
    assert size < 256 * 1024 // 4, f"CRD is {size} bytes as JSON: keep it well under 256 KiB"


# --- defaults

def minimal() -> dict[str, Any]:
    return {
        "apiVersion": "guardedcron.io/v1alpha1", "kind": "GuardedCronJob",
        "metadata": {"name": "job", "namespace": "ns"},
        "spec": {
            "schedule": "@daily",
            "lease": {"databaseSecretRef": {"name": "db"}},
            "jobTemplate": {"spec": {"template": {"spec": {
                "containers": [{"name": "main", "image": "busybox"}]}}}},
        },
    }


@pytest.mark.parametrize(("path", "default"), [
    ("suspend", False),
    ("startingDeadlineSeconds", 600),
    ("activeDeadlineSeconds", 3600),
    ("successfulJobsHistoryLimit", 3),
    ("failedJobsHistoryLimit", 3),
    ("recentRunsLimit", 10),
    ("missedRunToleranceSeconds", 60),
    ("lease.durationSeconds", 60),
    ("lease.minHoldSeconds", 0),
    ("lease.heartbeat", True),
    ("lease.onLost", "Record"),
    ("lease.databaseSecretRef.key", "dsn"),
])
def test_defaults(path: str, default: object) -> None:
    stored, refusals = admit(minimal())
    assert refusals == []
    value: Any = stored["spec"]
    for key in path.split("."):
        value = value[key]
    assert value == default


def test_no_default_for_what_must_stay_unset() -> None:
    stored, _ = admit(minimal())
    for absent in ("timeZone", "concurrencyPolicy"):
        assert absent not in stored["spec"]
    assert "name" not in stored["spec"]["lease"]  # the operator uses "<namespace>/<name>"


def test_tls_defaults_only_the_ca_key() -> None:
    """A lease without tls gets none; an unset CA key is stored as ca.crt, where
    cert-manager and kubernetes.io/tls Secrets keep the CA."""
    assert "tls" not in admit(minimal())[0]["spec"]["lease"]
    obj = minimal()
    obj["spec"]["lease"]["tls"] = {"caSecretRef": {"name": "db-ca"}}
    stored, refusals = admit(obj)
    assert refusals == []
    assert stored["spec"]["lease"]["tls"] == {"caSecretRef": {"name": "db-ca", "key": "ca.crt"}}


# --- the examples

@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_admitted(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#"), "each example starts with a comment saying what it shows"
    obj = yaml.safe_load(text)
    assert (obj["apiVersion"], obj["kind"]) == (
        f"{contract.API_GROUP}/{contract.API_VERSION}", contract.KIND)
    _, refusals = admit(obj)
    assert refusals == []


def test_the_four_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "nightly-invoices.yaml", "every-5-minutes-sync.yaml", "shared-lock-multicluster.yaml",
        "heartbeat.yaml"}


# --- refusals: each invalid manifest is refused by exactly the rule named

Edit = Callable[[dict[str, Any]], None]


def put(path: str, value: object) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = obj
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return edit


def drop(path: str) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = obj
        for key in parents:
            node = node[key]
        del node[last]
    return edit


POD = "spec.jobTemplate.spec.template.spec"

REFUSED: list[Any] = [
    # id, edits, (by, path, words in the message)
    ("lease-equals-deadline", [put("spec.lease.heartbeat", False), put("spec.lease.durationSeconds", 3600)],
     ("cel", ".spec.lease.durationSeconds", "must be longer than activeDeadlineSeconds")),
    ("no-heartbeat-with-the-default-lease", [put("spec.lease.heartbeat", False)],
     ("cel", ".spec.lease.durationSeconds", "when lease.heartbeat is false")),
    ("heartbeat-lease-too-short", [put("spec.lease.heartbeat", True),
                                   put("spec.lease.durationSeconds", 14)],
     ("cel", ".spec.lease.durationSeconds", "at least 15 when lease.heartbeat is true")),
    ("min-hold-longer-than-lease", [put("spec.lease.minHoldSeconds", 3901)],
     ("cel", ".spec.lease.minHoldSeconds", "minHoldSeconds must not exceed")),
    ("concurrency-allow", [put("spec.concurrencyPolicy", "Allow")],
     ("cel", ".spec.concurrencyPolicy", "concurrencyPolicy can only be Forbid")),
    ("concurrency-replace", [put("spec.concurrencyPolicy", "Replace")],
     ("cel", ".spec.concurrencyPolicy", "concurrencyPolicy can only be Forbid")),
    ("backoff-limit", [put("spec.jobTemplate.spec.backoffLimit", 3)],
     ("cel", ".spec.jobTemplate.spec.backoffLimit", "backoffLimit must be unset or 0")),
    ("restart-on-failure", [put(f"{POD}.restartPolicy", "OnFailure")],
     ("cel", f".{POD}.restartPolicy", "restartPolicy must be unset or Never")),
    ("schedule-tz-prefix", [put("spec.schedule", "TZ=Europe/Stockholm 30 2 * * *")],
     ("cel", ".spec.schedule", "must not carry TZ= or CRON_TZ=")),
    ("schedule-cron-tz-prefix", [put("spec.schedule", "CRON_TZ=UTC 0 0 * * *")],
     ("cel", ".spec.schedule", "set spec.timeZone instead")),
    ("schedule-every", [put("spec.schedule", "@every 1h")],
     ("cel", ".spec.schedule", "@every is not supported")),
    ("schedule-four-fields", [put("spec.schedule", "30 2 * *")],
     ("cel", ".spec.schedule", "schedule must be 5 fields")),
    ("schedule-seconds-field", [put("spec.schedule", "0 30 2 * * *")],
     ("cel", ".spec.schedule", "schedule must be 5 fields")),
    ("schedule-empty", [put("spec.schedule", "")],
     ("cel", ".spec.schedule", "schedule must be 5 fields")),
    ("schedule-unknown-macro", [put("spec.schedule", "@fortnightly")],
     ("cel", ".spec.schedule", "or one of @yearly, @annually")),
    ("name-too-long", [put("metadata.name", "n" * 53)],
     ("cel", "", "metadata.name must be at most 52 characters")),
    ("starting-deadline-too-short", [put("spec.startingDeadlineSeconds", 9)],
     ("cel", ".spec.startingDeadlineSeconds", "must be at least 10")),
    ("no-containers", [put(f"{POD}.containers", [])],
     ("cel", f".{POD}.containers", "must list at least one container")),
    ("container-named-guard", [put(f"{POD}.containers.0.name", "guardedcron-guard")],
     ("cel", f".{POD}.containers[0].name", "are reserved for the containers guardedcron")),
    ("init-container-named-keeper",
     [put(f"{POD}.initContainers", [{"name": "guardedcron-keeper", "image": "x"}])],
     ("cel", f".{POD}.initContainers[0].name", "init container names guardedcron-guard")),
    ("volume-named-run", [put(f"{POD}.volumes", [{"name": "cache", "emptyDir": {}},
                                                 {"name": "guardedcron-run", "emptyDir": {}}])],
     ("cel", f".{POD}.volumes[1].name", "volume name guardedcron-run is reserved")),
    ("volume-named-like-a-tls-one", [put(f"{POD}.volumes", [{"name": "guardedcron-tls-key",
                                                             "emptyDir": {}}])],
     ("cel", f".{POD}.volumes[0].name", "guardedcron-tls-key are reserved")),
    ("parallelism", [put("spec.jobTemplate.spec.parallelism", 2)],
     ("cel", ".spec.jobTemplate.spec.parallelism", "parallelism must be unset or 1")),
    ("completions", [put("spec.jobTemplate.spec.completions", 3)],
     ("cel", ".spec.jobTemplate.spec.completions", "completions must be unset or 1")),
    ("job-deadline-differs", [put("spec.jobTemplate.spec.activeDeadlineSeconds", 100)],
     ("cel", ".spec.jobTemplate.spec.activeDeadlineSeconds", "must be unset or equal to")),
    ("pod-failure-policy", [put("spec.jobTemplate.spec.podFailurePolicy", {"rules": []})],
     ("cel", ".spec.jobTemplate.spec.podFailurePolicy", "podFailurePolicy must be unset")),
    ("pod-replacement-policy",
     [put("spec.jobTemplate.spec.podReplacementPolicy", "TerminatingOrFailed")],
     ("cel", ".spec.jobTemplate.spec.podReplacementPolicy", "must be unset or Failed")),
    ("time-zone-local", [put("spec.timeZone", "Local")],
     ("cel", ".spec.timeZone", "timeZone must be an IANA time zone name")),
    ("time-zone-with-space", [put("spec.timeZone", "Europe/Stock holm")],
     ("cel", ".spec.timeZone", "timeZone must be an IANA time zone name")),
    ("lease-name-of-another-namespace", [put("spec.lease.name", "billing/nightly-invoices")],
     ("cel", ".spec.lease.name", "lease.name must not contain '/', ':' or control characters")),
    ("lease-name-shared-prefix", [put("spec.lease.name", "shared:ledger-close")],
     ("cel", ".spec.lease.name", "it names a lock inside this GuardedCronJob's namespace")),
    ("lease-name-newline", [put("spec.lease.name", "a\nb")],
     ("cel", ".spec.lease.name", "lease.name must not contain")),
    ("name-and-shared-lock", [put("spec.lease.name", "x"), put("spec.lease.sharedLock", "y")],
     ("cel", ".spec.lease.sharedLock", "lease.name and lease.sharedLock are mutually exclusive")),
    ("shared-lock-upper-case", [put("spec.lease.sharedLock", "Ledger")],
     ("cel", ".spec.lease.sharedLock", "lease.sharedLock must be 1-63 lower-case letters")),
    # issue 14: catch-up and suspension after failures
    ("catch-up-latest-with-max-runs", [put("spec.catchUp", {"policy": "Latest", "maxRuns": 3})],
     ("cel", ".spec.catchUp.maxRuns", "catchUp.maxRuns above 1 needs catchUp.policy All")),
    ("suspend-after-zero-failures", [put("spec.suspendAfterFailures", 0)],
     ("cel", ".spec.suspendAfterFailures", "suspendAfterFailures must be from 1 to 1000")),
    ("catch-up-policy-unknown", [put("spec.catchUp", {"policy": "Some"})],
     ("schema", ".spec.catchUp.policy", "is not one of ['None', 'Latest', 'All']")),
    ("catch-up-window-of-30", [put("spec.catchUp", {"policy": "All", "windowSeconds": 30})],
     ("schema", ".spec.catchUp.windowSeconds", "less than the minimum of 60")),
    # issue 14: hashed spread, DST policy, run context
    ("schedule-h-inside-range", [put("spec.schedule", "H-5 * * * *")],
     ("cel", ".spec.schedule", "H must start a field item")),
    ("schedule-h-after-value", [put("spec.schedule", "5-H * * * *")],
     ("cel", ".spec.schedule", "written H, H/step, H(low-high) or")),
    ("schedule-parenthesis-without-h", [put("spec.schedule", "(0-5) * * * *")],
     ("cel", ".spec.schedule", "H must start a field item")),
    ("schedule-h-range-unclosed", [put("spec.schedule", "H(0-29 * * * *")],
     ("cel", ".spec.schedule", "H must start a field item")),
    ("dst-policy-without-time-zone", [drop("spec.timeZone"),
                                      put("spec.dstPolicy", {"repeatedTime": "Once"})],
     ("cel", ".spec.dstPolicy", "dstPolicy needs timeZone")),
    ("dst-repeated-time-unknown", [put("spec.dstPolicy", {"repeatedTime": "Thrice"})],
     ("schema", ".spec.dstPolicy.repeatedTime", "is not one of ['Twice', 'Once']")),
    ("dst-skipped-time-unknown", [put("spec.dstPolicy", {"skippedTime": "Later"})],
     ("schema", ".spec.dstPolicy.skippedTime", "is not one of ['Skip', 'RunAtNextMinute']")),
    ("dst-skipped-time-without-time-zone", [drop("spec.timeZone"),
                                            put("spec.dstPolicy", {"skippedTime": "RunAtNextMinute"})],
     ("cel", ".spec.dstPolicy", "dstPolicy needs timeZone")),
    ("check-in-without-keeper", [put("spec.lease.heartbeat", False), put("spec.lease.durationSeconds", 3900),
                                 put("spec.checkIn", {"urlSecretRef": {"name": "hc"}})],
     ("cel", ".spec.checkIn", "checkIn needs lease.heartbeat true")),
    ("check-in-secret-name-upper-case", [put("spec.checkIn", {"urlSecretRef": {"name": "HC"}})],
     ("schema", ".spec.checkIn.urlSecretRef.name", "does not match")),
    ("run-context-env-not-bool", [put("spec.runContext", {"env": "yes"})],
     ("schema", ".spec.runContext.env", "'yes' is not of type 'boolean'")),
    # refused by the OpenAPI schema itself
    ("lease-name-of-190", [put("spec.lease.name", "x" * 190)],
     ("schema", ".spec.lease.name", "is too long")),
    ("shared-lock-of-64", [put("spec.lease.sharedLock", "s" * 64)],
     ("schema", ".spec.lease.sharedLock", "is too long")),
    ("on-lost-unknown", [put("spec.lease.onLost", "Sometimes")],
     ("schema", ".spec.lease.onLost", "is not one of ['Record', 'StopWorkload']")),
    ("lease-of-31700-years", [put("spec.lease.durationSeconds", 1_000_000_000_000)],
     ("schema", ".spec.lease.durationSeconds", "greater than the maximum of 604800")),
    ("min-hold-over-7-days", [put("spec.lease.durationSeconds", 604_800),
                              put("spec.lease.minHoldSeconds", 604_801)],
     ("schema", ".spec.lease.minHoldSeconds", "greater than the maximum of 604800")),
    ("active-deadline-zero", [put("spec.activeDeadlineSeconds", 0)],
     ("schema", ".spec.activeDeadlineSeconds", "less than the minimum of 1")),
    ("no-lease", [drop("spec.lease")],
     ("schema", ".spec", "'lease' is a required property")),
    ("no-secret-ref", [drop("spec.lease.databaseSecretRef")],
     ("schema", ".spec.lease", "'databaseSecretRef' is a required property")),
    ("recent-runs-over-100", [put("spec.recentRunsLimit", 101)],
     ("schema", ".spec.recentRunsLimit", "greater than the maximum of 100")),
    ("secret-name-not-dns", [put("spec.lease.databaseSecretRef.name", "Jobs_DB")],
     ("schema", ".spec.lease.databaseSecretRef.name", "does not match")),
    ("tls-without-a-secret", [put("spec.lease.tls", {})],
     ("cel", ".spec.lease.tls", "lease.tls needs caSecretRef, clientCertSecretRef or both")),
    ("tls-ca-without-name", [put("spec.lease.tls", {"caSecretRef": {"key": "ca.crt"}})],
     ("schema", ".spec.lease.tls.caSecretRef", "'name' is a required property")),
    ("tls-client-cert-without-name", [put("spec.lease.tls", {"clientCertSecretRef": {}})],
     ("schema", ".spec.lease.tls.clientCertSecretRef", "'name' is a required property")),
    ("misspelt-field", [put("spec.lease.heartBeat", True)],
     ("schema", ".spec.lease", "('heartBeat' was unexpected)")),
    ("schedule-not-a-string", [put("spec.schedule", 5)],
     ("schema", ".spec.schedule", "5 is not of type 'string'")),
    ("container-without-name", [put(f"{POD}.containers", [{"image": "busybox"}])],
     ("schema", f".{POD}.containers.0", "'name' is a required property")),
]


def nightly_invoices() -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "nightly-invoices.yaml").read_text())
    return obj


@pytest.mark.parametrize(("edits", "expected"),
                         [pytest.param(e, x, id=i) for i, e, x in REFUSED])
def test_refused(edits: list[Edit], expected: tuple[str, str, str]) -> None:
    obj = nightly_invoices()
    for edit in edits:
        edit(obj)
    _, refusals = admit(obj)
    by, path, words = expected
    assert [(r.by, r.path) for r in refusals] == [(by, path)], refusals
    assert words in refusals[0].message


def test_enough_refusals_are_tested() -> None:
    assert len(REFUSED) >= 20
    tested = {x[2] for _, _, x in REFUSED if x[0] == "cel"}
    for path, node in _nodes(SCHEMA):
        for validation in node.get("x-kubernetes-validations", ()):
            message = validation["message"]
            assert any(words in message for words in tested), f"untested rule at {path}: {message}"


ADMITTED: list[Any] = [
    ("name-of-52", [put("metadata.name", "n" * 52)]),
    ("backoff-limit-zero", [put("spec.jobTemplate.spec.backoffLimit", 0)]),
    ("restart-never", [put(f"{POD}.restartPolicy", "Never")]),
    ("concurrency-forbid", [put("spec.concurrencyPolicy", "Forbid")]),
    ("job-deadline-equal", [put("spec.jobTemplate.spec.activeDeadlineSeconds", 3600)]),
    ("heartbeat-lease-of-15-under-a-long-deadline",
     [put("spec.lease.heartbeat", True), put("spec.lease.durationSeconds", 15),
      put("spec.activeDeadlineSeconds", 86400)]),
    ("min-hold-equal-to-lease", [put("spec.lease.minHoldSeconds", 60)]),
    ("lease-and-min-hold-of-7-days", [put("spec.lease.durationSeconds", 604_800),
                                      put("spec.lease.minHoldSeconds", 604_800)]),
    ("starting-deadline-10", [put("spec.startingDeadlineSeconds", 10)]),
    ("lease-name-of-189-with-spaces", [put("spec.lease.name", "night ly" + "x" * 181)]),
    ("shared-lock", [put("spec.lease.sharedLock", "ledger-close.v2_a")]),
    ("schedule-padded-fields", [put("spec.schedule", "  0   1 * * MON-FRI ")]),
    ("schedule-question-marks", [put("spec.schedule", "0 0 ? * ?")]),
    ("time-zone-etc", [put("spec.timeZone", "Etc/GMT+5")]),
    ("parallelism-and-completions-1", [put("spec.jobTemplate.spec.parallelism", 1),
                                       put("spec.jobTemplate.spec.completions", 1)]),
    ("pod-replacement-failed", [put("spec.jobTemplate.spec.podReplacementPolicy", "Failed")]),
    ("other-init-containers-and-volumes",
     [put(f"{POD}.initContainers", [{"name": "migrate", "image": "x"}]),
      put(f"{POD}.volumes", [{"name": "cache", "emptyDir": {}}])]),
    ("unknown-pod-fields-pass-through", [put(f"{POD}.nodeSelector", {"disk": "ssd"}),
                                         put("spec.jobTemplate.spec.ttlSecondsAfterFinished", 60)]),
]


@pytest.mark.parametrize("edits", [pytest.param(e, id=i) for i, e in ADMITTED])
def test_admitted(edits: list[Edit]) -> None:
    obj = nightly_invoices()
    for edit in edits:
        edit(obj)
    _, refusals = admit(obj)
    assert refusals == []


def test_last_trigger_token_holds_any_token_the_operator_accepts() -> None:
    from guardedcron.builders.manual import TRIGGER_TOKEN_MAX

    token = _schema_at(["status", "lastTriggerToken"])
    assert token["type"] == "string" and token["maxLength"] == TRIGGER_TOKEN_MAX


def test_the_lease_bounds_are_the_guards_and_kubectl_explain_gives_the_reason() -> None:
    lease = SCHEMA["properties"]["spec"]["properties"]["lease"]["properties"]
    for key in ("durationSeconds", "minHoldSeconds"):
        assert lease[key]["maximum"] == contract.MAX_LEASE_SECONDS
        description = " ".join(lease[key]["description"].split()).lower()
        assert f"at most {contract.MAX_LEASE_SECONDS} (7 days)" in description
    assert "dies unseen leaves the job locked" in " ".join(
        lease["durationSeconds"]["description"].split())
