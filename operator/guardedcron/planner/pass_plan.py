"""One pass over one GuardedCronJob, as a plan: every decision, no I/O.

`plan_pass(view)` is a generator. It yields each action the pass takes, in order, and
receives its result (planner/actions.py); the executor (handlers/reconcile.py) does
nothing but perform them. What the pass does, in that order: parse the spec; delete a
CronJob whose lock the namespace may not use; read Jobs that status has open and the
cache lacks; apply the desired CronJob only when the live one differs in what
guardedcron sets; start a manual run for a trigger token, then at most one Job for a
past slot (catch-up, skipped wall time, backfill); compute the whole status once and
write it only when it changed; count metrics; record finished runs' outcomes; stop the
pods of lost runs; remove skipped runs' Jobs; post the Events. Every pass, from any
trigger, is this plan, so a resync over up-to-date objects writes nothing.

A test drives the generator with the results it chooses (tests/unit/test_planner.py):
every decision is a table test.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import replace
from logging import DEBUG, INFO, WARNING
from typing import Any

from guardedcron import contract
from guardedcron.builders import build_cronjob
from guardedcron.objects import controlled_by, get_path, uid_of
from guardedcron.planner.actions import (
    Action,
    ApplyCronJob,
    Body,
    CountMakeUpRun,
    FetchedRuns,
    FetchRuns,
    Log,
    Observed,
    PassResult,
    PassView,
    PatchStatus,
    PostEvents,
    RecordChanges,
    RecordOutcomes,
    RecordSuspension,
    Refused,
)
from guardedcron.planner.cleanup import remove_skipped_jobs, stop_lost_workloads
from guardedcron.planner.locks import delete_if_lock_forbidden, lock_change_event, lock_refusal, refusal_event
from guardedcron.planner.once import Once
from guardedcron.planner.slots import plan_slots, suspension_for
from guardedcron.planner.ssa import apply_needed
from guardedcron.planner.trigger import plan_trigger
from guardedcron.spec import ParsedSpec, Problem, SpecError, parse_guarded_cronjob
from guardedcron.status import EventReason, RunEvent, RunRecord, SchedulingStatus, compute_status, merge_runs
from guardedcron.status.history import known_records, newest_first
from guardedcron.status.suspension import SuspensionDecision

Plan = Generator[Action, Any, PassResult]


def plan_pass(view: PassView) -> Plan:
    """The pass for `view`: at most one apply, a manual Job if the trigger annotation
    asks for one, at most one Job for a past slot, at most one status patch, then the
    Events for the run transitions that status records; then, for `onLost:
    StopWorkload`, the deletion of pods whose lease was lost (if the settings allow the
    operator to); the removal of skipped runs' Jobs that status records; with outcome
    recording on, the outcomes of runs that just finished go to the database."""
    settings, now, once = view.settings, view.now, Once(view.done)
    observed = view.observed
    gcj = observed.gcj
    namespace = str(get_path(gcj, "metadata", "namespace") or "")
    name = str(get_path(gcj, "metadata", "name") or "")
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
            lock_events += yield from refusal_event(refused, once)

    cronjob = observed.cronjob
    # A valid spec's lock is always the namespace's to use, and the apply below puts it in.
    if parsed is None and cronjob is not None and controlled_by(cronjob, uid):
        deleted, events = yield from delete_if_lock_forbidden(cronjob, namespace=namespace,
                                                              settings=settings)
        lock_events += events
        if deleted:
            cronjob = None
    applied = not_owned = False
    apply_error: str | None = None
    previous = view.written_status or gcj.get("status") or {}
    # The runs as the previous status and the live Jobs tell them: whether failures
    # suspend the CronJob is decided before it is applied (compute_status reads them again).
    remembered = known_records(previous)
    observed = yield from with_runs_the_cache_lacks(observed, remembered)
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
            result = yield ApplyCronJob(desired, reason)
            if isinstance(result, Refused):
                if result.namespace_terminating:
                    yield Log(DEBUG, f"Not applying CronJob {name}: its namespace is being deleted.")
                    return PassResult(applied=False, status_written=False, apply_error=None)
                if not result.permanent:
                    raise result.error  # the pass runs again later
                apply_error = result.message
                trouble = _trouble(gcj, EventReason.CRONJOB_REJECTED,
                                   f"The API server refused CronJob {name}: {result.error}")
            else:
                cronjob, applied = result.body, True
                yield Log(INFO, f"Applied CronJob {name}: {reason}.")

    trigger = yield from plan_trigger(gcj, None if not_owned else cronjob, previous, once)
    scheduling: SchedulingStatus | None = None  # None: an invalid spec keeps what status says
    slot_events: list[RunEvent] = []
    if parsed is not None:
        slots = yield from plan_slots(gcj, parsed, None if not_owned else cronjob, runs=runs,
                                      previous=previous, suspension=suspension, now=now, once=once)
        scheduling, slot_events = slots.status, slots.events
        if slots.started is not None:
            yield CountMakeUpRun(namespace, name, slots.started)
        yield RecordSuspension(namespace, name, None if parsed.spec.suspend_after_failures is None
                               else suspension.suspended)
    change = compute_status(
        gcj=gcj, parsed=parsed, spec_problems=problems, cronjob=cronjob, jobs=observed.jobs,
        pods_by_job=observed.pods_by_job, previous_status=previous, now=now,
        apply_error=apply_error, handled_trigger=trigger.handled, scheduling=scheduling,
        remembered=remembered, no_success_slots=settings.no_success_slots)
    if trouble is not None:
        # Once per change, not once per pass: a resync over an object that is still
        # invalid must write nothing (its Event goes with the status write, below).
        yield Log(WARNING if change.changed else DEBUG, trouble.message)
    if change.changed:
        yield PatchStatus(namespace, name, change.patch(), change.status)
    # After the write: a pass whose write failed counts nothing (it runs again, and the
    # retry sees the same transitions). An unchanged status has none, only gauges.
    yield RecordChanges(namespace, name, change.metrics)
    said = [trouble] if trouble is not None and change.changed else []
    events = [*lock_events, *said, *change.events, *trigger.events, *slot_events]
    if settings.outcome_recording and parsed is not None and change.outcomes:
        # Once per run: when its record turns final, which happens in one written status.
        events += yield RecordOutcomes(namespace, parsed, change.outcomes)
    # After the status write, so a stopped pod's run already shows as Lost; on every
    # pass, not only changed ones, since a pod to stop may outlive the write.
    events += yield from stop_lost_workloads(change.stop, namespace=namespace, once=once,
                                             allowed=settings.stop_workload)
    # After the status write too: a skip's Job goes only once status keeps its record.
    events += yield from remove_skipped_jobs(change.remove, namespace=namespace, once=once)
    if events:
        yield PostEvents(tuple(events))
    return PassResult(applied=applied, status_written=change.changed, apply_error=apply_error,
                      not_owned=not_owned)


def _trouble(gcj: Body, reason: EventReason, message: str) -> RunEvent:
    """The Event for what a pass cannot do; one per generation and message (a fix that
    is undone again is a new generation, so it is said again)."""
    generation = get_path(gcj, "metadata", "generation")
    return RunEvent(reason, message, subject=f"{generation}\n{message}")


def with_runs_the_cache_lacks(observed: Observed, remembered: Mapping[str, RunRecord],
                              ) -> Generator[Action, Any, Observed]:
    """`observed`, plus the Jobs (and their pods) of runs status still has open that the
    cache does not hold, read from the API server. A run is closed as deleted only when
    its Job is gone, and a cache can lag: a standby operator that resumes re-lists each
    resource on its own, so a GuardedCronJob can come back before its Jobs do."""
    cached = {get_path(job, "metadata", "name") for job in observed.jobs}
    missing = tuple(name for name, run in remembered.items() if not run.final and name not in cached)
    if not missing:
        return observed
    gcj = observed.gcj
    fetched: FetchedRuns = yield FetchRuns(str(get_path(gcj, "metadata", "namespace") or ""),
                                           str(get_path(gcj, "metadata", "name") or ""), missing)
    return replace(observed, jobs=[*observed.jobs, *fetched.jobs],
                   pods_by_job={**observed.pods_by_job, **fetched.pods_by_job})
