"""The whole desired status of one GuardedCronJob, from what the operator sees (pure).

compute_status takes every input explicitly (the clock too) and returns the status the
operator should write, with what follows from writing it (status/change.py). It reads
the runs of each status once. Recomputing with nothing changed returns an equal dict,
so an idle resync writes nothing: no field here moves with the clock alone
(nextScheduleTime moves once per fire time, when the schedule does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from guardedcron import contract
from guardedcron.objects import controlled_by, get_path, uid_of
from guardedcron.spec import DEFAULT_NO_SUCCESS_SLOTS, ParsedSpec
from guardedcron.status import conditions as cond
from guardedcron.status.change import StatusChange, conditions_of, what_follows
from guardedcron.status.history import add_counts, finished_runs, known_records, newest_first
from guardedcron.status.missed import find_missed_run
from guardedcron.status.overlap import find_overlaps
from guardedcron.status.runs import STILL_RUNNING, Outcome, RunRecord, bounded_reason, classify_run
from guardedcron.status.times import format_time, parse_time

DEFAULT_RECENT_RUNS_LIMIT: Final = 10  # the CRD's default, used while the spec is invalid
DEGRADED_AFTER_GUARD_ERRORS: Final = 3
# (type, status, reason, message) of one condition
_Condition = tuple[str, cond.ConditionStatus, str, str]


@dataclass(frozen=True)
class SchedulingStatus:
    """What the pass decided about catch-up, backfill, skipped wall times and suspension
    after failures (status/catchup.py, backfill.py, skipped.py, suspension.py), for status
    to show."""

    catch_up: Mapping[str, Any] | None = None  # status.catchUp
    backfill: Mapping[str, Any] | None = None  # status.backfill
    failures: Mapping[str, Any] | None = None  # status.failures
    skipped_time: Mapping[str, Any] | None = None  # status.skippedTime
    suspended_for_failures: bool = False
    failed_runs: tuple[str, ...] = ()


def scheduling_of(previous: Mapping[str, Any]) -> SchedulingStatus:
    """The previous pass's decisions, kept as they are (while the spec is invalid)."""
    def item(key: str) -> Mapping[str, Any] | None:
        value = previous.get(key)
        return value if isinstance(value, Mapping) else None
    failures = item("failures") or {}
    return SchedulingStatus(
        catch_up=item("catchUp"), backfill=item("backfill"), failures=item("failures"),
        skipped_time=item("skippedTime"), suspended_for_failures=failures.get("suspended") is True,
        failed_runs=tuple(j for j in failures.get("failedRuns") or () if isinstance(j, str)))


def compute_status(
    *,
    gcj: Mapping[str, Any],
    parsed: ParsedSpec | None,
    spec_problems: Iterable[tuple[str, str]] = (),
    cronjob: Mapping[str, Any] | None,
    jobs: Sequence[Mapping[str, Any]],
    pods_by_job: Mapping[str, Sequence[Mapping[str, Any]]],
    previous_status: Mapping[str, Any] | None,
    now: datetime,
    apply_error: str | None = None,
    handled_trigger: str | None = None,
    scheduling: SchedulingStatus | None = None,
    remembered: Mapping[str, RunRecord] | None = None,
    no_success_slots: int = DEFAULT_NO_SUCCESS_SLOTS,
) -> StatusChange:
    """The status to write over `previous_status`, and what follows from writing it.

    - `parsed`: the checked spec, or None when `spec_problems` lists why it is invalid.
    - `cronjob`: the live CronJob, or None when it does not exist.
    - `jobs`: every Job of this GuardedCronJob that exists now (a complete list: a run
      remembered as running whose Job is missing is closed as Failed, outcome unknown).
    - `pods_by_job`: the pods of each Job, by Job name.
    - `apply_error`: why the CronJob cannot be applied (the API server's refusal, or a
      CronJob of that name that this GuardedCronJob does not control), else None.
    - `handled_trigger`: the `guardedcron.io/trigger` token this pass made a manual run
      for; else the previous `lastTriggerToken` is kept.
    - `scheduling`: catch-up, backfill and suspension after failures as this pass decided
      them; None keeps the previous status's.
    - `remembered`: `known_records(previous_status)` when the caller has read them already
      (each record is parsed once per pass).
    - `no_success_slots`: the operator's setting for the success-overdue deadline.
    """
    previous = previous_status or {}
    scheduling = scheduling if scheduling is not None else scheduling_of(previous)
    paused = scheduling.suspended_for_failures
    generation = _generation(gcj, parsed)
    problems = [f"{path}: {message}" for path, message in spec_problems]
    limit = parsed.spec.recent_runs_limit if parsed is not None else _previous_limit(previous)

    before = remembered if remembered is not None else known_records(previous)
    runs = newest_first(merge_runs(before, jobs, pods_by_job, now))
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "recentRuns": [run.to_status() for run in runs[:limit]],
    }
    if runs:
        status["lastRun"] = runs[0].to_status()
    # The runs as written (whole-second times): what the next pass reads back, so a
    # transition seen now is the one the next pass will not see again.
    after = known_records(status)
    finished = finished_runs(before, after)
    status["runCounts"] = add_counts(previous.get("runCounts"), finished)
    token = handled_trigger if handled_trigger is not None else previous.get("lastTriggerToken")
    if isinstance(token, str) and token:
        status["lastTriggerToken"] = token
    if cronjob is not None:
        status["cronJobRef"] = {"name": str(get_path(cronjob, "metadata", "name") or "")}
    for key, value in (("catchUp", scheduling.catch_up), ("backfill", scheduling.backfill),
                       ("failures", scheduling.failures), ("skippedTime", scheduling.skipped_time)):
        if value:
            status[key] = dict(value)
    if parsed is not None and parsed.spec.schedule_text != parsed.spec.written_schedule:
        status["resolvedSchedule"] = parsed.spec.schedule_text  # spec.schedule's H resolved
    if parsed is not None and not parsed.spec.suspend and not paused:
        upcoming = parsed.spec.schedule.next_after(now, parsed.spec.zone)
        if upcoming is not None:
            status["nextScheduleTime"] = format_time(upcoming)
    _put_latest(status, "lastScheduleTime", [
        parse_time(previous.get("lastScheduleTime")),
        parse_time(get_path(cronjob, "status", "lastScheduleTime")),
        *(run.scheduled_at for run in runs),
    ])
    _put_latest(status, "lastSuccessfulTime", [
        parse_time(previous.get("lastSuccessfulTime")),
        *(run.finished_at for run in runs if run.outcome is Outcome.SUCCEEDED),
    ])

    conditions: list[dict[str, Any]] = [dict(c) for c in conditions_of(previous)]

    def put(kind: str, state: cond.ConditionStatus, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = cond.set_condition(conditions, type=kind, status=state, reason=reason,
                                        message=message, observed_generation=generation, now=now)

    put(*_invalid(problems))
    put(*_stalled(apply_error, parsed))
    put(*_ready(gcj, parsed, cronjob, apply_error, paused=paused))
    put(*_missed(gcj, parsed, cronjob, runs, status, now, paused=paused))
    put(*_overlap(runs))
    put(*_degraded(runs))
    if parsed is not None and parsed.spec.suspend_after_failures is not None:
        put(*_suspended(parsed, scheduling))
    elif parsed is not None:  # the field was removed: so is its condition
        conditions = [c for c in conditions if c.get("type") != cond.SUSPENDED]
    status["conditions"] = conditions
    return what_follows(previous=previous, before=before, status=status, after=after,
                        finished=finished, parsed=parsed, jobs=jobs, pods_by_job=pods_by_job, now=now,
                        created_at=_created_at(gcj, cronjob), no_success_slots=no_success_slots)


def merge_runs(remembered: Mapping[str, RunRecord], jobs: Sequence[Mapping[str, Any]],
               pods_by_job: Mapping[str, Sequence[Mapping[str, Any]]], now: datetime) -> list[RunRecord]:
    """Remembered runs (the previous status's, by Job name) and live Jobs, one record
    per Job name.

    A final remembered record wins over the live Job (its fields never change again);
    an open one is replaced by the Job's classification, or closed if the Job is gone.
    """
    merged: dict[str, RunRecord] = {}
    for job in jobs:
        name = get_path(job, "metadata", "name")
        if not isinstance(name, str) or not name:
            continue
        old = remembered.get(name)
        if old is not None and old.final:
            merged[name] = old
            continue
        live = classify_run(job, pods_by_job.get(name, ()))
        merged[name] = live if old is None else keep_known(old, live)
    for name, old in remembered.items():
        if name in merged:
            continue
        if old.final:
            merged[name] = old
        else:
            last_seen = f"{old.outcome}: {old.reason}"
            merged[name] = replace(
                old, outcome=Outcome.FAILED, finished_at=now,
                reason=f"Job deleted before it finished (last seen {last_seen}); outcome unknown",
            )
    return list(merged.values())


def keep_known(old: RunRecord, live: RunRecord) -> RunRecord:
    """The live classification, with what an earlier pass read from the pod where the live
    one has nothing: a pod deleted at the deadline or by the garbage collector takes its
    termination messages along, but the run's holder, fence and start stay what they
    were (one pod per run, so they cannot have changed), and so does a lost lease."""
    if old.outcome is Outcome.LOST and live.outcome is not Outcome.LOST:
        # The keeper's report went with its pod (deleted for onLost: StopWorkload, or at
        # the deadline); the loss it reported stands, and the Job's end is added to it.
        lost = old.reason.removesuffix(STILL_RUNNING)
        live = replace(live, outcome=Outcome.LOST, reason=bounded_reason(
            f"{lost}; then {live.outcome}: {live.reason}" if live.final else old.reason))
    return replace(
        live,
        holder=live.holder if live.holder is not None else old.holder,
        fence=live.fence if live.fence is not None else old.fence,
        slot=live.slot if live.slot is not None else old.slot,
        # The guard's end (when the workload could begin) over the Job's start, which is
        # all a live record without the pod has.
        started_at=old.started_at if (live.fence is None and old.fence is not None
                                      and old.started_at is not None)
        else live.started_at if live.started_at is not None else old.started_at,
    )


# --- conditions -------------------------------------------------------------------

def _invalid(problems: list[str]) -> _Condition:
    if problems:
        return cond.INVALID, "True", "SpecInvalid", "; ".join(problems)
    return cond.INVALID, "False", "SpecValid", "the spec is valid"


def _stalled(apply_error: str | None, parsed: ParsedSpec | None) -> _Condition:
    if apply_error:
        return cond.STALLED, "True", "CronJobRejected", f"the CronJob cannot be applied: {apply_error}"
    if parsed is None:
        return cond.STALLED, "False", "NotApplied", "nothing applied while the spec is invalid"
    return cond.STALLED, "False", "Applied", "the API server accepted the CronJob"


def _ready(gcj: Mapping[str, Any], parsed: ParsedSpec | None, cronjob: Mapping[str, Any] | None,
           apply_error: str | None, *, paused: bool = False) -> _Condition:
    if parsed is None:
        return cond.READY, "False", "SpecInvalid", "the spec is invalid: see the Invalid condition"
    if apply_error:
        return cond.READY, "False", "CronJobRejected", "the CronJob could not be applied: see Stalled"
    if cronjob is None:
        return cond.READY, "False", "CronJobMissing", f"CronJob {parsed.name} does not exist yet"
    mismatch = cronjob_mismatch(parsed, cronjob, uid=uid_of(gcj), suspended_for_failures=paused)
    if mismatch is not None:
        return cond.READY, "False", "CronJobOutOfDate", f"CronJob {parsed.name} differs: {mismatch}"
    return cond.READY, "True", "CronJobReady", f"CronJob {parsed.name} is in place and guarded"


def cronjob_mismatch(parsed: ParsedSpec, cronjob: Mapping[str, Any], *, uid: object = None,
                     suspended_for_failures: bool = False) -> str | None:
    """The first field where the live CronJob differs from what the spec makes, if any.

    Only fields guardedcron sets and the server does not default are compared; the
    server fills in many others, which a full comparison would always see as changed.
    """
    spec = parsed.spec
    live = get_path(cronjob, "spec") or {}
    expected: list[tuple[str, object, object]] = [
        ("spec.schedule", spec.schedule_text, live.get("schedule")),
        ("spec.timeZone", spec.time_zone, live.get("timeZone")),
        ("spec.suspend", spec.suspend or suspended_for_failures, bool(live.get("suspend", False))),
        ("spec.concurrencyPolicy", "Forbid", live.get("concurrencyPolicy")),
        ("spec.startingDeadlineSeconds", spec.starting_deadline_seconds, live.get("startingDeadlineSeconds")),
        (f"metadata.annotations[{contract.ANNOTATION_LOCK}]", spec.lease.name,
         (get_path(cronjob, "metadata", "annotations") or {}).get(contract.ANNOTATION_LOCK)),
    ]
    for path, want, have in expected:
        if want != have:
            return f"{path} is {have!r}, expected {want!r}"
    init = get_path(live, "jobTemplate", "spec", "template", "spec", "initContainers")
    if not isinstance(init, list) or not init or not isinstance(init[0], Mapping) \
            or init[0].get("name") != contract.GUARD_CONTAINER:
        return f"the first init container is not {contract.GUARD_CONTAINER}"
    if isinstance(uid, str) and uid and not controlled_by(cronjob, uid):
        return "it is not controlled by this GuardedCronJob (ownerReferences)"
    return None


def _missed(gcj: Mapping[str, Any], parsed: ParsedSpec | None, cronjob: Mapping[str, Any] | None,
            runs: list[RunRecord], status: Mapping[str, Any],
            now: datetime, *, paused: bool = False) -> _Condition:
    if parsed is None:
        return cond.MISSED_RUN, "Unknown", "SpecInvalid", "no schedule to check while the spec is invalid"
    if parsed.spec.suspend or paused:
        return cond.MISSED_RUN, "False", "Suspended", "suspended: no runs are expected"
    created = _created_at(gcj, cronjob)
    if created is None:
        return cond.MISSED_RUN, "Unknown", "CreationTimeUnknown", "no creationTimestamp to count slots from"
    missed = find_missed_run(
        parsed, jobs=runs,
        last_schedule_time=parse_time(get_path(cronjob, "status", "lastScheduleTime")),
        created_at=created, now=now,
    )
    if missed is None:
        return cond.MISSED_RUN, "False", "NoMissedRun", "the latest due slot has a run"
    if missed.turned_away is not None:
        return (cond.MISSED_RUN, "True", "LeaseHeld",
                f"the run for the slot at {format_time(missed.scheduled_at)} (Job {missed.job_name}) "
                f"was skipped and no run of that slot started anywhere: {missed.turned_away}")
    if missed.guard_error is not None:
        return (cond.MISSED_RUN, "True", "GuardError",
                f"the run for the slot at {format_time(missed.scheduled_at)} (Job {missed.job_name}) "
                f"never started its work: the guard could not decide ({missed.guard_error})")
    return (cond.MISSED_RUN, "True", "SlotMissed",
            f"no run for the slot at {format_time(missed.scheduled_at)} (Job {missed.job_name} was "
            f"never created); it was due by {format_time(missed.deadline)}")


def _created_at(gcj: Mapping[str, Any], cronjob: Mapping[str, Any] | None) -> datetime | None:
    """Where slots are counted from: the object's creation (else its CronJob's)."""
    return parse_time(get_path(gcj, "metadata", "creationTimestamp")) \
        or parse_time(get_path(cronjob, "metadata", "creationTimestamp"))


def _suspended(parsed: ParsedSpec, scheduling: SchedulingStatus) -> _Condition:
    limit = parsed.spec.suspend_after_failures
    if scheduling.suspended_for_failures:
        runs = ", ".join(scheduling.failed_runs) or "unknown"
        return (cond.SUSPENDED, "True", "RepeatedFailures",
                f"the CronJob is suspended after {limit} failed runs in a row ({runs}); set the "
                "annotation guardedcron.io/resume to a new value, or change the spec, to resume")
    return (cond.SUSPENDED, "False", "NotSuspended",
            f"runs go on; {limit} failed runs in a row would suspend the CronJob")


def _overlap(runs: list[RunRecord]) -> _Condition:
    overlaps = find_overlaps(runs)
    if not overlaps:
        return cond.OVERLAP, "False", "NoOverlap", "no two runs held the lock at once"
    return cond.OVERLAP, "True", "RunsOverlapped", "; ".join(o.describe() for o in overlaps)


def _degraded(runs: list[RunRecord]) -> _Condition:
    streak: list[RunRecord] = []
    for run in runs:
        if not run.final:
            continue
        if run.outcome is not Outcome.GUARD_ERROR:
            break
        streak.append(run)
    if len(streak) >= DEGRADED_AFTER_GUARD_ERRORS:
        return (cond.DEGRADED, "True", "RepeatedGuardErrors",
                f"the last {len(streak)} runs could not reach a decision; latest: {streak[0].reason}")
    return cond.DEGRADED, "False", "GuardHealthy", "the guard decided the latest runs"


# --- helpers ----------------------------------------------------------------------

def _generation(gcj: Mapping[str, Any], parsed: ParsedSpec | None) -> int:
    generation = get_path(gcj, "metadata", "generation")
    if isinstance(generation, int) and not isinstance(generation, bool):
        return generation
    if parsed is not None and parsed.generation is not None:
        return parsed.generation
    return 0


def _previous_limit(previous: Mapping[str, Any]) -> int:
    runs = previous.get("recentRuns")
    return max(len(runs), DEFAULT_RECENT_RUNS_LIMIT) if isinstance(runs, list) else DEFAULT_RECENT_RUNS_LIMIT


def _put_latest(status: dict[str, Any], key: str, candidates: Iterable[datetime | None]) -> None:
    known = [t for t in candidates if t is not None]
    if known:
        status[key] = format_time(max(known))
