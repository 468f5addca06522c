"""A manual run: a Job made from the CronJob's jobTemplate, as `kubectl create job
--from=cronjob/NAME` makes it (pure).

Both ways of starting one (`guardedcron trigger` and the `guardedcron.io/trigger`
annotation the operator acts on) build the Job here, so the two cannot drift apart.
The Job carries the CronJob's pod template, so the guard init container is in it and
the run is guarded like a scheduled one; its name never has the `<cronjob>-<digits>`
shape, which is how the guard and the status code tell a scheduled run (with a slot)
from a manual one (the lease alone).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any, Final

from guardedcron import contract
from guardedcron.builders.guard import mark_run_kind
from guardedcron.objects import get_path

MANUAL_INFIX: Final = "-manual-"
JOB_NAME_MAX: Final = 63  # the Job's name is also a label value on its pods
# Values of contract.ANNOTATION_MANUAL: who asked for the run.
STARTED_BY_CLI: Final = "guardedcron-trigger"
STARTED_BY_ANNOTATION: Final = "trigger-annotation"
TRIGGER_TOKEN_MAX: Final = contract.NAME_MAX
# The alphabet Kubernetes uses for generated name suffixes: no vowels (no words), no
# look-alikes. The suffix ends in a letter, so the name never ends in digits.
SUFFIX_CHARACTERS: Final = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LETTERS: Final = "bcdfghjklmnpqrstvwxz"
SUFFIX_LENGTH: Final = 5


class ManualRunError(ValueError):
    """The CronJob cannot give a guarded manual run; the message says why."""


def manual_job_name(cronjob_name: str, suffix: str) -> str:
    """`<cronjob>-manual-<suffix>`, the CronJob part shortened when the whole would pass
    63 characters (CronJob names may have 52)."""
    if not suffix or not suffix[-1].isalpha():
        raise ValueError(f"a manual Job's name suffix must end in a letter, not {suffix!r}")
    room = JOB_NAME_MAX - len(MANUAL_INFIX) - len(suffix)
    prefix = cronjob_name[:room].rstrip("-")
    return f"{prefix}{MANUAL_INFIX}{suffix}"


def suffix_from_bytes(data: bytes) -> str:
    """A name suffix in Kubernetes' alphabet, ending in a letter, from random or hashed bytes
    (at least SUFFIX_LENGTH of them)."""
    if len(data) < SUFFIX_LENGTH:
        raise ValueError(f"need {SUFFIX_LENGTH} bytes, got {len(data)}")
    head = "".join(SUFFIX_CHARACTERS[b % len(SUFFIX_CHARACTERS)] for b in data[:SUFFIX_LENGTH - 1])
    return head + SUFFIX_LETTERS[data[SUFFIX_LENGTH - 1] % len(SUFFIX_LETTERS)]


def trigger_job_name(cronjob_name: str, gcj_uid: str, token: str) -> str:
    """The one Job name a trigger token maps to: the same token on the same object gives the
    same name, so a second attempt (a resync, a restart) is refused as AlreadyExists."""
    digest = hashlib.sha256(f"{gcj_uid}\n{token}".encode()).digest()
    return manual_job_name(cronjob_name, suffix_from_bytes(digest))


def trigger_token_problem(token: str) -> str | None:
    """Why an annotation value cannot be a trigger token, or None when it can."""
    if len(token) > TRIGGER_TOKEN_MAX:
        return f"is {len(token)} characters long; at most {TRIGGER_TOKEN_MAX}"
    if contract.CONTROL_CHARACTERS.search(token):
        return "must not contain control characters (newlines, tabs)"
    return None


def unguarded_reason(cronjob: Mapping[str, Any]) -> str | None:
    """Why a Job from this CronJob would not be guarded, or None when the guard is its first
    init container (as the operator builds it)."""
    init = get_path(cronjob, "spec", "jobTemplate", "spec", "template", "spec", "initContainers")
    if not isinstance(init, list) or not init or not isinstance(init[0], Mapping) \
            or init[0].get("name") != contract.GUARD_CONTAINER:
        return f"its job template does not start with the {contract.GUARD_CONTAINER} init container"
    return None


def build_manual_job(cronjob: Mapping[str, Any], *, job_name: str, started_by: str,
                     token: str | None = None) -> dict[str, Any]:
    """The batch/v1 Job for one manual run of `cronjob` (as read from the API server).

    Like kubectl: the template's labels and annotations, kubectl's `instantiate: manual`
    annotation, and a controller owner reference to the CronJob, so the CronJob's history
    limits and the garbage collector treat it as one of its Jobs. No `blockOwnerDeletion`:
    where the OwnerReferencesPermissionEnforcement admission plugin runs, setting it needs
    `update` on cronjobs/finalizers, which the operator is not granted; the garbage
    collector deletes the Job with its CronJob either way.
    """
    problem = unguarded_reason(cronjob)
    if problem is not None:
        raise ManualRunError(problem)
    metadata = get_path(cronjob, "metadata") or {}
    name, namespace, uid = metadata.get("name"), metadata.get("namespace"), metadata.get("uid")
    if not (isinstance(name, str) and isinstance(namespace, str) and isinstance(uid, str) and uid):
        raise ManualRunError("the CronJob has no name, namespace or uid (not read from the API server?)")
    template = get_path(cronjob, "spec", "jobTemplate") or {}
    template_meta = template.get("metadata") or {}
    annotations = {
        **(template_meta.get("annotations") or {}),
        contract.ANNOTATION_KUBECTL_INSTANTIATE: contract.INSTANTIATE_MANUAL,
        contract.ANNOTATION_MANUAL: started_by,
    }
    if token is not None:
        annotations[contract.ANNOTATION_TRIGGER] = token
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": namespace,
            "labels": dict(template_meta.get("labels") or {}),
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob", "name": name, "uid": uid,
                "controller": True,
            }],
        },
        "spec": copy.deepcopy(dict(template.get("spec") or {})),
    }




def build_slot_job(cronjob: Mapping[str, Any], *, slot: int, scheduled_at: str,
                   run_kind: str, attempt: int) -> dict[str, Any]:
    """Attempt `attempt` at the past slot `slot` of `cronjob`: a make-up run (catch-up) or
    a backfill run (docs/design.md, "Catch-up and backfill").

    Named `<cronjob>-<slot>-<c|b><attempt>` (contract.attempt_job_name): never the
    controller's name for the slot, whose Job may exist. Its guard is given the slot with
    `--slot` instead of reading it from the Job's name, so it claims that slot exactly as
    the scheduled run would have: whichever cluster runs the slot first wins, every other
    copy skips. Not a manual run: no `instantiate: manual`, no guardedcron.io/manual, and
    the CronJob controller's scheduled-timestamp annotation (`scheduled_at`, RFC 3339),
    from which status reads the slot. `run_kind` (contract.RUN_KIND_*) goes on the Job,
    on its pod template (downward API) and to the guard (`--run-kind`, for lease.json).
    """
    metadata = get_path(cronjob, "metadata") or {}
    name = contract.attempt_job_name(str(metadata.get("name") or ""), slot, run_kind, attempt)
    job = build_manual_job(cronjob, job_name=name, started_by=run_kind)
    annotations = job["metadata"]["annotations"]
    for key in (contract.ANNOTATION_KUBECTL_INSTANTIATE, contract.ANNOTATION_MANUAL):
        annotations.pop(key, None)
    annotations[contract.ANNOTATION_SCHEDULED_TIMESTAMP] = scheduled_at
    annotations[contract.ANNOTATION_RUN_KIND] = run_kind
    pod_metadata = job["spec"].setdefault("template", {}).setdefault("metadata", {})
    pod_metadata["annotations"] = {**(pod_metadata.get("annotations") or {}),
                                   contract.ANNOTATION_RUN_KIND: run_kind}
    for container in get_path(job, "spec", "template", "spec", "initContainers") or ():
        if isinstance(container, dict) and container.get("name") == contract.GUARD_CONTAINER:
            container["args"] = _with_slot(list(container.get("args") or ()), slot)
    return mark_run_kind(job, run_kind)


def _with_slot(args: list[str], slot: int) -> list[str]:
    """The guard's arguments with `--job-name X` (the slot from the Job's name) replaced
    by `--slot N`, and the `--cronjob` that only goes with --job-name dropped."""
    result: list[str] = []
    pairs = iter(args)
    for arg in pairs:
        if arg in ("--job-name", "--cronjob"):
            next(pairs, None)
            continue
        result.append(arg)
    return [*result, "--slot", str(slot)]
