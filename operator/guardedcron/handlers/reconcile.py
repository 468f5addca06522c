"""The reconcile pass and the plain functions kopf's handlers call (no decorators here).

One pass for one GuardedCronJob: parse the spec; if valid, build the desired CronJob
and server-side apply it only when the live one differs in what guardedcron sets;
compute the whole status once and write it only when it changed; then act on what
compute_status decided follows from it (metrics, outcome recording, pods to stop,
skipped runs' Jobs to remove, Events). Every pass, from any trigger, goes through
`reconcile`, so a resync over up-to-date objects writes nothing, whatever woke it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any

import kopf

from guardedcron import arenas, contract
from guardedcron.builders import build_cronjob
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.handled import HandledEssences, ProgressAnnotations
from guardedcron.handlers.lease_loss import stop_lost_workloads
from guardedcron.handlers.locks import (
    delete_if_lock_forbidden,
    lock_change_event,
    lock_refusal,
    refusal_event,
)
from guardedcron.handlers.observe import (
    Body,
    Index,
    Key,
    Observed,
    gcj_key,
    lookup,
    newest_indexed_at,
    observe,
    owner_key,
    trimmed,
)
from guardedcron.handlers.outcomes import record_outcomes
from guardedcron.handlers.scheduling import act_on_slots, suspension_for
from guardedcron.handlers.skipped_jobs import remove_skipped_jobs
from guardedcron.handlers.trigger import act_on_trigger
from guardedcron.kube import (
    CRONJOBS,
    EVENTS,
    GUARDED_CRONJOBS,
    JOBS,
    PODS,
    ApiError,
    Conflict,
    KubeClient,
    KubeError,
    NotFound,
    Resource,
    apply_needed,
)
from guardedcron.kube.credentials import discover_credentials
from guardedcron.objects import controlled_by, get_path, uid_of
from guardedcron.observability.events import build_event
from guardedcron.observability.metrics import forget as forget_metrics
from guardedcron.observability.metrics import reconcile_timer, record_changes, record_suspension
from guardedcron.spec import ParsedSpec, Problem, SpecError, parse_guarded_cronjob
from guardedcron.status import EventReason, RunEvent, RunRecord, SchedulingStatus, compute_status, merge_runs
from guardedcron.status.history import known_records, newest_first
from guardedcron.status.suspension import SuspensionDecision

Logger = logging.Logger | logging.LoggerAdapter[Any]

# A CronJob in the way is retried at this pace until it is deleted or renamed.
NOT_OWNED_RETRY_SECONDS = 60
# kopf's first listing of each watched resource, in pages of this many objects (client-go's
# informers page the same way): one answer of 10,000 objects held its bytes, its text and
# its parsed objects at once, 4 % of a restart's memory peak at that size (docs/benchmarks.md,
# "memory, seventh round"), and was one long request for the API server.
LIST_CHUNK_SIZE = 500


@dataclass(frozen=True)
class PassResult:
    applied: bool  # the CronJob was server-side applied
    status_written: bool
    apply_error: str | None  # why the CronJob is not as desired, if it cannot be
    not_owned: bool = False  # a CronJob of the same name belongs to someone else


async def reconcile(observed: Observed, context: OperatorContext, now: datetime,
                    logger: Logger) -> PassResult:
    """One pass over one GuardedCronJob: at most one apply, a manual Job if the trigger
    annotation asks for one, at most one status patch, then the Events for the run
    transitions that status records; then, for `onLost: StopWorkload`, the deletion of
    pods whose lease was lost (if the settings allow the operator to); the removal of
    skipped runs' Jobs that status records; with outcome recording on, the outcomes of
    runs that just finished go to the database.

    `logger` is kopf's, for this object; kopf posts none of its records as Events: what
    people must see in `kubectl describe` is posted here, each with its own reason."""
    client, memory, settings = context.client, context.memory, context.settings
    gcj = observed.gcj
    namespace, name = gcj_key(gcj)
    uid = uid_of(gcj)
    parsed: ParsedSpec | None
    problems: tuple[Problem, ...] = ()
    trouble: RunEvent | None = None  # what the pass cannot do: a warning and an Event
    lock_events: list[RunEvent] = []
    try:
        parsed = parse_guarded_cronjob(gcj)
    except SpecError as error:
        parsed, problems = None, error.problems
        # The CronJob (if any) keeps its last valid configuration: still guarded
        # (unless its lock is not the namespace's to use: below).
        trouble = _trouble(gcj, EventReason.SPEC_INVALID,
                           f"Spec is invalid; the CronJob is left as it is: {error}")
    else:
        refused = lock_refusal(parsed, settings)
        if refused is not None:  # a shared lock the allow-list does not grant: no CronJob
            parsed, problems = None, (refused,)
            lock_events += refusal_event(refused, uid=uid, memory=memory)

    cronjob = observed.cronjob
    # A valid spec's lock is always the namespace's to use, and the apply below puts it in.
    if parsed is None and cronjob is not None and controlled_by(cronjob, uid):
        deleted, events = await delete_if_lock_forbidden(
            cronjob, namespace=namespace, settings=settings, client=client, logger=logger)
        lock_events += events
        if deleted:
            cronjob = None
    applied = not_owned = False
    apply_error: str | None = None
    previous = memory.written_status(uid) or gcj.get("status") or {}
    # The runs as the previous status and the live Jobs tell them: whether failures
    # suspend the CronJob is decided before it is applied (compute_status reads them again).
    remembered = known_records(previous)
    observed = await with_jobs_the_index_lacks(observed, remembered, client)
    runs = newest_first(merge_runs(remembered, observed.jobs, observed.pods_by_job, now))
    suspension = (suspension_for(gcj, parsed, runs, previous, now) if parsed is not None
                  else SuspensionDecision(suspended=False, status=None))
    if parsed is not None:
        desired = build_cronjob(parsed, settings.build, suspended_for_failures=suspension.suspended)
        if cronjob is not None and not controlled_by(cronjob, uid):
            not_owned = True
            apply_error = (f"CronJob {name} already exists and is not controlled by this "
                           "GuardedCronJob; delete or rename it (guardedcron never takes over "
                           "an object it did not create)")
            trouble = _trouble(gcj, EventReason.CRONJOB_NOT_OWNED, apply_error)
        elif (reason := apply_needed(desired, cronjob, contract.FIELD_MANAGER)) is not None:
            if cronjob is not None:
                lock_events += lock_change_event(cronjob, parsed)
            try:
                cronjob = await client.apply(CRONJOBS, desired)
            except ApiError as error:
                if error.namespace_terminating:
                    logger.debug(f"Not applying CronJob {name}: its namespace is being deleted.")
                    return PassResult(applied=False, status_written=False, apply_error=None,
                                      not_owned=False)
                if not error.permanent:
                    raise  # kopf retries with backoff
                apply_error = error.message
                trouble = _trouble(gcj, EventReason.CRONJOB_REJECTED,
                                   f"The API server refused CronJob {name}: {error}")
            else:
                applied = True
                logger.info(f"Applied CronJob {name}: {reason}.")

    trigger = await act_on_trigger(gcj, None if not_owned else cronjob, previous, client=client,
                                   memory=memory, logger=logger)
    scheduling: SchedulingStatus | None = None  # None: an invalid spec keeps what status says
    slot_events: list[RunEvent] = []
    if parsed is not None:
        slots = await act_on_slots(gcj, parsed, None if not_owned else cronjob, runs=runs,
                                   previous=previous, suspension=suspension, now=now,
                                   client=client, memory=memory, logger=logger)
        scheduling, slot_events = slots.status, slots.events
        # A GuardedCronJob's metric series live as long as it does (arenas): these are
        # made by a make-up run, or by the first pass when the field is set.
        makes_series = slots.started is not None or (
            memory.is_first_pass(uid) and parsed.spec.suspend_after_failures is not None)
        with arenas.kept(makes_series):
            if slots.started is not None:
                context.metrics.make_up_runs.labels(namespace, name, slots.started).inc()
            record_suspension(context.metrics, namespace=namespace, name=name,
                              suspended=None if parsed.spec.suspend_after_failures is None
                              else suspension.suspended)
    change = compute_status(
        gcj=gcj, parsed=parsed, spec_problems=problems, cronjob=cronjob, jobs=observed.jobs,
        pods_by_job=observed.pods_by_job, previous_status=previous, now=now,
        apply_error=apply_error, handled_trigger=trigger.handled, scheduling=scheduling,
        remembered=remembered, no_success_slots=settings.no_success_slots)
    if trouble is not None:
        # Once per change, not once per pass: a resync over an object that is still
        # invalid must write nothing (its Event goes with the status write, below).
        logger.log(logging.WARNING if change.changed else logging.DEBUG, trouble.message)
    if change.changed:
        await client.patch_status(GUARDED_CRONJOBS, namespace, name, change.patch())
        memory.remember_status(uid, change.status)
    # After the write: a pass whose write failed counts nothing (kopf retries it, and the
    # retry sees the same transitions). An unchanged status has none, only gauges. Most
    # of an object's series are made by its first pass: that one is kept (arenas).
    with arenas.kept(memory.is_first_pass(uid)):
        record_changes(context.metrics, namespace=namespace, name=name, changes=change.metrics)
    said = [trouble] if trouble is not None and change.changed else []
    events = [*lock_events, *said, *change.events, *trigger.events, *slot_events]
    if settings.outcome_recording:
        # Once per run: when its record turns final, which happens in one written status.
        events += await record_outcomes(parsed, change.outcomes, namespace=namespace, client=client,
                                        logger=logger)
    # After the status write, so a stopped pod's run already shows as Lost; on every
    # pass, not only changed ones, since a pod to stop may outlive the write.
    events += await stop_lost_workloads(change.stop, namespace=namespace, uid=uid, client=client,
                                        memory=memory, allowed=settings.stop_workload, logger=logger)
    # After the status write too: a skip's Job goes only once status keeps its record.
    events += await remove_skipped_jobs(change.remove, namespace=namespace, uid=uid, client=client,
                                        memory=memory, logger=logger)
    for event in events:
        await post_event(client, build_event(gcj, event, now), logger)
    return PassResult(applied=applied, status_written=change.changed, apply_error=apply_error,
                      not_owned=not_owned)


def _trouble(gcj: Body, reason: EventReason, message: str) -> RunEvent:
    """The Event for what a pass cannot do; one per generation and message (a fix that
    is undone again is a new generation, so it is said again)."""
    generation = (gcj.get("metadata") or {}).get("generation")
    return RunEvent(reason, message, subject=f"{generation}\n{message}")


async def post_event(client: KubeClient, body: Mapping[str, Any], logger: Logger) -> None:
    """Events are for people reading `kubectl describe`; failing to post one must not
    fail the pass (the status already says it)."""
    try:
        await client.create(EVENTS, body["metadata"]["namespace"], body)
    except Conflict:
        pass  # the same transition, posted by a pass that was retried: its name is deterministic
    except KubeError as error:
        logger.warning(f"Could not post Event {body['reason']}: {error}")


async def run_pass(gather: Callable[[], Observed], *, uid: str, context: OperatorContext,
                   logger: Logger) -> PassResult:
    """Gather and reconcile under the GuardedCronJob's lock: passes for one object from
    different watches run one after the other, each on the latest indexed state. At most
    `context.passes` run at once; the slot is taken before the lock, always in that
    order, so whoever holds a lock holds a slot and gets on with its pass."""
    async with context.passes, context.memory.lock(uid):
        context.memory.pass_starting(uid)
        observed = gather()
        namespace, name = gcj_key(observed.gcj)
        try:
            with reconcile_timer(context.metrics, namespace=namespace, name=name):
                return await reconcile(observed, context, context.clock(), logger)
        except Exception as error:
            await _say_failure(observed.gcj, error, context, logger)
            raise  # kopf logs it and retries the pass


async def _say_failure(gcj: Body, error: Exception, context: OperatorContext, logger: Logger) -> None:
    """A pass that raised, as an Event on its GuardedCronJob: once per error and process,
    not once per retry; not for an object deleted under the pass (404)."""
    if not isinstance(error, NotFound) and context.memory.first_time(uid_of(gcj), f"failed\n{error}"):
        event = RunEvent(EventReason.RECONCILE_FAILED, f"A pass failed; kopf retries it: {error}",
                         subject=str(error))
        await post_event(context.client, build_event(gcj, event, context.clock()), logger)


# --- what the decorated handlers call ------------------------------------------------

async def reconcile_guarded_cronjob(
    body: Body, *, context: OperatorContext, cronjobs: Index,
    jobs: Index, pods: Index,
    logger: Logger,
) -> None:
    """Create, update or resume of a GuardedCronJob."""
    gcj = trimmed(body)
    key = gcj_key(gcj)
    cronjob = lookup(cronjobs, key)
    if cronjob is None:
        # The index holds only CronJobs labelled as guardedcron's: ask whether another
        # object holds the name before applying over it.
        cronjob = await _get_or_none(context.client, key)
    uid = uid_of(gcj)
    result = await run_pass(
        lambda: observe(gcj, lookup(cronjobs, key) or cronjob, jobs=jobs, pods=pods),
        uid=uid, context=context, logger=logger)
    if result.not_owned:
        raise kopf.TemporaryError(result.apply_error or "CronJob not owned",
                                  delay=NOT_OWNED_RETRY_SECONDS)


async def repair_cronjob(
    event: Mapping[str, Any], *, context: OperatorContext,
    guarded_cronjobs: Index, cronjobs: Index, jobs: Index,
    pods: Index, logger: Logger,
) -> None:
    """An owned CronJob was added, changed or deleted: reconcile its GuardedCronJob, which
    repairs a CronJob edited or deleted by hand (and sees the CronJob's own status)."""
    cronjob = trimmed(event["object"])
    key = gcj_key(cronjob)  # the CronJob has the GuardedCronJob's name
    deleted = event.get("type") == "DELETED"
    parent = lookup(guarded_cronjobs, key)
    if parent is not None and deleted:
        # The garbage collector deletes the CronJob once its owner is gone, and the two
        # watches may deliver that in either order: ask the API server, not the index.
        parent = await _get_or_none(context.client, key, GUARDED_CRONJOBS)
    if parent is None or (parent.get("metadata") or {}).get("deletionTimestamp"):
        return
    uid = uid_of(parent)
    if not deleted and not controlled_by(cronjob, uid):
        return  # not this GuardedCronJob's CronJob; its own pass reports the clash
    if _listed_and_seen(event.get("type"), uid, context, (cronjobs,), key):
        return
    found = parent
    await run_pass(
        lambda: observe(lookup(guarded_cronjobs, key) or found, None if deleted else cronjob,
                        jobs=jobs, pods=pods),
        uid=uid, context=context, logger=logger)


async def refresh_run_status(
    body: Body, *, context: OperatorContext, guarded_cronjobs: Index,
    cronjobs: Index, jobs: Index, pods: Index,
    logger: Logger, event_type: str | None = "MODIFIED",
) -> None:
    """A Job or Pod of a GuardedCronJob changed (`event_type` None: it was listed):
    recompute the run status. Only with the GuardedCronJob's own CronJob in the index:
    a missing or foreign CronJob is the GuardedCronJob's and the CronJob watch's business."""
    key = owner_key(body)
    if key is None:
        return
    parent = lookup(guarded_cronjobs, key)
    cronjob = lookup(cronjobs, key)
    if parent is None or cronjob is None or (parent.get("metadata") or {}).get("deletionTimestamp"):
        return
    uid = uid_of(parent)
    if not controlled_by(cronjob, uid) or _listed_and_seen(event_type, uid, context, (jobs, pods), key):
        return
    found = parent
    await run_pass(
        lambda: observe(lookup(guarded_cronjobs, key) or found, lookup(cronjobs, key),
                        jobs=jobs, pods=pods),
        uid=uid, context=context, logger=logger)


def _listed_and_seen(event_type: str | None, uid: str, context: OperatorContext,
                     indexes: tuple[Index, ...], key: Key) -> bool:
    """A child (CronJob, Job, Pod) from a watch's listing (kopf marks listed objects with
    no event type) that a pass of its GuardedCronJob reads, or has read, from the index:
    a pass for the child would only repeat it. At start-up every GuardedCronJob gets its
    own pass (kopf's resume or create) once every index is filled, so a restart over N
    GuardedCronJobs makes N passes, not one more per listed CronJob, Job and Pod. A later
    listing (a watch that had to start over) indexes children anew, after the last pass:
    those still get theirs, so a child changed in the gap is seen."""
    if event_type is not None:
        return False
    started = context.memory.last_pass_started(uid)
    if started is None:
        return True  # its first pass is still to come, and will read the index
    # Any child indexed under the key after the pass started (this one, re-listed): pass.
    indexed = [at for index in indexes if (at := newest_indexed_at(index, key)) is not None]
    return bool(indexed) and max(indexed) <= started


def forget_deleted(event: Mapping[str, Any], *, context: OperatorContext, handled: HandledEssences) -> None:
    """Drop what the operator keeps about a deleted GuardedCronJob (lock, last status,
    metric series, the essence kopf last handled)."""
    if event.get("type") == "DELETED":
        body = event["object"]
        namespace, name = gcj_key(body)
        context.memory.forget(uid_of(body))
        handled.forget(body)
        forget_metrics(context.metrics, namespace=namespace, name=name)


async def login(client: KubeClient, settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """kopf's login: the same credentials for kopf's watches and the operator's calls."""
    info = await discover_credentials(settings)
    if info is not None:
        await client.use(info, relogin=partial(discover_credentials, settings))
    return info


def configure_kopf(settings: kopf.OperatorSettings, *, namespaced: bool, handled: HandledEssences) -> None:
    # kopf keeps its retry counts in annotations under contract.KOPF_ANNOTATION_PREFIX:
    # not under guardedcron.io/, whose annotations (the manual trigger) must stay visible
    # to kopf as changes, and not in .status, which the CRD's schema would prune and the
    # operator writes only when its own fields change. The last handled essence stays in
    # memory (handlers/handled.py): no write of its own per create or change.
    prefix = contract.KOPF_ANNOTATION_PREFIX
    settings.persistence.progress_storage = ProgressAnnotations(prefix=prefix)
    settings.persistence.diffbase_storage = handled
    # kopf posts no Events: its log posting gives every one the reason "Logging". The
    # handlers post their own, each with its reason (status/transitions.py, EventReason).
    settings.posting.enabled = False
    # Watching exact namespaces needs no cluster-scoped access (CRDs, Namespaces), and
    # the namespace-scoped install grants none.
    settings.scanning.disabled = namespaced
    settings.watching.chunk_size = LIST_CHUNK_SIZE


async def with_jobs_the_index_lacks(observed: Observed, remembered: Mapping[str, RunRecord],
                                    client: KubeClient) -> Observed:
    """`observed`, plus the Jobs (and their pods) of runs status still has open that the
    index does not hold, read from the API server. A run is closed as deleted only when
    its Job is gone, and an index can lag: a standby operator that resumes re-lists each
    resource on its own, so a GuardedCronJob can come back before its Jobs do."""
    indexed = {get_path(job, "metadata", "name") for job in observed.jobs}
    missing = [name for name, run in remembered.items() if not run.final and name not in indexed]
    if not missing:
        return observed
    namespace, name = gcj_key(observed.gcj)
    jobs, pods_by_job = list(observed.jobs), dict(observed.pods_by_job)
    for job_name in missing:
        job = await _get_or_none(client, (namespace, job_name), JOBS)
        if job is None or owner_key(job) != (namespace, name):
            continue
        jobs.append(job)
        pods = await client.list(PODS, namespace, label_selector=f"{contract.LABEL_JOB_NAME}={job_name}")
        pods_by_job[job_name] = [trimmed(pod, keep_spec=False) for pod in pods]
    return replace(observed, jobs=jobs, pods_by_job=pods_by_job)


async def _get_or_none(client: KubeClient, key: Key, resource: Resource = CRONJOBS) -> Body | None:
    try:
        return trimmed(await client.get(resource, *key))
    except NotFound:
        return None
