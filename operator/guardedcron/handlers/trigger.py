"""The GitOps way to start a manual run: the `guardedcron.io/trigger` annotation.

When the annotation's value (a token) is non-empty and differs from the
`status.lastTriggerToken` the operator wrote, the pass creates one Job from the
CronJob, named from the GuardedCronJob's uid and the token. A second attempt for the
same token (a pass retried after its status write failed, a restart before it) gets
AlreadyExists from the API server, and that counts as done: one run per token.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from guardedcron import contract
from guardedcron.builders.manual import (
    STARTED_BY_ANNOTATION,
    ManualRunError,
    build_manual_job,
    trigger_job_name,
    trigger_token_problem,
)
from guardedcron.handlers.context import PassMemory
from guardedcron.handlers.observe import Body
from guardedcron.kube import JOBS, ApiError, Conflict, KubeClient
from guardedcron.objects import controlled_by, uid_of
from guardedcron.status import EventReason, RunEvent

Logger = logging.Logger | logging.LoggerAdapter[Any]


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


async def act_on_trigger(gcj: Body, cronjob: Body | None, previous_status: Mapping[str, Any], *,
                         client: KubeClient, memory: PassMemory, logger: Logger) -> TriggerResult:
    token = pending_token(gcj, previous_status)
    if token is None:
        return TriggerResult()
    metadata = gcj.get("metadata") or {}
    uid, namespace = uid_of(gcj), str(metadata.get("namespace") or "")
    if cronjob is None or not controlled_by(cronjob, uid):
        # Nothing to copy yet; the pass that creates (or frees) the CronJob acts on it.
        logger.debug(f"Trigger {token!r} waits for this GuardedCronJob's CronJob.")
        return TriggerResult()

    def refused(why: str) -> TriggerResult:
        # Tried once per token in this process: every Job or Pod event starts a pass, and
        # repeating a refused request on each would only repeat the refusal. A new token
        # (or an operator restart) tries again.
        if not memory.first_time(uid, f"trigger\n{token}"):
            return TriggerResult()
        message = f"no manual run for trigger token {token!r}: {why}"
        logger.info(message)  # the TriggerFailed Event below says it to `kubectl describe`
        return TriggerResult(events=[RunEvent(EventReason.TRIGGER_FAILED, message, subject=token)])

    problem = trigger_token_problem(token)
    if problem is not None:
        return refused(f"the annotation {contract.ANNOTATION_TRIGGER} {problem}")
    name = trigger_job_name(str(cronjob["metadata"]["name"]), uid, token)
    try:
        job = build_manual_job(cronjob, job_name=name, started_by=STARTED_BY_ANNOTATION, token=token)
    except ManualRunError as error:
        return refused(f"CronJob {cronjob['metadata']['name']} cannot give a guarded run: {error}")
    try:
        await client.create(JOBS, namespace, job)
    except Conflict:
        logger.info(f"Job {name} for trigger token {token!r} already exists.")
        return TriggerResult(handled=token)
    except ApiError as error:
        if error.namespace_terminating:
            return TriggerResult()  # the namespace is going away, and its runs with it
        return refused(f"the API server refused Job {name}: {error}")
    logger.info(f"Created Job {name} for trigger token {token!r}.")
    message = f"manual run {name} created for trigger token {token!r}"
    return TriggerResult(handled=token, events=[
        RunEvent(EventReason.MANUAL_RUN_CREATED, message, subject=name)])
