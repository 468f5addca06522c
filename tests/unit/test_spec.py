"""Parsing a GuardedCronJob: every problem reported at its field; schema defaults; settings."""

from __future__ import annotations

import copy
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
import yaml

from guardedcron import contract
from guardedcron.schedule import Schedule
from guardedcron.spec import (
    LeaseSpec,
    SecretKeyRef,
    SettingsError,
    SpecError,
    apply_schema_defaults,
    parse_guarded_cronjob,
    settings_from_env,
)
from tests.support.gcj import DELETE, README_EXAMPLE, UID, base_gcj, put

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml"
POD = "spec.jobTemplate.spec.template.spec"


def parse_with(changes: dict[str, Any]) -> Any:
    obj = base_gcj()
    for path, value in changes.items():
        obj = put(obj, path, value)
    return parse_guarded_cronjob(obj)


# --- a valid spec, typed ------------------------------------------------------------
def test_valid_spec_is_typed() -> None:
    parsed = parse_guarded_cronjob(base_gcj())
    assert (parsed.name, parsed.namespace, parsed.uid, parsed.generation) == (
        "nightly-invoices", "billing", UID, 1)
    spec = parsed.spec
    assert isinstance(spec.schedule, Schedule)
    assert spec.schedule_text == "30 2 * * *"
    assert spec.time_zone == "Europe/Stockholm"
    assert str(spec.zone) == "Europe/Stockholm"
    assert (spec.suspend, spec.starting_deadline_seconds, spec.active_deadline_seconds) == (
        False, 600, 3600)
    assert (spec.successful_jobs_history_limit, spec.failed_jobs_history_limit) == (3, 3)
    assert (spec.recent_runs_limit, spec.missed_run_tolerance_seconds) == (10, 60)
    assert spec.lease == LeaseSpec(
        name="billing/nightly-invoices",
        database_secret_ref=SecretKeyRef(name="jobs-db", key="dsn"),
        duration_seconds=3900, min_hold_seconds=0, heartbeat=False, on_lost="Record")
    assert spec.job_template == base_gcj()["spec"]["jobTemplate"]


def test_without_time_zone_the_zone_is_utc() -> None:
    spec = parse_with({"spec.timeZone": DELETE}).spec
    assert (spec.time_zone, spec.zone) == (None, UTC)


def test_lease_name_set_and_defaulted() -> None:
    # lease.name names a lock inside the namespace: the lock is "<namespace>/<lease.name>".
    lease = parse_with({"spec.lease.name": "invoices run"}).spec.lease
    assert (lease.name, lease.shared_lock) == ("billing/invoices run", None)
    assert parse_with({"metadata.namespace": DELETE}).spec.lease.name == "default/nightly-invoices"


def test_a_shared_lock_is_named_apart_from_every_namespace() -> None:
    lease = parse_with({"spec.lease.sharedLock": "ledger-close"}).spec.lease
    assert (lease.name, lease.shared_lock) == ("shared:ledger-close", "ledger-close")


def test_the_longest_lease_name_in_the_longest_namespace_fits_the_guards_limit() -> None:
    lease = parse_with({"metadata.namespace": "n" * 63, "spec.lease.name": "x" * 189}).spec.lease
    assert len(lease.name) == contract.NAME_MAX


@pytest.mark.parametrize("name", ["other-team/nightly-invoices", "billing/nightly-invoices",
                                  "/", "a:b", "shared:ledger-close", "tab\there", "del\x7f"])
def test_a_lease_name_that_could_leave_its_namespace_is_refused(name: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_with({"spec.lease.name": name})
    [(path, message)] = caught.value.problems
    assert path == "spec.lease.name"
    assert "must not contain '/', ':' or control characters" in message
    assert 'the lock is "billing/<lease.name>"' in message and "spec.lease.sharedLock" in message


def test_default_namespace_can_be_chosen() -> None:
    obj = put(base_gcj(), "metadata.namespace", DELETE)
    parsed = parse_guarded_cronjob(obj, default_namespace="ops")
    assert (parsed.namespace, parsed.spec.lease.name) == ("ops", "ops/nightly-invoices")


def test_a_lease_of_exactly_seven_days_is_fine() -> None:
    parsed = parse_with({"spec.lease.durationSeconds": 604_800,
                         "spec.lease.minHoldSeconds": 604_800})
    assert (parsed.spec.lease.duration_seconds, parsed.spec.lease.min_hold_seconds) == (
        604_800, 604_800)


def test_long_lease_is_fine_with_heartbeat() -> None:
    parsed = parse_with({"spec.lease.heartbeat": True, "spec.lease.durationSeconds": 15})
    assert parsed.spec.lease.duration_seconds == 15


def test_parsed_spec_does_not_share_the_input() -> None:
    obj = base_gcj()
    parsed = parse_guarded_cronjob(obj)
    obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"].clear()
    assert parsed.spec.job_template == base_gcj()["spec"]["jobTemplate"]


# --- invalid specs: each one rejected at the field we expect --------------------------
INVALID: list[Any] = [
    pytest.param({"spec.schedule": "61 * * * *"}, "spec.schedule", "not a valid cron schedule",
                 id="schedule-minute-61"),
    pytest.param({"spec.schedule": "* * * *"}, "spec.schedule", "not a valid cron schedule",
                 id="schedule-four-fields"),
    pytest.param({"spec.schedule": "TZ=UTC 0 * * * *"}, "spec.schedule", "spec.timeZone",
                 id="schedule-TZ"),
    pytest.param({"spec.schedule": "CRON_TZ=Europe/Oslo 0 * * * *"}, "spec.schedule",
                 "TZ=", id="schedule-CRON_TZ"),
    pytest.param({"spec.schedule": "@every 5m"}, "spec.schedule", "@every",
                 id="schedule-every"),
    pytest.param({"spec.schedule": "0,1" + ",1" * 127 + " * * * *"}, "spec.schedule",
                 "at most 256 characters", id="schedule-long"),
    pytest.param({"spec.schedule": DELETE}, "spec.schedule", "required", id="schedule-missing"),
    pytest.param({"spec.timeZone": "Mars/Olympus_Mons"}, "spec.timeZone",
                 "'Mars/Olympus_Mons'", id="time-zone-unknown"),
    pytest.param({"spec.timeZone": "Local"}, "spec.timeZone", "'Local'", id="time-zone-local"),
    pytest.param({"spec.timeZone": "A/" * 32 + "B"}, "spec.timeZone", "at most 64 characters",
                 id="time-zone-long"),
    pytest.param({"spec.concurrencyPolicy": "Allow"}, "spec.concurrencyPolicy",
                 "must be Forbid", id="concurrency-allow"),
    pytest.param({"spec.concurrencyPolicy": "Replace"}, "spec.concurrencyPolicy",
                 "must be Forbid", id="concurrency-replace"),
    pytest.param({"spec.startingDeadlineSeconds": 9}, "spec.startingDeadlineSeconds",
                 "at least 10", id="starting-deadline-9"),
    pytest.param({"spec.startingDeadlineSeconds": "600"}, "spec.startingDeadlineSeconds",
                 "must be an integer, not a string", id="starting-deadline-string"),
    pytest.param({"spec.activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "at least 1",
                 id="active-deadline-0"),
    pytest.param({"spec.suspend": "yes"}, "spec.suspend", "must be true or false",
                 id="suspend-string"),
    pytest.param({"spec.successfulJobsHistoryLimit": -1}, "spec.successfulJobsHistoryLimit",
                 "at least 0", id="history-negative"),
    pytest.param({"spec.recentRunsLimit": 101}, "spec.recentRunsLimit", "at most 100",
                 id="recent-runs-101"),
    pytest.param({"spec.missedRunToleranceSeconds": 86401}, "spec.missedRunToleranceSeconds",
                 "at most 86400", id="tolerance-over-a-day"),
    pytest.param({"spec.lease.durationSeconds": 3600}, "spec.lease.durationSeconds",
                 "must exceed spec.activeDeadlineSeconds (3600)", id="lease-equal-to-deadline"),
    pytest.param({"spec.lease.durationSeconds": 60}, "spec.lease.durationSeconds",
                 "when spec.lease.heartbeat is false", id="lease-shorter-than-deadline"),
    pytest.param({"spec.lease.heartbeat": True, "spec.lease.durationSeconds": 14},
                 "spec.lease.durationSeconds", "at least 15 when spec.lease.heartbeat",
                 id="heartbeat-lease-14"),
    pytest.param({"spec.lease.minHoldSeconds": 4000}, "spec.lease.minHoldSeconds",
                 "at most spec.lease.durationSeconds (3900)", id="min-hold-over-lease"),
    pytest.param({"spec.lease.durationSeconds": 1_000_000_000_000}, "spec.lease.durationSeconds",
                 "at most 604800 (7 days), not 1000000000000: a run whose pod dies unseen",
                 id="lease-of-31700-years"),
    pytest.param({"spec.lease.heartbeat": True, "spec.lease.durationSeconds": 604_801},
                 "spec.lease.durationSeconds", "at most 604800 (7 days)",
                 id="lease-a-second-over-7-days"),
    pytest.param({"spec.lease.durationSeconds": 604_800, "spec.lease.minHoldSeconds": 604_801},
                 "spec.lease.minHoldSeconds", "at most 604800 (7 days)",
                 id="min-hold-a-second-over-7-days"),
    pytest.param({"spec.lease.durationSeconds": DELETE}, "spec.lease.durationSeconds",
                 "required", id="lease-duration-missing"),
    pytest.param({"spec.lease.databaseSecretRef": DELETE}, "spec.lease.databaseSecretRef",
                 "required", id="secret-ref-missing"),
    pytest.param({"spec.lease.databaseSecretRef.key": "d/sn"}, "spec.lease.databaseSecretRef.key",
                 "not a valid Secret key", id="secret-key-slash"),
    pytest.param({"spec.lease.databaseSecretRef.name": "Jobs_DB"},
                 "spec.lease.databaseSecretRef.name", "not a valid Secret name",
                 id="secret-name-invalid"),
    pytest.param({"spec.lease.tls": {}}, "spec.lease.tls",
                 "needs caSecretRef, clientCertSecretRef or both", id="tls-empty"),
    pytest.param({"spec.lease.tls": {"caSecretRef": {"key": "ca.crt"}}},
                 "spec.lease.tls.caSecretRef.name", "required", id="tls-ca-without-name"),
    pytest.param({"spec.lease.tls": {"caSecretRef": {"name": "db-ca", "key": "ca/crt"}}},
                 "spec.lease.tls.caSecretRef.key", "not a valid Secret key", id="tls-ca-key-slash"),
    pytest.param({"spec.lease.tls": {"clientCertSecretRef": {}}},
                 "spec.lease.tls.clientCertSecretRef.name", "required",
                 id="tls-client-without-name"),
    pytest.param({"spec.lease.tls": {"clientCertSecretRef": {"name": "Client_Cert"}}},
                 "spec.lease.tls.clientCertSecretRef.name", "not a valid Secret name",
                 id="tls-client-name-invalid"),
    pytest.param({"spec.lease.name": ""}, "spec.lease.name", "must not be empty",
                 id="lease-name-empty"),
    pytest.param({"spec.lease.name": "x" * 190}, "spec.lease.name", "at most 189",
                 id="lease-name-long"),
    pytest.param({"spec.lease.name": "a\nb"}, "spec.lease.name", "control characters",
                 id="lease-name-newline"),
    pytest.param({"spec.lease.name": "billing/ledger-close"}, "spec.lease.name",
                 "must not contain '/'", id="lease-name-slash"),
    pytest.param({"spec.lease.name": "a:b"}, "spec.lease.name", "':'", id="lease-name-colon"),
    pytest.param({"spec.lease.name": "x", "spec.lease.sharedLock": "y"}, "spec.lease.sharedLock",
                 "must not be set together with spec.lease.name", id="name-and-shared-lock"),
    pytest.param({"spec.lease.sharedLock": "Ledger_Close"}, "spec.lease.sharedLock",
                 "is not a shared lock name", id="shared-lock-upper-case"),
    pytest.param({"spec.lease.sharedLock": "billing/ledger"}, "spec.lease.sharedLock",
                 "is not a shared lock name", id="shared-lock-slash"),
    pytest.param({"spec.lease.sharedLock": "x" * 64}, "spec.lease.sharedLock",
                 "is not a shared lock name", id="shared-lock-long"),
    pytest.param({"spec.lease.sharedLock": ""}, "spec.lease.sharedLock",
                 "is not a shared lock name", id="shared-lock-empty"),
    pytest.param({"spec.lease.onLost": "Panic"}, "spec.lease.onLost",
                 "one of Record, StopWorkload", id="on-lost-unknown"),
    pytest.param({"spec.lease.heartbeat": DELETE}, "spec.lease.heartbeat", "required",
                 id="heartbeat-missing"),
    pytest.param({"spec.jobTemplate.spec.backoffLimit": 1}, "spec.jobTemplate.spec.backoffLimit",
                 "must be unset or 0", id="backoff-limit-1"),
    pytest.param({"spec.jobTemplate.spec.parallelism": 2}, "spec.jobTemplate.spec.parallelism",
                 "must be unset or 1", id="parallelism-2"),
    pytest.param({"spec.jobTemplate.spec.completions": 3}, "spec.jobTemplate.spec.completions",
                 "must be unset or 1", id="completions-3"),
    pytest.param({"spec.jobTemplate.spec.podReplacementPolicy": "TerminatingOrFailed"},
                 "spec.jobTemplate.spec.podReplacementPolicy", "must be unset or Failed",
                 id="pod-replacement-terminating"),
    pytest.param({"spec.jobTemplate.spec.podFailurePolicy": {"rules": []}},
                 "spec.jobTemplate.spec.podFailurePolicy", "must not be set",
                 id="pod-failure-policy-set"),
    pytest.param({"spec.jobTemplate.spec.activeDeadlineSeconds": 60},
                 "spec.jobTemplate.spec.activeDeadlineSeconds",
                 "equal to spec.activeDeadlineSeconds (3600)", id="job-deadline-differs"),
    pytest.param({f"{POD}.restartPolicy": "OnFailure"}, f"{POD}.restartPolicy",
                 "must be unset or Never", id="restart-on-failure"),
    pytest.param({f"{POD}.containers": []}, f"{POD}.containers", "at least one container",
                 id="containers-empty"),
    pytest.param({f"{POD}.containers": DELETE}, f"{POD}.containers", "required",
                 id="containers-missing"),
    pytest.param({f"{POD}.containers[0].name": DELETE}, f"{POD}.containers[0].name", "required",
                 id="container-without-name"),
    pytest.param({f"{POD}.containers[0].name": "c" * 64}, f"{POD}.containers[0].name",
                 "at most 63 characters", id="container-name-long"),
    pytest.param({f"{POD}.initContainers": [{"name": f"i{n}"} for n in range(65)]},
                 f"{POD}.initContainers", "at most 64 items", id="init-containers-65"),
    pytest.param({f"{POD}.volumes": [{"name": "guardedcron-tls-ca", "secret": {}}]},
                 f"{POD}.volumes[0].name", "reserved for the volumes guardedcron gives",
                 id="volume-named-like-a-tls-one"),
    pytest.param({f"{POD}.volumes": [{"name": f"v{n}", "emptyDir": {}} for n in range(257)]},
                 f"{POD}.volumes", "at most 256 items", id="volumes-257"),
    pytest.param({f"{POD}.initContainers": ["setup"]}, f"{POD}.initContainers[0]",
                 "must be an object", id="init-container-not-object"),
    pytest.param({f"{POD}.containers[0].volumeMounts": {"name": "x"}},
                 f"{POD}.containers[0].volumeMounts", "must be a list", id="mounts-not-list"),
    pytest.param({"spec.jobTemplate.spec": DELETE}, "spec.jobTemplate.spec", "required",
                 id="job-spec-missing"),
    pytest.param({"spec.jobTemplate.metadata.labels": {"tier": 3}},
                 "spec.jobTemplate.metadata.labels[tier]", "must be a string",
                 id="label-not-string"),
    pytest.param({"metadata.name": "n" * 53}, "metadata.name", "at most 52 characters",
                 id="name-53"),
    pytest.param({"metadata.name": "Nightly_Invoices"}, "metadata.name",
                 "lower-case letters", id="name-invalid"),
    pytest.param({"metadata.namespace": "Billing"}, "metadata.namespace",
                 "not a valid namespace", id="namespace-invalid"),
    pytest.param({"apiVersion": "guardedcron.io/v1"}, "apiVersion",
                 "must be guardedcron.io/v1alpha1", id="api-version"),
    pytest.param({"kind": "CronJob"}, "kind", "must be GuardedCronJob", id="kind"),
    pytest.param({"spec": DELETE}, "spec", "required", id="spec-missing"),
    # issue 36: the keeper sends the check-in pings, so no check-in without it
    pytest.param({"spec.checkIn": {"urlSecretRef": {"name": "pings", "key": "url"}}},
                 "spec.checkIn", "needs spec.lease.heartbeat true", id="check-in-without-heartbeat"),
    pytest.param({"spec.lease.heartbeat": True, "spec.lease.durationSeconds": 60,
                  "spec.checkIn": {"urlSecretRef": {"name": "Pings", "key": "url"}}},
                 "spec.checkIn.urlSecretRef.name", "not a valid Secret name",
                 id="check-in-secret-name"),
    pytest.param({"spec.lease.heartbeat": True, "spec.lease.durationSeconds": 60,
                  "spec.checkIn": {"urlSecretRef": {"name": "pings", "key": "a/b"}}},
                 "spec.checkIn.urlSecretRef.key", "not a valid Secret key",
                 id="check-in-secret-key"),
    pytest.param({"spec.lease.heartbeat": True, "spec.lease.durationSeconds": 60,
                  "spec.checkIn": {}},
                 "spec.checkIn.urlSecretRef", "required", id="check-in-without-secret"),
]


def test_a_check_in_is_typed() -> None:
    parsed = parse_with({"spec.lease.heartbeat": True, "spec.lease.durationSeconds": 60,
                         "spec.checkIn": {"urlSecretRef": {"name": "pings", "key": "hc"}}})
    assert parsed.spec.check_in == SecretKeyRef(name="pings", key="hc")
    assert parse_with({}).spec.check_in is None


def test_real_crd_defaults_the_check_in_key() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    obj = put(put(put(base_gcj(), "spec.lease.heartbeat", True), "spec.lease.durationSeconds", 60),
              "spec.checkIn", {"urlSecretRef": {"name": "pings"}})
    parsed = parse_guarded_cronjob(apply_schema_defaults(obj, crd))
    assert parsed.spec.check_in == SecretKeyRef(name="pings", key="url")


@pytest.mark.parametrize(("changes", "path", "words"), INVALID)
def test_invalid_spec_is_rejected_at_its_field(changes: dict[str, Any], path: str,
                                                words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_with(changes)
    assert [p.field_path for p in caught.value.problems] == [path]
    assert words in caught.value.problems[0].message


def test_all_problems_come_at_once() -> None:
    with pytest.raises(SpecError) as caught:
        parse_with({
            "spec.schedule": "61 * * * *",
            "spec.timeZone": "Nowhere/Special",
            "spec.lease.minHoldSeconds": -1,
            f"{POD}.restartPolicy": "Always",
            f"{POD}.volumes": [{"name": "guardedcron-run", "emptyDir": {}}],
        })
    assert [p.field_path for p in caught.value.problems] == [
        "spec.schedule", "spec.timeZone", "spec.lease.minHoldSeconds",
        f"{POD}.restartPolicy", f"{POD}.volumes[0].name",
    ]
    text = str(caught.value)
    assert "spec.schedule: '61 * * * *' is not a valid cron schedule" in text
    assert "spec.timeZone: " in text and "'Nowhere/Special'" in text


def test_not_an_object_at_all() -> None:
    with pytest.raises(SpecError) as caught:
        parse_guarded_cronjob({"apiVersion": "guardedcron.io/v1alpha1",
                               "kind": "GuardedCronJob", "metadata": [], "spec": "x"})
    assert [p.field_path for p in caught.value.problems] == ["metadata", "spec"]


# --- apply_schema_defaults, by the API server's rules ---------------------------------
TOY_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "spec": {"group": "guardedcron.io", "versions": [
        {"name": "v1alpha1", "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "count": {"type": "integer", "default": 5},
                "nested": {"type": "object", "default": {},
                           "properties": {"flag": {"type": "boolean", "default": False}}},
                "parentless": {"type": "object",
                               "properties": {"inner": {"type": "integer", "default": 1}}},
                "items": {"type": "array", "items": {
                    "type": "object", "properties": {"z": {"type": "string", "default": "q"}}}},
                "plain": {"type": "integer", "default": 7},
                "nullable": {"type": "integer", "nullable": True, "default": 8},
                "byKey": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {"w": {"type": "integer", "default": 2}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }},
        }}}},
    ]},
}


def toy(spec: dict[str, Any], api_version: str = "guardedcron.io/v1alpha1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "GuardedCronJob", "spec": spec}


@pytest.mark.parametrize(("given", "expected"), [
    pytest.param({}, {"count": 5, "nested": {"flag": False}, "plain": 7, "nullable": 8},
                 id="empty"),
    pytest.param({"count": 3, "nested": {"flag": True}},
                 {"count": 3, "nested": {"flag": True}, "plain": 7, "nullable": 8}, id="set-kept"),
    pytest.param({"parentless": {}}, {"count": 5, "nested": {"flag": False}, "plain": 7,
                                      "nullable": 8, "parentless": {"inner": 1}},
                 id="inside-a-given-object"),
    pytest.param({"items": [{}, {"z": "r"}]},
                 {"count": 5, "nested": {"flag": False}, "plain": 7, "nullable": 8,
                  "items": [{"z": "q"}, {"z": "r"}]}, id="array-items"),
    pytest.param({"plain": None, "nullable": None},
                 {"count": 5, "nested": {"flag": False}, "plain": 7, "nullable": None},
                 id="null-pruned-unless-nullable"),
    pytest.param({"byKey": {"a": {}, "b": {"w": 9}}},
                 {"count": 5, "nested": {"flag": False}, "plain": 7, "nullable": 8,
                  "byKey": {"a": {"w": 2}, "b": {"w": 9}}}, id="additional-properties"),
    pytest.param({"free": {"anything": None}},
                 {"count": 5, "nested": {"flag": False}, "plain": 7, "nullable": 8,
                  "free": {"anything": None}}, id="unknown-fields-untouched"),
])
def test_schema_defaults(given: dict[str, Any], expected: dict[str, Any]) -> None:
    obj = toy(given)
    before = copy.deepcopy(obj)
    assert apply_schema_defaults(obj, TOY_CRD)["spec"] == expected
    assert obj == before  # a copy is returned; the input stays as it was


def test_defaults_not_applied_for_a_version_the_crd_does_not_serve() -> None:
    obj = toy({}, api_version="guardedcron.io/v9")
    assert apply_schema_defaults(obj, TOY_CRD) == obj


def test_defaults_refuse_another_crd() -> None:
    other = put(TOY_CRD, "spec.group", "example.com")
    with pytest.raises(ValueError, match=r"not the guardedcron\.io CustomResourceDefinition"):
        apply_schema_defaults(toy({}), other)


# --- the real CRD: its defaults are the ones docs/design.md promises -------------------


def test_real_crd_defaults_give_the_documented_spec() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    defaulted = apply_schema_defaults(yaml.safe_load(README_EXAMPLE), crd)
    expected = put(put(base_gcj(), "metadata.uid", DELETE), "metadata.generation", DELETE)
    expected = put(put(expected, "spec.lease.heartbeat", True), "spec.lease.durationSeconds", 60)
    assert parse_guarded_cronjob(defaulted) == parse_guarded_cronjob(expected)


def test_real_crd_defaults_the_secret_key() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    manifest = yaml.safe_load(README_EXAMPLE)
    del manifest["spec"]["lease"]["databaseSecretRef"]["key"]
    parsed = parse_guarded_cronjob(apply_schema_defaults(manifest, crd))
    assert parsed.spec.lease.database_secret_ref == SecretKeyRef(name="jobs-db", key="dsn")


# --- operator settings from the environment -------------------------------------------
def test_settings_defaults() -> None:
    settings = settings_from_env({})
    assert settings.guard_image == "ghcr.io/guardedcron/guardedcron:0.1.0"
    assert settings.guard_image_pull_policy == "IfNotPresent"
    assert settings.cluster_name is None
    assert settings.guard_run_as_user == 65532
    assert settings.run_volume_size_limit == "1Mi"
    resources = settings.guard_resources
    assert (resources.cpu_request, resources.memory_request) == ("10m", "48Mi")
    assert (resources.cpu_limit, resources.memory_limit) == ("500m", "128Mi")


def test_settings_empty_values_mean_default_except_resources() -> None:
    settings = settings_from_env({"GUARDEDCRON_GUARD_IMAGE": "", "GUARDEDCRON_CLUSTER_NAME": "",
                                  "GUARDEDCRON_GUARD_CPU_LIMIT": ""})
    assert settings.guard_image == "ghcr.io/guardedcron/guardedcron:0.1.0"
    assert settings.cluster_name is None
    assert settings.guard_resources.cpu_limit is None


@pytest.mark.parametrize(("name", "value", "words"), [
    ("GUARDEDCRON_GUARD_IMAGE", "my image", "not an image reference"),
    ("GUARDEDCRON_GUARD_IMAGE_PULL_POLICY", "Sometimes", "Always, IfNotPresent, Never"),
    ("GUARDEDCRON_CLUSTER_NAME", "eu/west", "letters, digits"),
    ("GUARDEDCRON_CLUSTER_NAME", "-eu", "letters, digits"),
    ("GUARDEDCRON_GUARD_MEMORY_LIMIT", "lots", "not a Kubernetes quantity"),
    ("GUARDEDCRON_GUARD_CPU_REQUEST", "-1", "not a Kubernetes quantity"),
    ("GUARDEDCRON_RUN_VOLUME_SIZE_LIMIT", "1 MB", "not a Kubernetes quantity"),
    ("GUARDEDCRON_GUARD_RUN_AS_USER", "0", "above 0"),
    ("GUARDEDCRON_GUARD_RUN_AS_USER", "nobody", "above 0"),
    ("GUARDEDCRON_GUARD_RUN_AS_USER", "2147483648", "at most 2147483647"),
    ("GUARDEDCRON_GUARD_RUN_AS_USER", "\u0661\u0662", "above 0"),  # Arabic-Indic digits
    ("GUARDEDCRON_GUARD_IMAGE_PULL_SECRETS", "regcred,Reg_Cred", "'Reg_Cred' is not a Secret name"),
    ("GUARDEDCRON_GUARD_IMAGE_PULL_SECRETS", "a;b", "comma-separated"),
])
def test_bad_setting_names_its_variable(name: str, value: str, words: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from_env({name: value})
    assert [p.field_path for p in caught.value.problems] == [name]
    assert words in caught.value.problems[0].message


@pytest.mark.parametrize(("text", "secrets"), [
    ("", ()), (" , ", ()), ("regcred", ("regcred",)),
    (" b , a,b ", ("b", "a")),  # trimmed, each once, in the order given
])
def test_the_guards_pull_secrets_are_read_as_a_list(text: str, secrets: tuple[str, ...]) -> None:
    assert settings_from_env({"GUARDEDCRON_GUARD_IMAGE_PULL_SECRETS": text}
                             ).guard_image_pull_secrets == secrets


def test_an_empty_user_id_leaves_it_to_the_platform() -> None:
    assert settings_from_env({}).guard_run_as_user == 65532  # unset: the default
    for blank in ("", " "):  # set but empty: no user, for the pod or the platform to choose
        assert settings_from_env({"GUARDEDCRON_GUARD_RUN_AS_USER": blank}).guard_run_as_user is None


def test_the_default_check_in_secret_is_read_from_the_environment() -> None:
    assert settings_from_env({}).check_in_secret is None
    assert settings_from_env({"GUARDEDCRON_CHECK_IN_SECRET_NAME": "pings"}).check_in_secret == \
        SecretKeyRef(name="pings", key="url")
    assert settings_from_env({"GUARDEDCRON_CHECK_IN_SECRET_NAME": "pings",
                              "GUARDEDCRON_CHECK_IN_SECRET_KEY": "hc"}).check_in_secret == \
        SecretKeyRef(name="pings", key="hc")
    for name, value in (("GUARDEDCRON_CHECK_IN_SECRET_NAME", "Pings"),
                        ("GUARDEDCRON_CHECK_IN_SECRET_KEY", "a/b")):
        with pytest.raises(SettingsError) as caught:
            settings_from_env({"GUARDEDCRON_CHECK_IN_SECRET_NAME": "pings", name: value})
        assert [p.field_path for p in caught.value.problems] == [name]


def test_every_bad_setting_is_reported() -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from_env({"GUARDEDCRON_GUARD_IMAGE_PULL_POLICY": "x",
                           "GUARDEDCRON_GUARD_RUN_AS_USER": "root"})
    assert len(caught.value.problems) == 2


def test_spec_is_checked_even_without_a_name() -> None:
    with pytest.raises(SpecError) as caught:
        parse_with({"metadata.name": DELETE, "spec.schedule": "61 * * * *"})
    assert [p.field_path for p in caught.value.problems] == ["metadata.name", "spec.schedule"]
