"""The generated CronJob: every guarded field and every injection case (pure builders)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from guardedcron.spec import SpecError, settings_from_env
from tests.support.gcj import DELETE, UID, base_gcj, build, get, put

POD = "spec.jobTemplate.spec.template.spec"
USER_POD = "spec.jobTemplate.spec.template.spec"  # the same path in the GuardedCronJob
JOB = "spec.jobTemplate.spec"

EXPECTED_GUARD: dict[str, Any] = {
    "name": "guardedcron-guard",
    "image": "ghcr.io/guardedcron/guardedcron:0.1.0",
    "imagePullPolicy": "IfNotPresent",
    "command": ["guardedcron"],
    "args": [
        "acquire",
        "--lock", "billing/nightly-invoices",
        "--holder", "$(GUARDEDCRON_HOLDER)",
        "--lease-seconds", "3900",
        "--min-hold-seconds", "0",
        "--job-name", "$(GUARDEDCRON_JOB_NAME)",
        "--cronjob", "nightly-invoices",
        "--out", "/var/run/guardedcron",
    ],
    "env": [
        {"name": "GUARDEDCRON_POD_NAMESPACE",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
        {"name": "GUARDEDCRON_POD_NAME",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "GUARDEDCRON_JOB_NAME",
         "valueFrom": {"fieldRef": {
             "apiVersion": "v1",
             "fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}}},
        {"name": "GUARDEDCRON_HOLDER",
         "value": "$(GUARDEDCRON_POD_NAMESPACE)/$(GUARDEDCRON_POD_NAME)"},
        {"name": "GUARDEDCRON_DSN",
         "valueFrom": {"secretKeyRef": {"name": "jobs-db", "key": "dsn"}}},
    ],
    "resources": {"requests": {"cpu": "10m", "memory": "48Mi"},
                  "limits": {"cpu": "500m", "memory": "128Mi"}},
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "terminationMessagePolicy": "FallbackToLogsOnError",
    "volumeMounts": [{"name": "guardedcron-run", "mountPath": "/var/run/guardedcron"}],
}

EXPECTED_KEEPER_ARGS = [
    "keep",
    "--lock", "billing/nightly-invoices",
    "--holder", "$(GUARDEDCRON_HOLDER)",
    "--fence-file", "/var/run/guardedcron/fence",
    "--lease-seconds", "3900",
    "--out", "/var/run/guardedcron",
]

EXPECTED_POD_FAILURE_POLICY = {"rules": [
    {"action": "FailJob",
     "onExitCodes": {"containerName": "guardedcron-guard", "operator": "In", "values": [75]}},
    {"action": "FailJob",
     "onExitCodes": {"containerName": "guardedcron-guard", "operator": "In",
                     "values": [64, 69, 70, 77, 78]}},
]}

WORKLOAD_MOUNT = {"name": "guardedcron-run", "mountPath": "/var/run/guardedcron", "readOnly": True}
RUN_VOLUME = {"name": "guardedcron-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
OWNER_LABELS = {"guardedcron.io/name": "nightly-invoices",
                "app.kubernetes.io/managed-by": "guardedcron"}


def names(containers: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in containers]


# --- the CronJob's own fields -------------------------------------------------------
@pytest.mark.parametrize(("changes", "path", "expected"), [
    pytest.param({}, "apiVersion", "batch/v1", id="apiVersion"),
    pytest.param({}, "kind", "CronJob", id="kind"),
    pytest.param({}, "metadata.name", "nightly-invoices", id="name"),
    pytest.param({}, "metadata.namespace", "billing", id="namespace"),
    pytest.param({}, "metadata.labels", OWNER_LABELS, id="labels"),
    pytest.param({}, "metadata.annotations", {"guardedcron.io/lock": "billing/nightly-invoices"},
                 id="lock-annotation-default"),
    pytest.param({"spec.lease.name": "invoices"}, "metadata.annotations",
                 {"guardedcron.io/lock": "billing/invoices"}, id="lock-annotation-set"),
    pytest.param({"spec.lease.sharedLock": "ledger-close"}, "metadata.annotations",
                 {"guardedcron.io/lock": "shared:ledger-close"}, id="lock-annotation-shared"),
    pytest.param({}, "spec.schedule", "30 2 * * *", id="schedule"),
    pytest.param({"spec.schedule": "@hourly"}, "spec.schedule", "@hourly", id="schedule-macro"),
    pytest.param({}, "spec.timeZone", "Europe/Stockholm", id="timeZone-set"),
    pytest.param({}, "spec.suspend", False, id="suspend-false"),
    pytest.param({"spec.suspend": True}, "spec.suspend", True, id="suspend-true"),
    pytest.param({}, "spec.concurrencyPolicy", "Forbid", id="concurrencyPolicy-default"),
    pytest.param({"spec.concurrencyPolicy": "Forbid"}, "spec.concurrencyPolicy", "Forbid",
                 id="concurrencyPolicy-Forbid"),
    pytest.param({}, "spec.startingDeadlineSeconds", 600, id="startingDeadlineSeconds"),
    pytest.param({"spec.startingDeadlineSeconds": 10}, "spec.startingDeadlineSeconds", 10,
                 id="startingDeadlineSeconds-minimum"),
    pytest.param({"spec.successfulJobsHistoryLimit": 7}, "spec.successfulJobsHistoryLimit", 7,
                 id="successfulJobsHistoryLimit"),
    pytest.param({"spec.failedJobsHistoryLimit": 0}, "spec.failedJobsHistoryLimit", 0,
                 id="failedJobsHistoryLimit"),
    # the Job
    pytest.param({}, f"{JOB}.backoffLimit", 0, id="backoffLimit-default"),
    pytest.param({f"{JOB}.backoffLimit": 0}, f"{JOB}.backoffLimit", 0, id="backoffLimit-0"),
    pytest.param({}, f"{JOB}.activeDeadlineSeconds", 3600, id="activeDeadlineSeconds"),
    pytest.param({"spec.activeDeadlineSeconds": 60, f"{JOB}.activeDeadlineSeconds": 60},
                 f"{JOB}.activeDeadlineSeconds", 60, id="activeDeadlineSeconds-repeated"),
    pytest.param({}, f"{JOB}.podReplacementPolicy", "Failed", id="podReplacementPolicy"),
    pytest.param({f"{JOB}.podReplacementPolicy": "Failed"}, f"{JOB}.podReplacementPolicy",
                 "Failed", id="podReplacementPolicy-Failed"),
    pytest.param({}, f"{JOB}.podFailurePolicy", EXPECTED_POD_FAILURE_POLICY,
                 id="podFailurePolicy"),
    pytest.param({f"{JOB}.ttlSecondsAfterFinished": 300}, f"{JOB}.ttlSecondsAfterFinished", 300,
                 id="other-job-fields-kept"),
    pytest.param({f"{JOB}.parallelism": 1, f"{JOB}.completions": 1}, f"{JOB}.completions", 1,
                 id="completions-1-kept"),
    # the pod
    pytest.param({}, f"{POD}.restartPolicy", "Never", id="restartPolicy-default"),
    pytest.param({f"{USER_POD}.restartPolicy": "Never"}, f"{POD}.restartPolicy", "Never",
                 id="restartPolicy-Never"),
    pytest.param({f"{USER_POD}.serviceAccountName": "invoicer"}, f"{POD}.serviceAccountName",
                 "invoicer", id="other-pod-fields-kept"),
])
def test_guarded_field(changes: dict[str, Any], path: str, expected: Any) -> None:
    obj = base_gcj()
    for change_path, value in changes.items():
        obj = put(obj, change_path, value)
    assert get(build(obj), path) == expected


def test_time_zone_absent_when_unset() -> None:
    cronjob = build(put(base_gcj(), "spec.timeZone", DELETE))
    assert "timeZone" not in cronjob["spec"]


def test_time_zone_null_is_unset() -> None:
    cronjob = build(put(base_gcj(), "spec.timeZone", None))
    assert "timeZone" not in cronjob["spec"]


def test_owner_reference_is_the_controller() -> None:
    assert build(base_gcj())["metadata"]["ownerReferences"] == [{
        "apiVersion": "guardedcron.io/v1alpha1",
        "kind": "GuardedCronJob",
        "name": "nightly-invoices",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }]


def test_no_owner_reference_without_uid() -> None:
    cronjob = build(put(base_gcj(), "metadata.uid", DELETE))
    assert "ownerReferences" not in cronjob["metadata"]


def test_namespace_defaults_for_manifests_without_one() -> None:
    cronjob = build(put(base_gcj(), "metadata.namespace", DELETE))
    assert cronjob["metadata"]["namespace"] == "default"
    assert cronjob["metadata"]["annotations"] == {"guardedcron.io/lock": "default/nightly-invoices"}


@pytest.mark.parametrize("path", ["spec.jobTemplate.metadata", f"{JOB}.template.metadata"])
def test_owner_labels_on_templates_next_to_the_users(path: str) -> None:
    obj = put(base_gcj(), f"{path}.labels", {"team": "billing"})
    obj = put(obj, f"{path}.annotations", {"note": "kept"})
    metadata = get(build(obj), path)
    assert metadata["labels"] == {"team": "billing", **OWNER_LABELS}
    assert metadata["annotations"] == {"note": "kept"}


@pytest.mark.parametrize("path", ["spec.jobTemplate.metadata", f"{JOB}.template.metadata"])
def test_owner_labels_on_templates_without_metadata(path: str) -> None:
    assert get(build(base_gcj()), path) == {"labels": OWNER_LABELS}


@pytest.mark.parametrize("path", ["spec.jobTemplate.metadata", f"{JOB}.template.metadata"])
def test_owner_label_with_the_same_value_is_accepted(path: str) -> None:
    obj = put(base_gcj(), f"{path}.labels", dict(OWNER_LABELS))
    assert get(build(obj), f"{path}.labels") == OWNER_LABELS


# --- injection ----------------------------------------------------------------------
def test_guard_container_exactly() -> None:
    pod = get(build(base_gcj()), POD)
    assert pod["initContainers"] == [EXPECTED_GUARD]


def test_keeper_is_a_native_sidecar_after_the_guard() -> None:
    pod = get(build(put(base_gcj(), "spec.lease.heartbeat", True)), POD)
    guard, keeper = pod["initContainers"]
    assert guard == EXPECTED_GUARD
    expected_keeper = {
        **EXPECTED_GUARD,
        "name": "guardedcron-keeper",
        "args": EXPECTED_KEEPER_ARGS,
        # the keeper has no slot to find, so no Job name
        "env": [e for e in EXPECTED_GUARD["env"] if e["name"] != "GUARDEDCRON_JOB_NAME"],
        "restartPolicy": "Always",
        # the workload starts once the keeper's SIGTERM handler is in place
        "startupProbe": {
            "exec": {"command": ["test", "-e", "/var/run/guardedcron/keeper-ready"]},
            "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1,
            "failureThreshold": 60,
        },
    }
    assert keeper == expected_keeper


CHECK_IN_ENV = {"name": "GUARDEDCRON_CHECK_IN_URL", "valueFrom": {"secretKeyRef": {
    "name": "pings", "key": "hc", "optional": True}}}


def with_keeper(obj: dict[str, Any]) -> dict[str, Any]:
    return put(put(obj, "spec.lease.heartbeat", True), "spec.lease.durationSeconds", 60)


def test_a_check_in_reaches_the_keeper_by_secret_env_never_args() -> None:
    obj = put(with_keeper(base_gcj()), "spec.checkIn", {"urlSecretRef": {"name": "pings", "key": "hc"}})
    guard, keeper = get(build(obj), POD)["initContainers"]
    assert keeper["args"][-1] == "--check-in"
    assert keeper["env"][-1] == CHECK_IN_ENV
    assert "GUARDEDCRON_CHECK_IN_URL" not in {e["name"] for e in guard["env"]}  # the guard never pings
    plain = get(build(with_keeper(base_gcj())), POD)["initContainers"][1]
    assert keeper["args"][:-1] == plain["args"] and keeper["env"][:-1] == plain["env"]


def test_the_operators_default_check_in_applies_only_where_the_spec_names_none() -> None:
    settings = settings_from_env({"GUARDEDCRON_CHECK_IN_SECRET_NAME": "pings",
                                  "GUARDEDCRON_CHECK_IN_SECRET_KEY": "hc"})
    obj = with_keeper(base_gcj())
    before = copy.deepcopy(obj)
    keeper = get(build(obj, settings), POD)["initContainers"][1]
    assert obj == before  # the spec is never changed
    assert keeper["env"][-1] == CHECK_IN_ENV and "--check-in" in keeper["args"]
    own = put(obj, "spec.checkIn", {"urlSecretRef": {"name": "own", "key": "url"}})
    keeper = get(build(own, settings), POD)["initContainers"][1]
    assert keeper["env"][-1]["valueFrom"]["secretKeyRef"] == {"name": "own", "key": "url", "optional": True}
    # without a keeper nothing pings: the default adds nothing
    assert names(get(build(base_gcj(), settings), POD)["initContainers"]) == ["guardedcron-guard"]


def test_no_keeper_without_heartbeat() -> None:
    pod = get(build(base_gcj()), POD)
    assert names(pod["initContainers"]) == ["guardedcron-guard"]


@pytest.mark.parametrize(("heartbeat", "expected"), [
    (False, ["guardedcron-guard", "migrate", "warm-cache"]),
    (True, ["guardedcron-guard", "guardedcron-keeper", "migrate", "warm-cache"]),
])
def test_user_init_containers_run_after_the_guard(heartbeat: bool, expected: list[str]) -> None:
    users = [{"name": "migrate", "image": "shop:1.42"},
             {"name": "warm-cache", "image": "shop:1.42",
              "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}]
    obj = put(base_gcj(), f"{USER_POD}.initContainers", users)
    obj = put(obj, "spec.lease.heartbeat", heartbeat)
    init = get(build(obj), f"{POD}.initContainers")
    assert names(init) == expected
    # the user's init containers are workload: they read the fence, never write it
    assert init[-2]["volumeMounts"] == [WORKLOAD_MOUNT]
    assert init[-1]["volumeMounts"] == [{"name": "cache", "mountPath": "/cache"}, WORKLOAD_MOUNT]


def test_every_workload_container_mounts_the_run_volume_read_only() -> None:
    containers = [
        {"name": "task", "image": "shop:1.42"},
        {"name": "proxy", "image": "proxy:2", "env": [{"name": "MODE", "value": "sidecar"}],
         "volumeMounts": [{"name": "config", "mountPath": "/etc/proxy", "readOnly": True}]},
    ]
    obj = put(base_gcj(), f"{USER_POD}.containers", containers)
    built = get(build(obj), f"{POD}.containers")
    assert built == [
        {"name": "task", "image": "shop:1.42", "volumeMounts": [WORKLOAD_MOUNT]},
        {"name": "proxy", "image": "proxy:2", "env": [{"name": "MODE", "value": "sidecar"}],
         "volumeMounts": [{"name": "config", "mountPath": "/etc/proxy", "readOnly": True},
                          WORKLOAD_MOUNT]},
    ]


@pytest.mark.parametrize("user_volumes", [
    pytest.param(None, id="none"),
    pytest.param([{"name": "config", "configMap": {"name": "proxy"}},
                  {"name": "scratch", "emptyDir": {}}], id="two"),
])
def test_run_volume_first_then_the_users(user_volumes: list[dict[str, Any]] | None) -> None:
    obj = base_gcj() if user_volumes is None else put(base_gcj(), f"{USER_POD}.volumes",
                                                     user_volumes)
    assert get(build(obj), f"{POD}.volumes") == [RUN_VOLUME, *(user_volumes or [])]


def test_user_env_is_untouched() -> None:
    env = [{"name": "GUARDEDCRON_DSN", "value": "the workload's own"},
           {"name": "LEVEL", "value": "info"}]
    obj = put(base_gcj(), f"{USER_POD}.containers[0].env", env)
    assert get(build(obj), f"{POD}.containers[0].env") == env


def arg_after(container: dict[str, Any], flag: str) -> str:
    args: list[str] = container["args"]
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(("changes", "flag", "expected"), [
    pytest.param({"spec.lease.durationSeconds": 120, "spec.activeDeadlineSeconds": 60},
                 "--lease-seconds", "120", id="lease-seconds"),
    pytest.param({"spec.lease.minHoldSeconds": 30}, "--min-hold-seconds", "30",
                 id="min-hold-seconds"),
    pytest.param({"spec.lease.name": "invoices"}, "--lock", "billing/invoices",
                 id="lease-name"),
    pytest.param({"spec.lease.sharedLock": "ledger-close"}, "--lock", "shared:ledger-close",
                 id="shared-lock"),
    pytest.param({"spec.lease.name": "cost$(HOME)"}, "--lock", "billing/cost$$(HOME)",
                 id="lease-name-escaped-from-expansion"),
])
def test_guard_arguments_follow_the_spec(changes: dict[str, Any], flag: str,
                                         expected: str) -> None:
    obj = put(base_gcj(), "spec.lease.heartbeat", True)
    for path, value in changes.items():
        obj = put(obj, path, value)
    guard, keeper = get(build(obj), f"{POD}.initContainers")
    assert arg_after(guard, flag) == expected
    if flag != "--min-hold-seconds":  # the keeper only renews: no minimum hold
        assert arg_after(keeper, flag) == expected


def test_dsn_comes_from_the_secret_key() -> None:
    obj = put(base_gcj(), "spec.lease.databaseSecretRef", {"name": "db", "key": "url"})
    obj = put(obj, "spec.lease.heartbeat", True)
    for container in get(build(obj), f"{POD}.initContainers"):
        assert container["env"][-1] == {
            "name": "GUARDEDCRON_DSN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}


TLS_ENV = {
    "PGSSLROOTCERT": "/etc/guardedcron/tls/ca/ca.crt",
    "PGSSLCERT": "/etc/guardedcron/tls/client/tls.crt",
    "PGSSLKEY": "/var/run/guardedcron-tls/tls.key",
    "GUARDEDCRON_TLS_KEY_SOURCE": "/etc/guardedcron/tls/client/tls.key",
}
TLS_MOUNTS = {
    "guardedcron-tls-ca": {"mountPath": "/etc/guardedcron/tls/ca", "readOnly": True},
    "guardedcron-tls-client": {"mountPath": "/etc/guardedcron/tls/client", "readOnly": True},
    "guardedcron-tls-key": {"mountPath": "/var/run/guardedcron-tls"},
}
TLS_VOLUMES = {
    "guardedcron-tls-ca": {"secret": {"secretName": "db-ca", "defaultMode": 0o444,
                                      "items": [{"key": "bundle.pem", "path": "ca.crt"}]}},
    "guardedcron-tls-client": {"secret": {"secretName": "jobs-client", "defaultMode": 0o444,
                                          "items": [{"key": "tls.crt", "path": "tls.crt"},
                                                    {"key": "tls.key", "path": "tls.key"}]}},
    "guardedcron-tls-key": {"emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
}
TLS_SPECS = {
    "ca-and-client": ({"caSecretRef": {"name": "db-ca", "key": "bundle.pem"},
                       "clientCertSecretRef": {"name": "jobs-client"}},
                      ["guardedcron-tls-ca", "guardedcron-tls-client", "guardedcron-tls-key"]),
    "ca-only": ({"caSecretRef": {"name": "db-ca", "key": "bundle.pem"}}, ["guardedcron-tls-ca"]),
    "client-only": ({"clientCertSecretRef": {"name": "jobs-client"}},
                    ["guardedcron-tls-client", "guardedcron-tls-key"]),
}


@pytest.mark.parametrize(("tls", "volumes"), TLS_SPECS.values(), ids=TLS_SPECS.keys())
def test_tls_mounts_the_secrets_into_guard_and_keeper_only(tls: dict[str, Any],
                                                           volumes: list[str]) -> None:
    obj = put(put(base_gcj(), "spec.lease.tls", tls), "spec.lease.heartbeat", True)
    cronjob = build(obj)
    pod = get(cronjob, POD)
    assert [v["name"] for v in pod["volumes"]] == ["guardedcron-run", *volumes]
    for volume in pod["volumes"][1:]:
        assert volume == {"name": volume["name"], **TLS_VOLUMES[volume["name"]]}
    ca_env = {"PGSSLROOTCERT"} if "guardedcron-tls-ca" in volumes else set()
    client_env = TLS_ENV.keys() - {"PGSSLROOTCERT"} if "guardedcron-tls-client" in volumes else set()
    expected_env = {name: TLS_ENV[name] for name in ca_env | client_env}
    guard, keeper = pod["initContainers"]
    for container in (guard, keeper):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: v for k, v in env.items() if k in TLS_ENV} == expected_env
        assert container["volumeMounts"][1:] == [{"name": name, **TLS_MOUNTS[name]}
                                                 for name in volumes]
    for workload in pod["containers"]:
        assert [m["name"] for m in workload["volumeMounts"]] == ["guardedcron-run"]
        assert not {e["name"] for e in workload.get("env") or ()} & TLS_ENV.keys()
    kubernetes_validate.validate(cronjob, "1.34.0", strict=True)


def test_without_tls_nothing_of_it_is_injected() -> None:
    pod = get(build(put(base_gcj(), "spec.lease.heartbeat", True)), POD)
    assert [v["name"] for v in pod["volumes"]] == ["guardedcron-run"]
    for container in pod["initContainers"]:
        assert not {e["name"] for e in container["env"]} & TLS_ENV.keys()


def test_cluster_name_prefixes_the_holder_of_guard_and_keeper() -> None:
    settings = settings_from_env({"GUARDEDCRON_CLUSTER_NAME": "eu-west-1"})
    init = get(build(put(base_gcj(), "spec.lease.heartbeat", True), settings),
               f"{POD}.initContainers")
    for container in init:
        holder = next(e for e in container["env"] if e["name"] == "GUARDEDCRON_HOLDER")
        assert holder["value"] == "eu-west-1/$(GUARDEDCRON_POD_NAMESPACE)/$(GUARDEDCRON_POD_NAME)"


def test_settings_shape_the_injected_containers() -> None:
    settings = settings_from_env({
        "GUARDEDCRON_GUARD_IMAGE": "registry.local/guardedcron@sha256:" + "a" * 64,
        "GUARDEDCRON_GUARD_IMAGE_PULL_POLICY": "Always",
        "GUARDEDCRON_GUARD_CPU_LIMIT": "",
        "GUARDEDCRON_GUARD_MEMORY_REQUEST": "64Mi",
        "GUARDEDCRON_GUARD_RUN_AS_USER": "1000",
        "GUARDEDCRON_RUN_VOLUME_SIZE_LIMIT": "2Mi",
    })
    pod = get(build(put(base_gcj(), "spec.lease.heartbeat", True), settings), POD)
    for container in pod["initContainers"]:
        assert container["image"] == "registry.local/guardedcron@sha256:" + "a" * 64
        assert container["imagePullPolicy"] == "Always"
        assert container["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"},
                                          "limits": {"memory": "128Mi"}}
        assert container["securityContext"]["runAsUser"] == 1000
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "2Mi"


def test_no_resources_at_all_when_every_amount_is_emptied() -> None:
    settings = settings_from_env({name: "" for name in (
        "GUARDEDCRON_GUARD_CPU_REQUEST", "GUARDEDCRON_GUARD_MEMORY_REQUEST",
        "GUARDEDCRON_GUARD_CPU_LIMIT", "GUARDEDCRON_GUARD_MEMORY_LIMIT")})
    assert get(build(base_gcj(), settings), f"{POD}.initContainers[0].resources") == {}


# --- pull secrets and user ids for the injected containers (issue 34) ------------------
PULL_SECRETS = "GUARDEDCRON_GUARD_IMAGE_PULL_SECRETS"


@pytest.mark.parametrize(("own", "chart_wide", "expected"), [
    pytest.param([{"name": "b"}, {"name": "a"}], "a,c", ["b", "a", "c"],
                 id="the-jobs-own-first-then-new-chart-wide-ones"),
    pytest.param([{"name": "a"}, {"name": "a"}], "c,c", ["a", "c"], id="each-name-once"),
])
def test_chart_wide_pull_secrets_join_the_jobs_own(own: list[dict[str, str]],
                                                   chart_wide: str, expected: list[str]) -> None:
    cronjob = build(put(base_gcj(), f"{USER_POD}.imagePullSecrets", own),
                    settings_from_env({PULL_SECRETS: chart_wide}))
    assert get(cronjob, f"{POD}.imagePullSecrets") == [{"name": name} for name in expected]
    kubernetes_validate.validate(cronjob, "1.34.0", strict=True)


def test_the_pod_gets_a_pull_secrets_field_only_when_there_are_some() -> None:
    """Without any, a CronJob stays byte-for-byte what it was before the setting."""
    assert "imagePullSecrets" not in get(build(base_gcj(), settings_from_env({PULL_SECRETS: ""})),
                                         POD)
    pulled = get(build(base_gcj(), settings_from_env({PULL_SECRETS: "regcred"})), POD)
    assert pulled["imagePullSecrets"] == [{"name": "regcred"}]


def test_a_pull_secret_entry_without_a_name_is_left_for_the_api_server() -> None:
    obj = put(base_gcj(), f"{USER_POD}.imagePullSecrets", [{}, "x"])
    pulled = get(build(obj, settings_from_env({PULL_SECRETS: "regcred"})), f"{POD}.imagePullSecrets")
    assert pulled == [{}, "x", {"name": "regcred"}]


def test_without_a_user_id_the_pod_or_the_platform_chooses_one() -> None:
    obj = put(put(base_gcj(), "spec.lease.heartbeat", True),
              f"{USER_POD}.securityContext", {"runAsUser": 1000650000})
    for container in get(build(obj), f"{POD}.initContainers"):  # by default: 65532
        context = container["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (65532, 65532)
    cronjob = build(obj, settings_from_env({"GUARDEDCRON_GUARD_RUN_AS_USER": ""}))
    for container in get(cronjob, f"{POD}.initContainers"):
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,  # still refused as root, whoever picks the uid
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    assert get(cronjob, f"{POD}.securityContext") == {"runAsUser": 1000650000}  # the job's own
    kubernetes_validate.validate(cronjob, "1.34.0", strict=True)


# --- clashes with what guardedcron injects --------------------------------------------
@pytest.mark.parametrize(("path", "value", "problem_path", "words"), [
    pytest.param(f"{USER_POD}.initContainers", [{"name": "guardedcron-guard", "image": "x"}],
                 f"{USER_POD}.initContainers[0].name", "'guardedcron-guard' is reserved",
                 id="init-container-named-guard"),
    pytest.param(f"{USER_POD}.initContainers",
                 [{"name": "setup", "image": "x"}, {"name": "guardedcron-keeper", "image": "x"}],
                 f"{USER_POD}.initContainers[1].name", "'guardedcron-keeper' is reserved",
                 id="init-container-named-keeper"),
    pytest.param(f"{USER_POD}.containers", [{"name": "guardedcron-guard", "image": "x"}],
                 f"{USER_POD}.containers[0].name", "'guardedcron-guard' is reserved",
                 id="container-named-guard"),
    pytest.param(f"{USER_POD}.containers",
                 [{"name": "task", "image": "x"}, {"name": "guardedcron-keeper", "image": "x"}],
                 f"{USER_POD}.containers[1].name", "'guardedcron-keeper' is reserved",
                 id="container-named-keeper"),
    pytest.param(f"{USER_POD}.volumes", [{"name": "guardedcron-run", "emptyDir": {}}],
                 f"{USER_POD}.volumes[0].name", "'guardedcron-run' is reserved",
                 id="volume-named-run"),
    pytest.param(f"{USER_POD}.containers[0].volumeMounts",
                 [{"name": "guardedcron-run", "mountPath": "/data"}],
                 f"{USER_POD}.containers[0].volumeMounts[0].name", "'guardedcron-run' is reserved",
                 id="mount-of-run-volume"),
    pytest.param(f"{USER_POD}.containers[0].volumeMounts",
                 [{"name": "data", "mountPath": "/var/run/guardedcron"}],
                 f"{USER_POD}.containers[0].volumeMounts[0].mountPath",
                 "/var/run/guardedcron is reserved", id="mount-at-run-dir"),
    pytest.param(f"{USER_POD}.initContainers",
                 [{"name": "setup", "image": "x",
                   "volumeMounts": [{"name": "data", "mountPath": "/var/run/guardedcron/"}]}],
                 f"{USER_POD}.initContainers[0].volumeMounts[0].mountPath",
                 "/var/run/guardedcron is reserved", id="init-mount-at-run-dir-trailing-slash"),
    pytest.param("spec.jobTemplate.metadata.labels", {"guardedcron.io/name": "other"},
                 "spec.jobTemplate.metadata.labels[guardedcron.io/name]",
                 "guardedcron sets this label to 'nightly-invoices'", id="job-label"),
    pytest.param(f"{JOB}.template.metadata.labels", {"app.kubernetes.io/managed-by": "Helm"},
                 f"{JOB}.template.metadata.labels[app.kubernetes.io/managed-by]",
                 "is 'Helm', but guardedcron sets this label to 'guardedcron'", id="pod-label"),
])
def test_clash_with_injected_names_is_an_error(path: str, value: Any, problem_path: str,
                                                words: str) -> None:
    obj = put(base_gcj(), path, value)
    with pytest.raises(SpecError) as caught:
        build(obj)
    assert [p.field_path for p in caught.value.problems] == [problem_path]
    assert words in caught.value.problems[0].message


def test_every_clash_is_reported_at_once() -> None:
    obj = put(base_gcj(), f"{USER_POD}.initContainers", [{"name": "guardedcron-keeper"}])
    obj = put(obj, f"{USER_POD}.volumes", [{"name": "guardedcron-run", "emptyDir": {}}])
    obj = put(obj, f"{USER_POD}.containers[0].name", "guardedcron-guard")
    with pytest.raises(SpecError) as caught:
        build(obj)
    assert sorted(p.field_path for p in caught.value.problems) == sorted([
        f"{USER_POD}.initContainers[0].name",
        f"{USER_POD}.containers[0].name",
        f"{USER_POD}.volumes[0].name",
    ])


# --- properties of the whole --------------------------------------------------------
@pytest.mark.parametrize("heartbeat", [False, True])
def test_same_input_gives_byte_identical_yaml(heartbeat: bool) -> None:
    obj = put(base_gcj(), "spec.lease.heartbeat", heartbeat)
    first = yaml.safe_dump(build(obj), sort_keys=True)
    second = yaml.safe_dump(build(copy.deepcopy(obj)), sort_keys=True)
    assert first == second
    # and without sorting: the builder's own key order is stable too
    assert yaml.safe_dump(build(obj), sort_keys=False) == yaml.safe_dump(build(obj),
                                                                         sort_keys=False)


def test_input_is_not_changed() -> None:
    obj = put(base_gcj(), f"{USER_POD}.volumes", [{"name": "scratch", "emptyDir": {}}])
    obj = put(obj, f"{USER_POD}.initContainers", [{"name": "setup", "image": "x"}])
    before = copy.deepcopy(obj)
    build(obj)
    assert obj == before


def test_building_twice_from_one_parse_gives_the_same_object() -> None:
    from guardedcron.builders import build_cronjob
    from guardedcron.spec import parse_guarded_cronjob
    from tests.support.gcj import DEFAULT_SETTINGS

    parsed = parse_guarded_cronjob(base_gcj())
    first = build_cronjob(parsed, DEFAULT_SETTINGS)
    first["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"].clear()
    assert build_cronjob(parsed, DEFAULT_SETTINGS) == build(base_gcj())


@pytest.mark.parametrize("changes", [
    pytest.param({}, id="plain"),
    pytest.param({"spec.lease.heartbeat": True, "spec.timeZone": DELETE}, id="heartbeat"),
    pytest.param({f"{USER_POD}.initContainers": [{"name": "setup", "image": "x"}],
                  f"{USER_POD}.volumes": [{"name": "scratch", "emptyDir": {}}],
                  "metadata.uid": DELETE}, id="with-user-init-and-volumes"),
])
def test_output_is_a_valid_kubernetes_1_34_cronjob(changes: dict[str, Any]) -> None:
    obj = base_gcj()
    for path, value in changes.items():
        obj = put(obj, path, value)
    # strict: unknown fields are errors too; raises ValidationError on any mistake
    kubernetes_validate.validate(build(obj), "1.34.0", strict=True)
