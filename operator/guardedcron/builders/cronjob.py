"""The CronJob the operator owns for one GuardedCronJob (pure; see docs/design.md)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from guardedcron import contract
from guardedcron.builders.guard import (
    build_guard_container,
    build_keeper_container,
    build_run_volume,
    build_tls_volumes,
    build_workload_mount,
    merge_image_pull_secrets,
    run_context_env,
)
from guardedcron.spec import OperatorSettings, ParsedSpec
from guardedcron.spec.reserved import owner_labels


def build_cronjob(parsed: ParsedSpec, settings: OperatorSettings, *,
                  suspended_for_failures: bool = False) -> dict[str, Any]:
    """The desired batch/v1 CronJob: same name and namespace as the GuardedCronJob.

    `suspended_for_failures`: the operator stopped the job after spec.suspendAfterFailures
    failed runs in a row (status/suspension.py); the CronJob is suspended, the spec untouched.

    The controller owner reference is left out when the GuardedCronJob has no uid yet
    (a manifest rendered before it was applied): a made-up uid would point at no object
    and the garbage collector would delete the CronJob.
    """
    spec = parsed.spec
    metadata: dict[str, Any] = {
        "name": parsed.name,
        "namespace": parsed.namespace,
        "labels": owner_labels(parsed.name),
        "annotations": {contract.ANNOTATION_LOCK: spec.lease.name},
    }
    if spec.schedule_text != spec.written_schedule:  # H resolved: say from what
        metadata["annotations"][contract.ANNOTATION_WRITTEN_SCHEDULE] = spec.written_schedule
    if parsed.uid is not None:
        metadata["ownerReferences"] = [build_owner_reference(parsed.name, parsed.uid)]

    cron_spec: dict[str, Any] = {"schedule": spec.schedule_text}  # `H` resolved
    if spec.time_zone is not None:
        cron_spec["timeZone"] = spec.time_zone
    cron_spec |= {
        "suspend": spec.suspend or suspended_for_failures,
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": spec.starting_deadline_seconds,
        "successfulJobsHistoryLimit": spec.successful_jobs_history_limit,
        "failedJobsHistoryLimit": spec.failed_jobs_history_limit,
        "jobTemplate": build_job_template(parsed, settings),
    }
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": metadata, "spec": cron_spec}


def build_owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_job_template(parsed: ParsedSpec, settings: OperatorSettings) -> dict[str, Any]:
    """The user's JobTemplateSpec with the guarded fields forced and the guard injected."""
    template = copy.deepcopy(dict(parsed.spec.job_template))
    job: dict[str, Any] = template.get("spec") or {}
    job |= {
        "backoffLimit": 0,
        "activeDeadlineSeconds": parsed.spec.active_deadline_seconds,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": build_pod_failure_policy(),
    }
    pod_template: dict[str, Any] = job.get("template") or {}
    pod_template["metadata"] = _with_owner_labels(pod_template.get("metadata"), parsed.name)
    pod_template["spec"] = _guarded_pod_spec(pod_template.get("spec") or {}, parsed, settings)
    job["template"] = pod_template
    return {"metadata": _with_owner_labels(template.get("metadata"), parsed.name), "spec": job}


def build_pod_failure_policy() -> dict[str, Any]:
    """Fail the Job at once, with reason PodFailurePolicy, when the guard says skip (75) or
    could not decide (64 bad input, 69 database unreachable, 78 schema missing).
    backoffLimit 0 fails the Job on any pod failure anyway; these rules make the Job's
    condition say which case it was."""
    return {"rules": [_fail_job_on_guard_exit(codes) for codes in contract.FAIL_JOB_RULES]}


def _fail_job_on_guard_exit(codes: tuple[int, ...]) -> dict[str, Any]:
    return {
        "action": "FailJob",
        "onExitCodes": {
            # Names the init container: the rule must not match the workload's own exit codes.
            "containerName": contract.GUARD_CONTAINER,
            "operator": "In",
            "values": sorted(codes),
        },
    }


def _with_owner_labels(metadata: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    result = dict(metadata or {})
    result["labels"] = {**(result.get("labels") or {}), **owner_labels(name)}
    return result


def _guarded_pod_spec(pod_spec: dict[str, Any], parsed: ParsedSpec,
                      settings: OperatorSettings) -> dict[str, Any]:
    injected = [build_guard_container(parsed, settings)]
    if parsed.spec.lease.heartbeat:
        injected.append(build_keeper_container(parsed, settings))
    env = run_context_env(parsed)
    user_init = [_with_workload_mount(c, env) for c in pod_spec.get("initContainers") or ()]
    pod_spec["initContainers"] = injected + user_init
    pod_spec["containers"] = [_with_workload_mount(c, env)
                              for c in pod_spec.get("containers") or ()]
    pod_spec["volumes"] = [build_run_volume(settings), *build_tls_volumes(parsed, settings),
                           *(pod_spec.get("volumes") or ())]
    pull_secrets = merge_image_pull_secrets(pod_spec.get("imagePullSecrets"), settings)
    if pull_secrets:  # only when there are some, so CronJobs without any stay as they were
        pod_spec["imagePullSecrets"] = pull_secrets
    pod_spec["restartPolicy"] = "Never"
    return pod_spec


def _with_workload_mount(container: Mapping[str, Any], env: list[dict[str, Any]]
                         ) -> dict[str, Any]:
    result = dict(container)
    if env:  # first, so that a variable the container defines itself wins
        result["env"] = [*(dict(item) for item in env), *(result.get("env") or ())]
    result["volumeMounts"] = [*(result.get("volumeMounts") or ()), build_workload_mount()]
    return result
