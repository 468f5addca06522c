"""Catch-up, backfill, skipped wall times and suspension after failures, as one pass plans
them.

The rules are in status/ (catchup.py, backfill.py, skipped.py, suspension.py); here the
pass reads their inputs from the GuardedCronJob (annotations, status, creation time),
starts at most one Job for a past slot, and turns what changed into Events. A Job for a slot
is named `<cronjob>-<slot>`, so a second attempt (a pass retried after its status write
failed, a restart, the CronJob controller's own Job for that slot) gets AlreadyExists,
which counts as started; across clusters the guard's slot claim decides.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from logging import INFO
from typing import Any

from guardedcron import contract
from guardedcron.builders.manual import ManualRunError, build_slot_job
from guardedcron.objects import controlled_by, get_path, uid_of
from guardedcron.planner.actions import Action, Body, CreateJob, Log, Refused
from guardedcron.planner.once import Once
from guardedcron.spec import ParsedSpec
from guardedcron.status import EventReason, RunEvent, RunRecord, SchedulingStatus
from guardedcron.status import backfill as backfill_status
from guardedcron.status.catchup import heartbeat_warning, plan_catch_up
from guardedcron.status.skipped import POLICY as SKIPPED_TIME_POLICY
from guardedcron.status.skipped import by_skipped_key, plan_skipped_times
from guardedcron.status.suspension import SuspensionDecision, decide_suspension
from guardedcron.status.times import epoch_minute, format_time, parse_time

# How often a GuardedCronJob with catch-up, a backfill or skipped times to run gets a pass of its own (kopf
# timer), besides those its objects' events start: the longest a missed slot or a due
# retry waits for a pass (docs/design.md, "Bounded waits").
TIMER_SECONDS = 60.0

_NOTE_REASONS: Mapping[str, EventReason] = {
    "BackfillStarted": EventReason.BACKFILL_STARTED,
    "BackfillCompleted": EventReason.BACKFILL_COMPLETED,
    "BackfillStopped": EventReason.BACKFILL_STOPPED,
    "BackfillRefused": EventReason.BACKFILL_REFUSED,
    "SuspendedAfterFailures": EventReason.SUSPENDED_AFTER_FAILURES,
    "ResumedAfterFailures": EventReason.RESUMED_AFTER_FAILURES,
}


@dataclass(frozen=True)
class SlotsResult:
    status: SchedulingStatus
    events: list[RunEvent] = field(default_factory=list)
    started: str | None = None  # the run kind of the Job this pass started, if any


def wants_timer(*, spec: Mapping[str, Any], annotations: Mapping[str, str], **_: Any) -> bool:
    """kopf's `when` filter of the timer: catch-up on, skipped wall times run, or a
    backfill asked for (a jump ahead of the clock makes no Kubernetes event either)."""
    catch_up = spec.get("catchUp")
    policy = catch_up.get("policy") if isinstance(catch_up, Mapping) else None
    dst = spec.get("dstPolicy")
    skipped = dst.get("skippedTime") if isinstance(dst, Mapping) else None
    return (policy in ("Latest", "All") or skipped == SKIPPED_TIME_POLICY
            or bool(annotations.get(contract.ANNOTATION_BACKFILL)))


def annotation(gcj: Body, key: str) -> str | None:
    value = ((gcj.get("metadata") or {}).get("annotations") or {}).get(key)
    return value if isinstance(value, str) and value.strip() else None


def suspension_for(gcj: Body, parsed: ParsedSpec, runs: Sequence[RunRecord],
                   previous: Mapping[str, Any], now: datetime) -> SuspensionDecision:
    """Whether this pass keeps (or puts) the CronJob suspended after failures."""
    generation = get_path(gcj, "metadata", "generation")
    return decide_suspension(
        parsed.spec.suspend_after_failures, runs_newest_first=runs,
        previous=previous.get("failures") if isinstance(previous.get("failures"), Mapping) else None,
        generation=generation if isinstance(generation, int) else 0,
        resume_token=annotation(gcj, contract.ANNOTATION_RESUME), now=now)


def plan_slots(gcj: Body, parsed: ParsedSpec, cronjob: Body | None, *,
               runs: Sequence[RunRecord], previous: Mapping[str, Any],
               suspension: SuspensionDecision, now: datetime,
               once: Once) -> Generator[Action, Any, SlotsResult]:
    """Plan catch-up and skipped wall times and advance the backfill; start at most one
    Job (catch-up first, then skipped times: a recent slot matters more than an old range)."""
    runs = by_skipped_key(runs)
    suspended = parsed.spec.suspend or suspension.suspended
    # One run at a time: the lease allows no more, and a Job started beside a running one
    # would only be skipped (and its slot lost to it).
    busy = any(not run.final for run in runs)
    created = parse_time(get_path(gcj, "metadata", "creationTimestamp"))
    usable = cronjob is not None and controlled_by(cronjob, uid_of(gcj))
    events: list[RunEvent] = []
    if suspension.note is not None:
        reason, message = suspension.note
        events.append(RunEvent(_NOTE_REASONS[reason], message, subject=message))
    warning = heartbeat_warning(parsed)
    generation = get_path(gcj, "metadata", "generation")
    if warning is not None and (yield from once.first_time(f"catch-up-heartbeat\n{generation}")):
        events.append(RunEvent(EventReason.CATCH_UP_WITHOUT_HEARTBEAT, warning, subject=warning))

    previous_catch_up = previous.get("catchUp") if isinstance(previous.get("catchUp"), Mapping) else None
    plan = plan_catch_up(parsed, runs=runs, created_at=created, last_schedule_time=parse_time(
        get_path(cronjob, "status", "lastScheduleTime")), previous=previous_catch_up,
        busy=busy or not usable, suspended=suspended, now=now) if created is not None else None
    catch_up = plan.to_status(previous_catch_up) if plan is not None else None
    started: str | None = None
    if plan is not None and plan.start is not None and cronjob is not None:
        attempt = yield from _start_slot_job(cronjob, _Slot.past(plan.start), contract.RUN_KIND_CATCH_UP,
                                             plan.attempt, once)
        events += attempt.events
        if attempt.made:
            started, busy = contract.RUN_KIND_CATCH_UP, True

    previous_skipped = previous.get("skippedTime")
    previous_skipped = previous_skipped if isinstance(previous_skipped, Mapping) else None
    skipped = plan_skipped_times(parsed, runs=runs, created_at=created, previous=previous_skipped,
                                 busy=busy or not usable, suspended=suspended,
                                 now=now) if created is not None else None
    if skipped is not None and skipped.start is not None and cronjob is not None:
        wall = skipped.start.wall.isoformat(sep=" ", timespec="minutes")
        attempt = yield from _start_slot_job(
            cronjob, _Slot(skipped.start.slot, skipped.start.due,
                           f"{wall}, a wall time the clock of {parsed.spec.time_zone} skipped"),
            contract.RUN_KIND_SKIPPED_TIME, skipped.attempt, once)
        events += attempt.events
        if attempt.made:
            started, busy = contract.RUN_KIND_SKIPPED_TIME, True

    step = backfill_status.advance_backfill(
        parsed, annotation=annotation(gcj, contract.ANNOTATION_BACKFILL),
        previous=previous.get("backfill") if isinstance(previous.get("backfill"), Mapping) else None,
        runs=runs, busy=busy or not usable, suspended=suspended, now=now)
    backfill = step.status
    events += [RunEvent(_NOTE_REASONS[reason], message, subject=message) for reason, message in step.notes]
    if step.start is not None and backfill is not None and cronjob is not None:
        attempt = yield from _start_slot_job(cronjob, _Slot.past(step.start), contract.RUN_KIND_BACKFILL,
                                             step.attempt, once)
        events += attempt.events
        if attempt.given_up is not None:  # asking again would be refused again
            stop = backfill_status.stopped(backfill, attempt.given_up)
            backfill = stop.status
            events += [RunEvent(_NOTE_REASONS[r], m, subject=m) for r, m in stop.notes]
        elif attempt.made:
            started = contract.RUN_KIND_BACKFILL
            backfill = backfill_status.started(backfill, contract.attempt_job_name(
                str(get_path(cronjob, "metadata", "name")), epoch_minute(step.start),
                contract.RUN_KIND_BACKFILL, step.attempt))
    status = SchedulingStatus(
        catch_up=catch_up, backfill=backfill, failures=suspension.status,
        skipped_time=skipped.to_status() if skipped is not None else None,
        suspended_for_failures=suspension.suspended, failed_runs=suspension.failed_runs)
    return SlotsResult(status=status, events=events, started=started)


@dataclass(frozen=True)
class _Slot:
    """What a Job the operator starts runs: the slot its guard claims, the minute it was
    due (its scheduled-time annotation) and how messages name it."""

    slot: int
    due: datetime
    shown: str

    @classmethod
    def past(cls, slot_time: datetime) -> _Slot:
        return cls(epoch_minute(slot_time), slot_time, f"the slot at {format_time(slot_time)}")


_WHAT: Mapping[str, str] = {contract.RUN_KIND_CATCH_UP: "make-up run",
                            contract.RUN_KIND_BACKFILL: "backfill run",
                            contract.RUN_KIND_SKIPPED_TIME: "skipped-time run"}
_CREATED: Mapping[str, EventReason] = {
    contract.RUN_KIND_CATCH_UP: EventReason.MAKE_UP_RUN_CREATED,
    contract.RUN_KIND_BACKFILL: EventReason.BACKFILL_RUN_CREATED,
    contract.RUN_KIND_SKIPPED_TIME: EventReason.SKIPPED_TIME_RUN_CREATED,
}


@dataclass(frozen=True)
class _Attempt:
    made: bool  # the Job exists (created now, or by an earlier pass)
    events: list[RunEvent] = field(default_factory=list)
    given_up: str | None = None  # why asking again cannot succeed (the CronJob, a 400/422)


def _start_slot_job(cronjob: Body, target: _Slot, kind: str, attempt: int,
                    once: Once) -> Generator[Action, Any, _Attempt]:
    """Create the Job for one attempt at a past slot or a skipped wall time. AlreadyExists
    (the same attempt, from a pass whose status write was lost) counts as made."""
    slot = target.slot
    namespace = str(get_path(cronjob, "metadata", "namespace") or "")
    cronjob_name = str(get_path(cronjob, "metadata", "name") or "")
    name = contract.attempt_job_name(cronjob_name, slot, kind, attempt)
    what = _WHAT[kind]

    def failed(why: str, *, permanent: bool) -> Generator[Action, Any, _Attempt]:
        message = f"no {what} for {target.shown}: {why}"
        given_up = message if permanent else None
        # Once per Job name in this process: every Job event starts a pass.
        if not (yield from once.first_time(f"{kind}\n{name}")):
            return _Attempt(made=False, given_up=given_up)
        yield Log(INFO, message)
        return _Attempt(made=False, given_up=given_up,
                        events=[RunEvent(EventReason.MAKE_UP_RUN_FAILED, message, subject=name)])

    try:
        job = build_slot_job(cronjob, slot=slot, scheduled_at=format_time(target.due), run_kind=kind,
                             attempt=attempt)
    except ManualRunError as error:
        return (yield from failed(f"CronJob {cronjob_name} cannot give a guarded run: {error}",
                                  permanent=True))
    result = yield CreateJob(namespace, job)
    if isinstance(result, Refused):
        if result.code is None:
            raise result.error  # no answer: the pass runs again
        if result.code == 409:
            yield Log(INFO, f"Job {name} for {target.shown} already exists.")
            return _Attempt(made=True)
        if result.namespace_terminating:
            return _Attempt(made=False)
        return (yield from failed(f"the API server refused Job {name}: {result.error}",
                                  permanent=result.permanent))
    yield Log(INFO, f"Created Job {name}, a {what} for {target.shown}.")
    return _Attempt(made=True, events=[RunEvent(
        _CREATED[kind], f"{what} {name} created for {target.shown}", subject=name)])
