"""The GitOps way to start a manual run: the `guardedcron.io/trigger` annotation.

When the annotation's value (a token) is non-empty and differs from the
`status.lastTriggerToken` the operator wrote, the pass creates one Job from the
CronJob, named from the GuardedCronJob's uid and the token. A second attempt for the
same token (a pass retried after its status write failed, a restart before it) gets
AlreadyExists from the API server, and that counts as done: one run per token.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from logging import DEBUG, INFO
from typing import Any

from guardedcron import contract
from guardedcron.builders.manual import (
    STARTED_BY_ANNOTATION,
    ManualRunError,
    build_manual_job,
    trigger_job_name,
    trigger_token_problem,
)
from guardedcron.objects import controlled_by, get_path, uid_of
from guardedcron.planner.actions import Action, Body, CreateJob, Log, Refused
from guardedcron.planner.once import Once
from guardedcron.status import EventReason, RunEvent


@dataclass(frozen=True)
class TriggerResult:
    handled: str | None = None  # the token to record as status.lastTriggerToken
    events: list[RunEvent] = field(default_factory=list)


def pending_token(gcj: Body, previous_status: Mapping[str, Any]) -> str | None:
    """The trigger token still to act on, if any."""
    annotations = (gcj.get("metadata") or {}).get("annotations") or {}
    token = annotations.get(contract.ANNOTATION_TRIGGER)
    if not isinstance(token, str) or not token.strip():
        return None
    return None if token == previous_status.get("lastTriggerToken") else token


def plan_trigger(gcj: Body, cronjob: Body | None, previous_status: Mapping[str, Any],
                 once: Once) -> Generator[Action, Any, TriggerResult]:
    token = pending_token(gcj, previous_status)
    if token is None:
        return TriggerResult()
    uid, namespace = uid_of(gcj), str(get_path(gcj, "metadata", "namespace") or "")
    if cronjob is None or not controlled_by(cronjob, uid):
        # Nothing to copy yet; the pass that creates (or frees) the CronJob acts on it.
        yield Log(DEBUG, f"Trigger {token!r} waits for this GuardedCronJob's CronJob.")
        return TriggerResult()

    def refused(why: str) -> Generator[Action, Any, TriggerResult]:
        # Tried once per token in this process: a new token (or a restart) tries again.
        if not (yield from once.first_time(f"trigger\n{token}")):
            return TriggerResult()
        message = f"no manual run for trigger token {token!r}: {why}"
        yield Log(INFO, message)  # the TriggerFailed Event says it to `kubectl describe`
        return TriggerResult(events=[RunEvent(EventReason.TRIGGER_FAILED, message, subject=token)])

    problem = trigger_token_problem(token)
    if problem is not None:
        return (yield from refused(f"the annotation {contract.ANNOTATION_TRIGGER} {problem}"))
    cronjob_name = str(get_path(cronjob, "metadata", "name"))
    name = trigger_job_name(cronjob_name, uid, token)
    try:
        job = build_manual_job(cronjob, job_name=name, started_by=STARTED_BY_ANNOTATION, token=token)
    except ManualRunError as error:
        return (yield from refused(f"CronJob {cronjob_name} cannot give a guarded run: {error}"))
    result = yield CreateJob(namespace, job)
    if isinstance(result, Refused):
        if result.code is None:
            raise result.error  # no answer: the pass runs again
        if result.code == 409:
            yield Log(INFO, f"Job {name} for trigger token {token!r} already exists.")
            return TriggerResult(handled=token)
        if result.namespace_terminating:
            return TriggerResult()  # the namespace is going away, and its runs with it
        return (yield from refused(f"the API server refused Job {name}: {result.error}"))
    yield Log(INFO, f"Created Job {name} for trigger token {token!r}.")
    message = f"manual run {name} created for trigger token {token!r}"
    return TriggerResult(handled=token, events=[
        RunEvent(EventReason.MANUAL_RUN_CREATED, message, subject=name)])
