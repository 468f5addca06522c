"""The chart's schema migration: `guardedcron db migrate` as a Helm hook Job whose pod meets
the `restricted` Pod Security Standard, rendered by the real `helm`. The node tier runs it
on a real kubelet in a namespace enforcing `restricted` (tests/node/test_user_path.py)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import kubernetes_validate
import pytest

from guardedcron import contract
from guardedcron.builders.guard import ENV_LIBPQ_ROOT_CERT, TLS_SECRET_MODE
from tests.packaging.test_chart import KUBERNETES_VERSIONS
from tests.support.chart import (
    CHART,
    RELEASE_NAMESPACE,
    by_kind,
    helm,
    one,
    render,
    restricted_violations,
    template,
)

ENABLED: dict[str, Any] = {"migration": {"enabled": True, "databaseSecretRef": {"name": "jobs-db"}}}
WITH_CA: dict[str, Any] = {"migration": {
    "enabled": True,
    "databaseSecretRef": {"name": "owner-db", "key": "uri"},
    "caSecretRef": {"name": "db-ca", "key": "root.pem"},
}}  # fmt: skip
MISSING_NAME = "migration.enabled needs migration.databaseSecretRef.name"


def migration_job(values: dict[str, Any]) -> dict[str, Any]:
    return one(render(values), "Job")


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def notes(values: dict[str, Any]) -> str:
    result = helm(["install", "gc", str(CHART), "--dry-run=client", "--namespace", RELEASE_NAMESPACE],
                  values)  # fmt: skip
    assert result.code == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_no_migration_job_by_default() -> None:
    assert by_kind(render(), "Job") == []
    assert by_kind(render({"migration": {"databaseSecretRef": {"name": "jobs-db"}}}), "Job") == []


def test_the_hook_job_migrates_before_install_and_upgrade_and_is_deleted_when_it_succeeds() -> None:
    job = migration_job(ENABLED)
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(annotations["helm.sh/hook-weight"]) < 0
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert job["metadata"]["name"] == "gc-guardedcron-migrate"
    assert job["metadata"]["namespace"] == RELEASE_NAMESPACE
    spec = job["spec"]
    assert spec["backoffLimit"] <= 1
    assert spec["activeDeadlineSeconds"] == 240
    # Failures another pod would repeat end the Job at once; 69 (unreachable) may retry.
    [rule] = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {"containerName": "migrate", "operator": "In",
                                   "values": [contract.EXIT_USAGE, contract.EXIT_INTERNAL,
                                              contract.EXIT_NOT_GRANTED]}  # fmt: skip
    assert contract.EXIT_UNAVAILABLE not in rule["onExitCodes"]["values"]
    pod = pod_of(job)
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    # The chart's ServiceAccount is not there yet at pre-install: the Job does not name it.
    assert "serviceAccountName" not in pod
    [container] = pod["containers"]
    deployment = one(render(ENABLED), "Deployment")
    operator = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == operator["image"] == "ghcr.io/guardedcron/guardedcron:0.1.0"
    assert container["imagePullPolicy"] == operator["imagePullPolicy"]
    assert container["args"] == ["db", "migrate"]
    assert "command" not in container  # the image's entrypoint, guardedcron
    assert container["env"] == [{"name": contract.ENV_DSN, "valueFrom": {
        "secretKeyRef": {"name": "jobs-db", "key": "dsn"}}}]  # fmt: skip
    assert container["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"},
                                      "limits": {"memory": "128Mi"}}  # fmt: skip
    # db migrate writes no file: nothing writable is mounted, nothing else either.
    assert "volumes" not in pod and "volumeMounts" not in container


def test_the_hook_pod_is_not_counted_as_an_operator_pod() -> None:
    """The metrics Service, the PodDisruptionBudget and the NetworkPolicy select the
    operator's pods by label; the migration pod matches none of them."""
    values = {**ENABLED, "replicaCount": 2, "peering": {"enabled": True},
              "podDisruptionBudget": {"enabled": True},
              "networkPolicy": {"enabled": True, "apiServer": {"cidrs": ["10.0.0.1/32"]}}}
    objects = render(values)
    labels = one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    selectors = [one(objects, "Service")["spec"]["selector"],
                 one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
                 one(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]]
    for selector in selectors:
        assert not selector.items() <= labels.items(), selector
    assert labels["app.kubernetes.io/component"] == "migration"


def test_the_hook_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = pod_of(migration_job(ENABLED))
    assert restricted_violations(pod) == []
    # field by field, as `restricted` (v1.35) checks them
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC", "hostUsers"} & set(pod)
    [container] = pod["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsNonRoot"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    assert "privileged" not in context and "ports" not in container
    assert "initContainers" not in pod and "ephemeralContainers" not in pod


@pytest.mark.parametrize("values", [ENABLED, WITH_CA], ids=["secret", "with-ca"])
def test_the_hook_job_validates_against_the_kubernetes_schemas(values: dict[str, Any]) -> None:
    job = migration_job(values)
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    result = helm(["lint", "--strict", str(CHART)], values)
    assert result.code == 0, result.stdout + result.stderr


def test_the_hook_pod_takes_the_charts_security_contexts_pull_secrets_and_placement() -> None:
    values = copy.deepcopy(ENABLED)
    values.update({
        "imagePullSecrets": [{"name": "regcred"}],
        "image": {"repository": "registry.example/gc", "tag": "1.2.3", "pullPolicy": "Always"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
    })  # fmt: skip
    values["migration"].update(activeDeadlineSeconds=600,
                               resources={"requests": {"cpu": "20m"}, "limits": {"memory": "256Mi"}})
    pod = pod_of(migration_job(values))
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == values["tolerations"]
    # null drops a default (OpenShift assigns the user); the rest stays restricted
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    [container] = pod["containers"]
    assert container["image"] == "registry.example/gc:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["securityContext"]["capabilities"]["add"] == ["NET_BIND_SERVICE"]
    # Helm merges the maps: the default memory request stays
    assert container["resources"] == {"requests": {"cpu": "20m", "memory": "64Mi"},
                                      "limits": {"memory": "256Mi"}}  # fmt: skip
    assert migration_job(values)["spec"]["activeDeadlineSeconds"] == 600
    assert restricted_violations(pod) == []
    # and a context the values make unrestricted is unrestricted in the Job as well
    values["securityContext"] = {"allowPrivilegeEscalation": True}
    assert restricted_violations(pod_of(migration_job(values)))


def test_a_private_ca_is_mounted_read_only_as_the_guard_mounts_it() -> None:
    pod = pod_of(migration_job(WITH_CA))
    [container] = pod["containers"]
    env = {var["name"]: var for var in container["env"]}
    assert env[contract.ENV_DSN]["valueFrom"] == {"secretKeyRef": {"name": "owner-db", "key": "uri"}}
    # the guard's variable and path (guardedcron.builders.guard)
    assert env[ENV_LIBPQ_ROOT_CERT]["value"] == f"{contract.TLS_CA_DIR}/{contract.TLS_CA_FILE}"
    assert container["volumeMounts"] == [{"name": contract.TLS_CA_VOLUME,
                                          "mountPath": contract.TLS_CA_DIR, "readOnly": True}]  # fmt: skip
    assert pod["volumes"] == [{"name": contract.TLS_CA_VOLUME, "secret": {
        "secretName": "db-ca", "defaultMode": TLS_SECRET_MODE,
        "items": [{"key": "root.pem", "path": contract.TLS_CA_FILE}]}}]  # fmt: skip
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert restricted_violations(pod) == []


@pytest.mark.parametrize("migration", [
    pytest.param({"enabled": True}, id="no-secret-ref"),
    pytest.param({"enabled": True, "databaseSecretRef": {"name": ""}}, id="empty-name"),
])
def test_enabled_without_a_secret_name_fails_with_one_clear_message(migration: dict[str, Any]) -> None:
    result = template({"migration": migration})
    assert result.code != 0
    assert MISSING_NAME in result.stderr, result.stderr
    assert result.stderr.count(MISSING_NAME) == 1
    install = helm(["install", "gc", str(CHART), "--dry-run=client", "--namespace", RELEASE_NAMESPACE],
                   {"migration": migration})  # fmt: skip
    assert install.code != 0 and MISSING_NAME in install.stderr


@pytest.mark.parametrize(("migration", "where"), [
    pytest.param({"enabled": True, "databaseSecretRef": {"name": "db"}, "backoffLimit": 3},
                 "'/migration': additional properties 'backoffLimit'", id="unknown-key"),
    pytest.param({"databaseSecretRef": {"name": "db", "keys": "dsn"}},
                 "'/migration/databaseSecretRef': additional properties 'keys'", id="unknown-ref-key"),
    pytest.param({"caSecretRef": {"name": "db-ca", "path": "/x"}},
                 "'/migration/caSecretRef': additional properties 'path'", id="unknown-ca-key"),
    pytest.param({"resources": {"requests": {"gpu": 1}}},
                 "'/migration/resources/requests': additional properties 'gpu'", id="unknown-resource"),
    pytest.param({"databaseSecretRef": {"name": "Jobs_DB"}}, "/migration/databaseSecretRef/name",
                 id="bad-secret-name"),
    pytest.param({"activeDeadlineSeconds": 0}, "/migration/activeDeadlineSeconds", id="no-deadline"),
    pytest.param({"activeDeadlineSeconds": 86400}, "/migration/activeDeadlineSeconds",
                 id="deadline-past-an-hour"),
    pytest.param({"enabled": "yes"}, "/migration/enabled", id="enabled-not-boolean"),
])  # fmt: skip
def test_the_values_schema_refuses_unknown_keys_and_bad_values(migration: dict[str, Any], where: str) -> None:
    result = template({"migration": migration})
    assert result.code != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert where in result.stderr, result.stderr


def test_notes_say_the_hook_migrated_when_enabled() -> None:
    text = notes(ENABLED)
    assert "the hook Job gc-guardedcron-migrate ran `guardedcron db migrate`" in text
    assert "Secret jobs-db (key dsn)" in text
    assert "run guardedcron-migrate" not in text and "--set migration.enabled" not in text


def kubectl_run_pod(command: str) -> dict[str, Any]:
    """The pod `kubectl run NAME --image=I --env=E --restart=Never -i` makes
    (kubectl's generator), with `--overrides` applied as `--override-type=strategic`
    does: maps merged, `containers` merged by name."""
    name = re.search(r"kubectl -n \S+ run (\S+) ", command)
    image = re.search(r"--image=(\S+)", command)
    overrides = re.search(r"--overrides='([^']*)'", command)
    assert name and image and overrides, command
    assert "--override-type=strategic" in command  # the default, merge, would replace containers
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name[1]}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": name[1], "image": image[1], "args": ["db", "migrate"], "stdin": True,
                        "stdinOnce": True, "env": [{"name": contract.ENV_DSN, "value": "..."}]}],
    }}  # fmt: skip

    def merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
        for key, value in patch.items():
            if key == "containers":
                for container in value:
                    [target] = [c for c in into[key] if c["name"] == container["name"]]
                    merge(target, container)
            elif isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(pod, json.loads(overrides[1]))
    return pod


def test_notes_manual_kubectl_run_passes_restricted_when_the_hook_is_off() -> None:
    text = notes({"image": {"repository": "registry.example/guardedcron", "tag": "1.2.3"}})
    start = text.index("kubectl -n guardedcron-system run guardedcron-migrate")
    command = text[start:text.index("-- db migrate", start)].replace("\\\n", " ")
    pod = kubectl_run_pod(command)
    assert pod["spec"]["containers"][0]["image"] == "registry.example/guardedcron:1.2.3"
    assert restricted_violations(pod["spec"]) == []
    assert pod["spec"]["automountServiceAccountToken"] is False
    kubernetes_validate.validate(pod, KUBERNETES_VERSIONS[-1], strict=True)
    # and the value that makes Helm do it
    assert "--set migration.enabled=true --set migration.databaseSecretRef.name=" in text
