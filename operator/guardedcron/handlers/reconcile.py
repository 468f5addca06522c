"""The executor of the reconcile pass, and the plain functions kopf's handlers call (no
decorators here).

A pass is planned by `guardedcron.planner.plan_pass` (pure); `execute` performs each
action it yields against the API server, the operator's memory, the metrics or the
database, and sends back the result, until the plan returns. Every pass, from any
trigger, goes through `reconcile`, so a resync over up-to-date objects writes nothing,
whatever woke it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from functools import partial
from typing import Any, cast

import kopf

from guardedcron import contract
from guardedcron.handlers.caches import RETRY_SECONDS, Caches, ObjectCache, PassQueue
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.handled import HandledEssences, ProgressAnnotations
from guardedcron.handlers.observe import (
    Body,
    Cached,
    Key,
    gcj_key,
    lookup,
    newest_stored_at,
    observe,
    owner_key,
    trimmed,
)
from guardedcron.handlers.outcomes import record_outcomes
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
)
from guardedcron.kube.credentials import discover_credentials
from guardedcron.objects import controlled_by, uid_of
from guardedcron.observability.events import build_event
from guardedcron.observability.metrics import forget as forget_metrics
from guardedcron.observability.metrics import reconcile_timer, record_changes, record_suspension
from guardedcron.planner import Observed, PassResult, PassView, Plan, plan_pass
from guardedcron.planner.actions import (
    Action,
    ApplyCronJob,
    CountMakeUpRun,
    CreateJob,
    DeleteCronJob,
    DeleteJob,
    DeletePod,
    Done,
    FetchedRuns,
    FetchRuns,
    Forget,
    Log,
    PatchStatus,
    PostEvents,
    RecordChanges,
    RecordOutcomes,
    RecordSuspension,
    Refused,
    Remember,
    Result,
)
from guardedcron.status import EventReason, RunEvent

Logger = logging.Logger | logging.LoggerAdapter[Any]

# A CronJob in the way is retried at this pace until it is deleted or renamed.
NOT_OWNED_RETRY_SECONDS = 60
# kopf's first listing of each watched resource, in pages of this many objects (client-go's
# informers page the same way): one answer of 10,000 objects is one long request for the
# API server, held in memory whole.
LIST_CHUNK_SIZE = 500
IDLE_SECONDS = 0.5


async def reconcile(observed: Observed, context: OperatorContext, now: datetime,
                    logger: Logger) -> PassResult:
    """One pass over one GuardedCronJob: its plan, executed. `logger` is kopf's, for this
    object; kopf posts none of its records as Events: what people must see in `kubectl
    describe` is posted by the plan, each with its own reason."""
    memory, uid = context.memory, uid_of(observed.gcj)
    view = PassView(observed=observed, settings=context.settings, now=now,
                    written_status=memory.written_status(uid), done=memory.taken(uid))
    return await execute(plan_pass(view), observed.gcj, context, now, logger)


async def execute(plan: Plan, gcj: Body, context: OperatorContext, now: datetime,
                  logger: Logger) -> PassResult:
    """Perform each action of `plan` in order and send it the result. An exception the
    plan raises (a request to retry) ends the pass; it runs again later."""
    answer: Any = None
    try:
        while True:
            answer = await _perform(plan.send(answer), gcj, context, now, logger)
    except StopIteration as finished:
        result: PassResult = finished.value
        return result


async def _perform(action: Action, gcj: Body, context: OperatorContext, now: datetime,
                   logger: Logger) -> Any:
    client, memory, metrics = context.client, context.memory, context.metrics
    match action:
        case ApplyCronJob(body=body):
            return await _answer(client.apply(CRONJOBS, body))
        case DeleteCronJob(namespace=namespace, name=name, uid=uid):
            return await _answer(client.delete(CRONJOBS, namespace, name, uid=uid))
        case CreateJob(namespace=namespace, body=body):
            return await _answer(client.create(JOBS, namespace, body))
        case DeletePod(namespace=namespace, name=name, uid=uid):
            return await _answer(client.delete(PODS, namespace, name, uid=uid))
        case DeleteJob(namespace=namespace, name=name, uid=uid):
            return await _answer(client.delete(JOBS, namespace, name, uid=uid))
        case FetchRuns():
            return await _fetch_runs(client, action)
        case PatchStatus(namespace=namespace, name=name, patch=patch, status=status):
            await client.patch_status(GUARDED_CRONJOBS, namespace, name, patch)
            memory.remember_status(uid_of(gcj), status)
        case Remember(key=key):
            memory.first_time(uid_of(gcj), key)
        case Forget(key=key):
            memory.forget_action(uid_of(gcj), key)
        case Log(level=level, message=message):
            logger.log(level, message)
        case CountMakeUpRun(namespace=namespace, name=name, kind=kind):
            metrics.make_up_runs.labels(namespace, name, kind).inc()
        case RecordSuspension(namespace=namespace, name=name, suspended=suspended):
            record_suspension(metrics, namespace=namespace, name=name, suspended=suspended)
        case RecordChanges(namespace=namespace, name=name, changes=changes):
            record_changes(metrics, namespace=namespace, name=name, changes=changes)
        case RecordOutcomes(namespace=namespace, parsed=parsed, records=records):
            return await record_outcomes(parsed, records, namespace=namespace, client=client,
                                         logger=logger)
        case PostEvents(events=events):
            for event in events:
                await post_event(client, build_event(gcj, event, now), logger)
    return None


async def _answer(request: Awaitable[Mapping[str, Any] | None]) -> Result:
    """A request's result as the plan reads it: the object returned, or the refusal."""
    try:
        body = await request
    except ApiError as error:
        return Refused(error, error.code, error.message, error.namespace_terminating)
    except KubeError as error:  # no answer at all
        return Refused(error, None, str(error))
    return Done(body)


async def _fetch_runs(client: KubeClient, fetch: FetchRuns) -> FetchedRuns:
    """The Jobs named (those that still exist and belong to the GuardedCronJob) and their pods."""
    jobs: list[Body] = []
    pods_by_job: dict[str, list[Body]] = {}
    for job_name in fetch.job_names:
        job = await _get_or_none(client, (fetch.namespace, job_name), JOBS)
        if job is None or owner_key(job) != (fetch.namespace, fetch.owner):
            continue
        jobs.append(job)
        selector = f"{contract.LABEL_JOB_NAME}={job_name}"
        pods = await client.list(PODS, fetch.namespace, label_selector=selector)
        pods_by_job[job_name] = [trimmed(pod, keep_spec=False) for pod in pods]
    return FetchedRuns(jobs, pods_by_job)


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
    """Gather and reconcile under the GuardedCronJob's lock: passes for one object run
    one after the other, each on the latest cached state. At most
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
            raise  # logged, and the pass runs again


async def _say_failure(gcj: Body, error: Exception, context: OperatorContext, logger: Logger) -> None:
    """A pass that raised, as an Event on its GuardedCronJob: once per error and process,
    not once per retry; not for an object deleted under the pass (404)."""
    if not isinstance(error, NotFound) and context.memory.first_time(uid_of(gcj), f"failed\n{error}"):
        event = RunEvent(EventReason.RECONCILE_FAILED, f"A pass failed; it runs again: {error}",
                         subject=str(error))
        await post_event(context.client, build_event(gcj, event, context.clock()), logger)


# --- what the decorated handlers call ------------------------------------------------

def queue_pass(body: Body, *, queue: PassQueue) -> None:
    """Create, update or resume of a GuardedCronJob, or its catch-up timer: queue its pass."""
    queue.add(gcj_key(body))


def store_guarded_cronjob(event: Mapping[str, Any], *, context: OperatorContext, caches: Caches,
                          handled: HandledEssences) -> None:
    """Every event of a GuardedCronJob: keep the cache current; a deletion also drops what
    the operator keeps about it."""
    body = event["object"]
    if event.get("type") == "DELETED":
        caches.guarded_cronjobs.delete(body)
        forget_deleted(body, context=context, handled=handled)
    else:
        caches.guarded_cronjobs.store(body)


async def run_queued_pass(key: Key, *, context: OperatorContext, caches: Caches,
                          settings: kopf.OperatorSettings) -> float | None:
    """The pass for `key` from the caches, logged as kopf logs an object's handlers.
    Returns after how long to run it again, if it must be: RETRY_SECONDS after an error,
    NOT_OWNED_RETRY_SECONDS while a CronJob of that name is someone else's."""
    gcj = lookup(caches.guarded_cronjobs, key)
    if gcj is None or (gcj.get("metadata") or {}).get("deletionTimestamp"):
        return None  # deleted meanwhile, or being deleted
    logger = kopf.LocalObjectLogger(body=cast(kopf.Body, gcj), settings=settings)
    cronjob = lookup(caches.cronjobs, key)
    if cronjob is None:
        # The cache holds only CronJobs labelled as guardedcron's: ask whether another
        # object holds the name before applying over it.
        cronjob = await _get_or_none(context.client, key)
    found = cronjob
    try:
        result = await run_pass(
            lambda: observe(lookup(caches.guarded_cronjobs, key) or gcj,
                            lookup(caches.cronjobs, key) or found, jobs=caches.jobs, pods=caches.pods),
            uid=uid_of(gcj), context=context, logger=logger)
    except NotFound:
        # Its status is gone: the GuardedCronJob was deleted while no watch said so (a
        # re-listing after the watch's window closed). Nothing to run again.
        logger.info("Gone from the API server; forgotten.")
        caches.guarded_cronjobs.delete(gcj)
        context.memory.forget(uid_of(gcj))
        forget_metrics(context.metrics, namespace=key[0], name=key[1])
        return None
    except Exception:
        logger.exception(f"The pass failed; it runs again in {RETRY_SECONDS:.0f} s.")
        return RETRY_SECONDS
    if result.not_owned:
        logger.error(f"{result.apply_error}; trying again in {NOT_OWNED_RETRY_SECONDS} s.")
        return NOT_OWNED_RETRY_SECONDS
    return None


async def repair_cronjob(event: Mapping[str, Any], *, context: OperatorContext, caches: Caches,
                         queue: PassQueue) -> None:
    """An owned CronJob was added, changed or deleted: queue its GuardedCronJob's pass,
    which repairs a CronJob edited or deleted by hand (and sees the CronJob's own status)."""
    body = event["object"]
    deleted = event.get("type") == "DELETED"
    if deleted:
        caches.cronjobs.delete(body)
    else:
        caches.cronjobs.store(body)
    key = gcj_key(body)  # the CronJob has the GuardedCronJob's name
    parent = lookup(caches.guarded_cronjobs, key)
    if parent is not None and deleted:
        # The garbage collector deletes the CronJob once its owner is gone, and the two
        # watches may deliver that in either order: ask the API server, not the cache.
        parent = await _get_or_none(context.client, key, GUARDED_CRONJOBS)
    if parent is None or (parent.get("metadata") or {}).get("deletionTimestamp"):
        return
    uid = uid_of(parent)
    if not deleted and not controlled_by(body, uid):
        return  # not this GuardedCronJob's CronJob; its own pass reports the clash
    if not _listed_and_seen(event.get("type"), uid, context, (caches.cronjobs,), key):
        queue.add(key)


def refresh_run_status(event: Mapping[str, Any], cache: ObjectCache, *, context: OperatorContext,
                       caches: Caches, queue: PassQueue) -> None:
    """A Job or Pod of a GuardedCronJob changed (event type None: it was listed): queue a
    pass to recompute the run status. Only with the GuardedCronJob's own CronJob cached:
    a missing or foreign CronJob is the GuardedCronJob's and the CronJob watch's business."""
    body = event["object"]
    event_type = event.get("type")
    if event_type == "DELETED":
        cache.delete(body)
    else:
        cache.store(body)
    key = owner_key(body)
    if key is None:
        return
    parent = lookup(caches.guarded_cronjobs, key)
    cronjob = lookup(caches.cronjobs, key)
    if parent is None or cronjob is None or (parent.get("metadata") or {}).get("deletionTimestamp"):
        return
    uid = uid_of(parent)
    if controlled_by(cronjob, uid) and not _listed_and_seen(event_type, uid, context,
                                                            (caches.jobs, caches.pods), key):
        queue.add(key)


def _listed_and_seen(event_type: str | None, uid: str, context: OperatorContext,
                     cached: tuple[Cached, ...], key: Key) -> bool:
    """A child (CronJob, Job, Pod) from a watch's listing (kopf marks listed objects with
    no event type) that a pass of its GuardedCronJob reads, or has read, from the cache:
    a pass for the child would only repeat it. At start-up every GuardedCronJob gets its
    own pass (kopf's resume or create), so a restart over N GuardedCronJobs makes N
    passes, not one more per listed CronJob, Job and Pod. A later listing (a watch that
    had to start over) stores children anew, after the last pass: those still get
    theirs, so a child changed in the gap is seen."""
    if event_type is not None:
        return False
    started = context.memory.last_pass_started(uid)
    if started is None:
        return True  # its first pass is still to come, and will read the cache
    # Any child stored under the key after the pass started (this one, re-listed): pass.
    stored = [at for one in cached if (at := newest_stored_at(one, key)) is not None]
    return bool(stored) and max(stored) <= started


def forget_deleted(body: Body, *, context: OperatorContext, handled: HandledEssences) -> None:
    """Drop what the operator keeps about a deleted GuardedCronJob (lock, last status,
    metric series, the essence kopf last handled)."""
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
    # kopf's worker for an object keeps its last event until it ends, IDLE_SECONDS after it:
    # the event is in the caches by then, and at start every listed object has one.
    settings.queueing.idle_timeout = IDLE_SECONDS


async def _get_or_none(client: KubeClient, key: Key, resource: Resource = CRONJOBS) -> Body | None:
    try:
        return trimmed(await client.get(resource, *key))
    except NotFound:
        return None
