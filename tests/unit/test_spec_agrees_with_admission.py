"""`parse_guarded_cronjob` rejects whatever the API server's admission would reject.

So `guardedcron render` gives the same answer offline as `kubectl apply`. Admission is
modelled from the CRD file itself: the OpenAPI schema (with jsonschema) and every
`x-kubernetes-validations` CEL rule (with cel-python), evaluated after the schema
defaults, as the API server does. The spec checks may reject more (what CEL cannot
decide), never less.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from guardedcron.spec import SpecError, apply_schema_defaults, parse_guarded_cronjob
from tests.support.gcj import DELETE, base_gcj, put
from tests.unit.test_spec import INVALID

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml"
EXAMPLE_FILES = sorted((REPO / "examples").glob("*.yaml"))
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@functools.cache
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return loaded  # read-only for every caller


def openapi_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


# --- the schema as JSON Schema ---------------------------------------------------------
def as_json_schema(node: Any) -> Any:
    """OpenAPI v3 structural schema -> JSON Schema: `nullable` becomes a null type, the
    x-kubernetes-* extensions and `default` are dropped (defaults are applied first)."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {k: as_json_schema(v) for k, v in node.items()
              if not k.startswith("x-kubernetes-") and k not in ("nullable", "default")}
    if node.get("x-kubernetes-int-or-string"):
        result["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in result:
        result["type"] = [result["type"], "null"]
    return result


def schema_problems(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(as_json_schema(schema))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)]


# --- the CEL rules ----------------------------------------------------------------------
def cel_rules(schema: Mapping[str, Any], steps: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    for rule in schema.get("x-kubernetes-validations") or ():
        yield steps, rule
    for key, sub in (schema.get("properties") or {}).items():
        yield from cel_rules(sub, (*steps, key))
    if isinstance(schema.get("items"), dict):
        yield from cel_rules(schema["items"], (*steps, "[*]"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from cel_rules(schema["additionalProperties"], (*steps, "{*}"))


def nodes_at(value: Any, steps: tuple[str, ...]) -> Iterator[Any]:
    """The values a rule at `steps` applies to; a rule on an absent field is not run."""
    if not steps:
        yield value
        return
    step, rest = steps[0], steps[1:]
    if step == "[*]" and isinstance(value, list):
        for item in value:
            yield from nodes_at(item, rest)
    elif step == "{*}" and isinstance(value, dict):
        for item in value.values():
            yield from nodes_at(item, rest)
    elif isinstance(value, dict) and value.get(step) is not None:
        yield from nodes_at(value[step], rest)


@functools.cache
def compiled_rules() -> list[tuple[tuple[str, ...], dict[str, Any], Any]]:
    env = celpy.Environment()
    return [(steps, rule, env.program(env.compile(rule["rule"])))
            for steps, rule in cel_rules(openapi_schema(crd()))
            # transition rules need an old object; a create has none
            if "oldSelf" not in rule["rule"]]


def cel_problems(obj: Mapping[str, Any]) -> list[str]:
    problems = []
    for steps, rule, program in compiled_rules():
        for node in nodes_at(obj, steps):
            result = program.evaluate({"self": celpy.json_to_cel(node)})
            # anything but true fails the rule, an evaluation error included
            if not isinstance(result, celpy.celtypes.BoolType) or not result:
                problems.append(f"{'.'.join(steps)}: {rule.get('message', rule['rule'])}")
    return problems


def admission_problems(manifest: Mapping[str, Any]) -> list[str]:
    definition = crd()
    # Another version or kind is refused by the API server before any validation.
    if manifest.get("apiVersion") != "guardedcron.io/v1alpha1":
        return [f"apiVersion {manifest.get('apiVersion')!r} is not served"]
    if manifest.get("kind") != definition["spec"]["names"]["kind"]:
        return [f"kind {manifest.get('kind')!r} does not match the resource"]
    # ObjectMeta is checked by the API server for every resource, outside the CRD.
    metadata = manifest.get("metadata") or {}
    if not DNS_SUBDOMAIN.match(str(metadata.get("name", ""))):
        return [f"metadata.name {metadata.get('name')!r} is not a DNS subdomain"]
    if not DNS_LABEL.match(str(metadata.get("namespace", "default"))):
        return [f"namespace {metadata.get('namespace')!r} is not a DNS label"]
    schema = openapi_schema(definition)
    defaulted = apply_schema_defaults(manifest, definition)
    problems = schema_problems(defaulted, schema)
    # The API server runs CEL only on objects that pass the schema.
    return problems or cel_problems(defaulted)


def manifest_with(changes: dict[str, Any]) -> dict[str, Any]:
    """The README example as written (no server-side fields), with `changes` applied."""
    obj = put(put(base_gcj(), "metadata.uid", DELETE), "metadata.generation", DELETE)
    for path, value in changes.items():
        obj = put(obj, path, value)
    return obj


def spec_rejects(manifest: Mapping[str, Any]) -> bool:
    try:
        parse_guarded_cronjob(apply_schema_defaults(manifest, crd()))
    except SpecError:
        return True
    return False


# --- the agreement ----------------------------------------------------------------------
def test_the_crd_has_cel_rules() -> None:
    assert len(list(cel_rules(openapi_schema(crd())))) >= 5


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_examples_pass_admission_and_the_spec_checks(example: Path) -> None:
    for manifest in yaml.safe_load_all(example.read_text()):
        if isinstance(manifest, dict) and manifest.get("kind") == "GuardedCronJob":
            assert admission_problems(manifest) == []
            assert not spec_rejects(manifest)


def test_the_base_manifest_passes_both() -> None:
    assert admission_problems(manifest_with({})) == []
    assert not spec_rejects(manifest_with({}))


# Cases of the spec table that admission lets through on purpose. Everything else the
# spec checks reject, admission must reject as well, so that the operator never meets
# an admitted object it calls Invalid for a reason CEL could have given at once.
SPEC_ONLY = {
    # CEL has no cron parser and no time-zone database
    "schedule-minute-61", "time-zone-unknown",
    # the CRD leaves most of the pod template to the CronJob's own validation, which
    # refuses it only when the operator writes the CronJob; the spec checks read the
    # parts guardedcron changes (mounts), so they refuse a malformed one at once
    "mounts-not-list",
}
# Cases about a missing field that the CRD defaults: valid for both once defaulted. (A
# missing lease.durationSeconds with heartbeat false is refused by both: its 60 s default
# is shorter than the active deadline.)
DEFAULTED = {"heartbeat-missing"}


@pytest.mark.parametrize(("changes", "spec_ok", "admitted"), [
    pytest.param(case.values[0], case.id in DEFAULTED, case.id in SPEC_ONLY | DEFAULTED,
                 id=case.id)
    for case in INVALID
])
def test_spec_checks_and_admission_agree(changes: dict[str, Any], spec_ok: bool,
                                         admitted: bool) -> None:
    manifest = manifest_with(changes)
    assert spec_rejects(manifest) != spec_ok
    assert (admission_problems(manifest) == []) == admitted


# The rejections the issue asks CEL for: admission must catch each of these itself.
CEL_CASES = [
    pytest.param({"spec.lease.durationSeconds": 60}, id="lease-shorter-than-deadline"),
    pytest.param({"spec.concurrencyPolicy": "Allow"}, id="concurrency-allow"),
    pytest.param({"spec.jobTemplate.spec.backoffLimit": 2}, id="backoff-limit"),
    pytest.param({"spec.jobTemplate.spec.template.spec.restartPolicy": "OnFailure"},
                 id="restart-policy"),
    pytest.param({"spec.schedule": "TZ=UTC 0 * * * *"}, id="schedule-TZ"),
    pytest.param({"metadata.name": "n" * 53}, id="name-too-long"),
    pytest.param({"spec.startingDeadlineSeconds": 5}, id="starting-deadline"),
    # issue 11: lease.name names a lock inside the namespace, and cannot leave it
    pytest.param({"spec.lease.name": "payments/nightly-invoices"}, id="lease-name-other-namespace"),
    pytest.param({"spec.lease.name": "shared:ledger-close"}, id="lease-name-shared-prefix"),
    pytest.param({"spec.lease.name": "a\x00b"}, id="lease-name-nul"),
    pytest.param({"spec.lease.name": "x", "spec.lease.sharedLock": "y"}, id="name-and-shared-lock"),
    pytest.param({"spec.lease.sharedLock": "Ledger"}, id="shared-lock-upper-case"),
    # issue 36: the keeper sends the check-in pings
    pytest.param({"spec.checkIn": {"urlSecretRef": {"name": "pings", "key": "url"}}},
                 id="check-in-without-heartbeat"),
]


@pytest.mark.parametrize("changes", CEL_CASES)
def test_admission_and_spec_checks_both_reject(changes: dict[str, Any]) -> None:
    manifest = manifest_with(changes)
    assert admission_problems(manifest)
    assert spec_rejects(manifest)


# Any lease.name or sharedLock text: the parser and the CRD's rules give the same answer,
# so no name reaches the operator that admission would have refused, nor the reverse.
LOCK_TEXT = st.text(alphabet=st.sampled_from(
    ["a", "Z", "0", "-", ".", "_", " ", "/", ":", "\n", "\x00", "\x1f", "\x7f", "\x80", "\u00e9"]),
    max_size=8) | st.sampled_from(["x" * 189, "x" * 190, "s" * 63, "s" * 64])


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["spec.lease.name", "spec.lease.sharedLock"]), text=LOCK_TEXT)
def test_lock_names_agree_with_admission(field: str, text: str) -> None:
    manifest = manifest_with({field: text})
    assert spec_rejects(manifest) == bool(admission_problems(manifest)), (field, text)
