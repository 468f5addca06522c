"""Jobs and Pods shaped the way the API server returns them (batch/v1, v1), for status tests.

Shapes follow Kubernetes 1.33+: the Job controller first adds `FailureTarget` or
`SuccessCriteriaMet`, then `Failed`/`Complete` once the pod has terminated; a
podFailurePolicy failure reads "Container <c> for pod <ns>/<pod> failed with exit code
<n> matching FailJob rule at index <i>"; a native sidecar is an init container status
whose restarts show in `lastState` while `state` is running again. Termination
messages are produced by the guard's own writer, byte for byte what a pod shows.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.guard.outputs import write_termination_message
from tests.support.gcj import base_gcj

NAMESPACE = "billing"
CRONJOB = "nightly-invoices"
GCJ_UID = "6f1c1f5e-2b7a-4c1e-9d59-3f0b8f1c2a77"
CRONJOB_UID = "0b9e3a55-7f7c-4d8e-8f55-2d5c1a9e6b10"
LOCK = "billing/nightly-invoices"


def ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def minute_of(t: datetime) -> int:
    return int(t.timestamp()) // 60


def guard_message(summary: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What the guard writes to its termination log for `summary` (the real writer)."""
    log = tmp_path / f"termination-{len(list(tmp_path.iterdir()))}"
    log.write_text("")
    monkeypatch.setenv(contract.ENV_TERMINATION_LOG, str(log))
    write_termination_message(summary)
    return log.read_text()


def acquired_summary(holder: str, fence: int, slot: int | None) -> dict[str, Any]:
    """The keys `guardedcron acquire` writes when it wins (cli/guard_commands.py)."""
    return {"outcome": "acquired", "acquired": True, "reason": "acquired", "lock": LOCK,
            "holder": holder, "fence": fence, "slot": slot,
            "locked_until": "2025-06-02T01:35:00+00:00", "run_id": 4411}


def skipped_summary(requester: str, winner: str, fence: int, slot: int | None,
                    reason: str = "lease-held") -> dict[str, Any]:
    return {"outcome": "skipped", "requester": requester, "acquired": False, "reason": reason,
            "lock": LOCK, "holder": winner, "fence": fence, "slot": slot,
            "locked_until": "2025-06-02T01:35:00+00:00", "run_id": None}


def error_summary(holder: str, exit_code: int, reason: str) -> dict[str, Any]:
    return {"outcome": "error", "exitCode": exit_code, "lock": LOCK, "holder": holder, "reason": reason}


def job(
    *,
    slot_time: datetime | None,
    created: datetime,
    name: str | None = None,
    zone_offset: timedelta = timedelta(0),
    manual_annotation: str | None = None,
    started: datetime | None = None,
    conditions: list[dict[str, Any]] | None = None,
    completion: datetime | None = None,
    counts: dict[str, int] | None = None,
    active: int = 0,
) -> dict[str, Any]:
    """A Job of the CronJob. `slot_time` None: made by hand (no scheduled-timestamp)."""
    if name is None:
        name = f"{CRONJOB}-{minute_of(slot_time)}" if slot_time is not None else f"{CRONJOB}-manual-x7k2p"
    annotations: dict[str, str] = {}
    if slot_time is not None:
        # The controller writes the slot in the CronJob's time zone (RFC 3339 with offset).
        local = slot_time.astimezone(UTC) + zone_offset
        minutes = int(zone_offset.total_seconds() // 60)
        sign, size = ("+" if minutes > 0 else "-"), abs(minutes)
        suffix = "Z" if minutes == 0 else f"{sign}{size // 60:02d}:{size % 60:02d}"
        annotations[contract.ANNOTATION_SCHEDULED_TIMESTAMP] = local.strftime("%Y-%m-%dT%H:%M:%S") + suffix
    if manual_annotation == "kubectl":
        annotations["cronjob.kubernetes.io/instantiate"] = "manual"
    elif manual_annotation == "trigger":
        annotations[contract.ANNOTATION_MANUAL] = "true"
    uid = f"job-uid-{name}"
    status: dict[str, Any] = {"ready": 0, "terminating": 0, "uncountedTerminatedPods": {}}
    if active:
        status["active"] = active
    if started is not None:
        status["startTime"] = ts(started)
    if conditions:
        status["conditions"] = conditions
    if completion is not None:
        status["completionTime"] = ts(completion)
    status.update(counts or {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid,
            "resourceVersion": "48113",
            "generation": 1,
            "creationTimestamp": ts(created),
            "labels": {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
                contract.LABEL_NAME: CRONJOB,
                contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
            },
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob", "name": CRONJOB, "uid": CRONJOB_UID,
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {
            "activeDeadlineSeconds": 3600,
            "backoffLimit": 0,
            "completionMode": "NonIndexed",
            "completions": 1,
            "parallelism": 1,
            "podReplacementPolicy": "Failed",
            "suspend": False,
        },
        "status": status,
    }


def condition(kind: str, reason: str, message: str, at: datetime) -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": ts(at), "lastTransitionTime": ts(at)}


def complete_conditions(at: datetime) -> list[dict[str, Any]]:
    message = "Reached expected number of succeeded pods"
    return [condition("SuccessCriteriaMet", "CompletionsReached", message, at),
            condition("Complete", "CompletionsReached", message, at)]


def failed_conditions(reason: str, message: str, at: datetime) -> list[dict[str, Any]]:
    return [condition("FailureTarget", reason, message, at), condition("Failed", reason, message, at)]


def rule_message(pod_name: str, exit_code: int, index: int) -> str:
    return (f"Container {contract.GUARD_CONTAINER} for pod {NAMESPACE}/{pod_name} failed with exit code "
            f"{exit_code} matching FailJob rule at index {index}")


def terminated(exit_code: int, started: datetime, finished: datetime, message: str | None = None,
               reason: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        "startedAt": ts(started),
        "finishedAt": ts(finished),
        "containerID": f"containerd://{exit_code:02d}{int(finished.timestamp()):x}",
    }
    if message is not None:
        state["message"] = message
    return state


def container_status(name: str, *, state: dict[str, Any], last_state: dict[str, Any] | None = None,
                     restarts: int = 0, ready: bool = False, started: bool | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": name,
        "image": "ghcr.io/guardedcron/guardedcron:0.1.0" if name.startswith("guardedcron-") else "shop:1.42",
        "imageID": "ghcr.io/guardedcron/guardedcron@sha256:" + "ab" * 32,
        "ready": ready,
        "restartCount": restarts,
        "state": state,
        "lastState": last_state or {},
    }
    if "terminated" in state or "running" in state:
        status["containerID"] = "containerd://" + "cd" * 32
    if started is not None:
        status["started"] = started
    return status


WAITING_INIT = {"waiting": {"reason": "PodInitializing"}}


def pod(
    job_body: dict[str, Any],
    *,
    created: datetime,
    phase: str,
    init_statuses: list[dict[str, Any]],
    statuses: list[dict[str, Any]] | None = None,
    suffix: str = "q7xkz",
) -> dict[str, Any]:
    job_name = job_body["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-{suffix}",
            "namespace": NAMESPACE,
            "uid": f"pod-uid-{job_name}-{suffix}",
            "creationTimestamp": ts(created),
            "labels": {
                "batch.kubernetes.io/controller-uid": job_body["metadata"]["uid"],
                "batch.kubernetes.io/job-name": job_name,
                "controller-uid": job_body["metadata"]["uid"],
                "job-name": job_name,
                contract.LABEL_NAME: CRONJOB,
                contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
            },
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                 "uid": job_body["metadata"]["uid"], "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "status": {
            "phase": phase,
            "hostIP": "10.0.0.7",
            "podIP": "10.244.1.23",
            "qosClass": "Burstable",
            "startTime": ts(created),
            "initContainerStatuses": init_statuses,
            "containerStatuses": statuses if statuses is not None else [
                container_status("task", state=WAITING_INIT)],
        },
    }


def pod_name(job_body: dict[str, Any], suffix: str = "q7xkz") -> str:
    return f"{job_body['metadata']['name']}-{suffix}"


def holder_of(job_body: dict[str, Any], suffix: str = "q7xkz") -> str:
    return f"{NAMESPACE}/{pod_name(job_body, suffix)}"


def gcj_body(*, created: datetime, generation: int = 1, spec: dict[str, Any] | None = None,
             status: dict[str, Any] | None = None) -> dict[str, Any]:
    body = base_gcj()
    body["metadata"] |= {"generation": generation, "creationTimestamp": ts(created), "uid": GCJ_UID}
    if spec:
        body["spec"] |= copy.deepcopy(spec)
    if status is not None:
        body["status"] = copy.deepcopy(status)
    return body


def json_roundtrip(value: Any) -> Any:
    """What the API server hands back after storing `value` (plain JSON types)."""
    return json.loads(json.dumps(value))
