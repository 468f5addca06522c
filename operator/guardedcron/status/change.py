"""What follows from one computed status, decided once (pure).

compute_status reads the runs of the previous status once and those of the new status
once (`known_records`); from the two readings this module decides everything a pass
does besides writing the status: which runs just finished, the Events to post, the
metric changes, the outcomes to record in the database, the pods that
`onLost: StopWorkload` stops and the skipped runs' Jobs to remove. The handlers act on a
`StatusChange` and observability counts and posts what it says; neither decides again.

Transitions (finished runs, Events, counter increments, outcomes) follow only from a
status that is written: a pass whose status equals the stored one changes nothing,
so a resync, from any trigger, counts and posts nothing. Gauges, stop orders and removals
follow from the status itself, on every pass, so they are right again after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from guardedcron.spec import DEFAULT_NO_SUCCESS_SLOTS, ParsedSpec
from guardedcron.status import conditions as cond
from guardedcron.status.deadlines import AlertDeadlines, alert_deadlines
from guardedcron.status.history import COUNT_KEYS
from guardedcron.status.lease_loss import STOP_WORKLOAD, StopOrder, workloads_to_stop
from guardedcron.status.outcomes import OutcomeRecord, outcomes_to_record
from guardedcron.status.runs import Outcome, RunRecord
from guardedcron.status.skips import SkippedJob, skipped_jobs_to_remove
from guardedcron.status.times import parse_time
from guardedcron.status.transitions import EventReason, RunEvent, run_events

# Every key compute_status owns; others under .status (if any) are left alone.
STATUS_KEYS: Final = (
    "observedGeneration", "conditions", "cronJobRef", "nextScheduleTime", "lastScheduleTime",
    "lastSuccessfulTime", "lastRun", "recentRuns", "runCounts", "lastTriggerToken",
    "catchUp", "backfill", "failures", "resolvedSchedule", "skippedTime",
)
# The conditions exported as guardedcron_condition: those that keep a spec from being put
# in place (a new GuardedCronJob then never runs; a changed one runs its last valid CronJob).
EXPORTED_CONDITIONS: Final = (cond.INVALID, cond.STALLED)
# status.runCounts keys of runs that ended without success (a skip is another run's slot).
_UNSUCCESSFUL: Final = tuple(COUNT_KEYS[o] for o in (Outcome.FAILED, Outcome.TIMED_OUT, Outcome.LOST,
                                                     Outcome.GUARD_ERROR))


@dataclass(frozen=True)
class FinishedRun:
    """A run that just finished, as the metrics count it."""

    outcome: Outcome
    # From the lease won (or the Job's start) to the end, never negative; None when a
    # time is unknown (the run is counted, its duration not observed).
    seconds: float | None


@dataclass(frozen=True)
class MetricChanges:
    """What the metrics of one GuardedCronJob become after a pass."""

    finished: tuple[FinishedRun, ...]  # runs_total and run_duration_seconds, once per run
    missed_runs: int  # MissedRun transitions
    overlaps: int  # Overlap transitions
    last_success: datetime | None  # None: the gauge keeps what it has
    # The schedule-aware alerts' gauges; None: no such series (spec invalid, suspended, or
    # no creation time to count slots from).
    deadlines: AlertDeadlines | None
    # (type, whether it is True) of each of EXPORTED_CONDITIONS.
    conditions: tuple[tuple[str, bool], ...] = ()
    # Runs that ended without success while none has succeeded (status.runCounts); None: no
    # series (a run has succeeded, or spec.suspend is set: no runs are expected).
    failed_before_first_success: int | None = None


@dataclass(frozen=True)
class StatusChange:
    """The status one pass computed, and everything that follows from it."""

    previous: Mapping[str, Any]  # the status it replaces (the one written last)
    status: dict[str, Any]  # the status to write
    runs: Mapping[str, RunRecord]  # the runs `status` remembers, by Job name
    changed: bool  # writing `status` would change what is stored
    # Transitions; all empty when `changed` is False.
    finished: tuple[RunRecord, ...]  # runs that became final in `status`, newest first
    events: tuple[RunEvent, ...]  # Events for its transitions, oldest run first
    metrics: MetricChanges
    outcomes: tuple[OutcomeRecord, ...]  # finished runs to record in the database, oldest first
    stop: tuple[StopOrder, ...]  # pods onLost: StopWorkload stops
    remove: tuple[SkippedJob, ...]  # Jobs of skipped runs `status` records (status/skips.py)

    def patch(self) -> dict[str, Any]:
        """The JSON merge patch for .status that writes `status` over `previous`."""
        return status_patch(self.previous, self.status)


def what_follows(*, previous: Mapping[str, Any], before: Mapping[str, RunRecord],
                 status: dict[str, Any], after: Mapping[str, RunRecord],
                 finished: Sequence[RunRecord], parsed: ParsedSpec | None,
                 jobs: Sequence[Mapping[str, Any]],
                 pods_by_job: Mapping[str, Sequence[Mapping[str, Any]]], now: datetime,
                 created_at: datetime | None = None, no_success_slots: int = DEFAULT_NO_SUCCESS_SLOTS,
                 ) -> StatusChange:
    """The change from `previous` (whose runs are `before`) to `status` (runs `after`),
    given the runs `finished_runs` found between them; `created_at` (the object's) and
    `no_success_slots` (the operator's setting) are for the alerts' deadlines."""
    changed = status_changed(previous, status)
    written = tuple(finished) if changed else ()
    events = (tuple(run_events(before, after, conditions_of(previous), conditions_of(status)))
              if changed else ())
    metrics = MetricChanges(
        finished=tuple(FinishedRun(run.outcome, _duration(run)) for run in written),
        missed_runs=sum(1 for event in events if event.reason is EventReason.MISSED_RUN),
        overlaps=sum(1 for event in events if event.reason is EventReason.OVERLAP),
        last_success=parse_time(status.get("lastSuccessfulTime")),
        deadlines=_deadlines(parsed, status, created_at, no_success_slots),
        conditions=tuple((kind, cond.is_true(conditions_of(status), kind)) for kind in EXPORTED_CONDITIONS),
        failed_before_first_success=_failed_before_first_success(parsed, status),
    )
    stopping = parsed is not None and parsed.spec.lease.on_lost == STOP_WORKLOAD
    return StatusChange(
        previous=previous, status=status, runs=after, changed=changed, finished=written,
        events=events, metrics=metrics, outcomes=tuple(outcomes_to_record(written)),
        stop=tuple(workloads_to_stop(after.values(), pods_by_job)) if stopping else (),
        remove=skipped_jobs_to_remove(after, jobs),
    )


def status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change what is stored in the keys compute_status owns."""
    return _owned(old) != _owned(new)


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch for .status turning `old` into `new`: keys gone from `new` are
    set to null, at any depth, so a merge cannot keep a stale field (e.g. lastRun.fence)."""
    return _merge_patch(_owned(old), _owned(new))


def conditions_of(status: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The readable conditions of a status (an edited one may hold anything)."""
    items = status.get("conditions") if status else None
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def _deadlines(parsed: ParsedSpec | None, status: Mapping[str, Any], created_at: datetime | None,
               no_success_slots: int) -> AlertDeadlines | None:
    """The alerts' deadlines, or None while no run is expected: a suspended spec, a CronJob
    suspended after failures, an invalid spec (no schedule), an unknown creation time."""
    failures = status.get("failures")
    paused = isinstance(failures, Mapping) and failures.get("suspended") is True
    if parsed is None or parsed.spec.suspend or paused or created_at is None:
        return None
    return alert_deadlines(parsed, last_scheduled=parse_time(status.get("lastScheduleTime")),
                           last_success=parse_time(status.get("lastSuccessfulTime")),
                           created_at=created_at, no_success_slots=no_success_slots)


def _failed_before_first_success(parsed: ParsedSpec | None, status: Mapping[str, Any]) -> int | None:
    """The unsuccessful runs of a GuardedCronJob none of whose runs succeeded (0 before the
    first run ends); None once one has, or while spec.suspend stops its runs."""
    if status.get("lastSuccessfulTime") or (parsed is not None and parsed.spec.suspend):
        return None
    counts: Mapping[str, int] = status.get("runCounts") or {}  # compute_status's add_counts
    return sum(counts.get(key, 0) for key in _UNSUCCESSFUL)


def _duration(run: RunRecord) -> float | None:
    if run.started_at is None or run.finished_at is None:
        return None
    return max((run.finished_at - run.started_at).total_seconds(), 0.0)


def _owned(status: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: _without_nulls(status[k]) for k in STATUS_KEYS if status and status.get(k) is not None}


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = _merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    return patch
