"""What happened between two statuses, as events (pure).

Events come from the difference between the status before and after a pass, never
from the current state alone, so a resync over an unchanged status emits nothing
and each transition is reported once:

- a run seen for the first time while running: RunStarted;
- a run whose outcome changed (or that is first seen already decided): RunSucceeded,
  RunFailed, RunSkipped, RunTimedOut, LeaseLost or GuardError; a run that lost its
  lease gets LeaseLost when the loss is seen, not again when its Job ends;
- the MissedRun or Overlap condition turning True, or naming another slot or pair
  while True: MissedRun, Overlap.
Runs are those the statuses remember (recentRuns and lastRun), as compute_status read
them once (`known_records`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from guardedcron.status import conditions as cond
from guardedcron.status.history import newest_first
from guardedcron.status.runs import Outcome, RunRecord


class EventReason(StrEnum):
    RUN_STARTED = "RunStarted"
    RUN_SUCCEEDED = "RunSucceeded"
    RUN_FAILED = "RunFailed"
    RUN_SKIPPED = "RunSkipped"
    RUN_TIMED_OUT = "RunTimedOut"
    LEASE_LOST = "LeaseLost"
    GUARD_ERROR = "GuardError"
    MISSED_RUN = "MissedRun"
    OVERLAP = "Overlap"
    # Not from a status difference: posted by the operator when it acts (guardedcron.planner).
    MANUAL_RUN_CREATED = "ManualRunCreated"
    TRIGGER_FAILED = "TriggerFailed"
    WORKLOAD_STOPPED = "WorkloadStopped"
    STOP_WORKLOAD_FAILED = "StopWorkloadFailed"
    OUTCOME_NOT_RECORDED = "OutcomeNotRecorded"
    # A skipped run's Job could not be removed (status/skips.py), so it stays Failed.
    SKIPPED_JOB_KEPT = "SkippedJobKept"
    # The spec asks for a lock its namespace may not use (spec.locks), or the CronJob
    # was deleted because its runs would take one.
    LOCK_NOT_ALLOWED = "LockNotAllowed"
    # The CronJob's runs took another lock until this pass (e.g. a lease.name that did not
    # yet name the namespace): runs under the two names do not exclude each other.
    LOCK_CHANGED = "LockChanged"
    # Catch-up, backfill and suspension after failures (planner/slots.py).
    MAKE_UP_RUN_CREATED = "MakeUpRunCreated"
    MAKE_UP_RUN_FAILED = "MakeUpRunFailed"
    BACKFILL_STARTED = "BackfillStarted"
    BACKFILL_RUN_CREATED = "BackfillRunCreated"
    # A wall time the clock skipped, run at the next minute (spec.dstPolicy.skippedTime).
    SKIPPED_TIME_RUN_CREATED = "SkippedTimeRunCreated"
    # catchUp All with maxRuns above 1 but no lease.heartbeat (a warning, not a refusal).
    CATCH_UP_WITHOUT_HEARTBEAT = "CatchUpWithoutHeartbeat"
    BACKFILL_COMPLETED = "BackfillCompleted"
    BACKFILL_STOPPED = "BackfillStopped"
    BACKFILL_REFUSED = "BackfillRefused"
    SUSPENDED_AFTER_FAILURES = "SuspendedAfterFailures"
    RESUMED_AFTER_FAILURES = "ResumedAfterFailures"
    # What the pass cannot do (planner/pass_plan.py), said when status changes: the spec's
    # problems, the API server's refusal of the CronJob, a CronJob of that name not ours.
    SPEC_INVALID = "SpecInvalid"
    CRONJOB_REJECTED = "CronJobRejected"
    CRONJOB_NOT_OWNED = "CronJobNotOwned"
    # A pass raised and runs again later: said once per error (and operator process).
    RECONCILE_FAILED = "ReconcileFailed"


_BY_OUTCOME: dict[Outcome, EventReason] = {
    Outcome.RUNNING: EventReason.RUN_STARTED,
    Outcome.SUCCEEDED: EventReason.RUN_SUCCEEDED,
    Outcome.FAILED: EventReason.RUN_FAILED,
    Outcome.SKIPPED: EventReason.RUN_SKIPPED,
    Outcome.TIMED_OUT: EventReason.RUN_TIMED_OUT,
    Outcome.LOST: EventReason.LEASE_LOST,
    Outcome.GUARD_ERROR: EventReason.GUARD_ERROR,
}
# Kubernetes event type "Warning" for these; the rest are "Normal". A skip is the guard
# doing its job, so it is Normal.
WARNINGS = frozenset({
    EventReason.RUN_FAILED, EventReason.RUN_TIMED_OUT, EventReason.LEASE_LOST,
    EventReason.GUARD_ERROR, EventReason.MISSED_RUN, EventReason.OVERLAP,
    EventReason.TRIGGER_FAILED, EventReason.WORKLOAD_STOPPED, EventReason.STOP_WORKLOAD_FAILED,
    EventReason.OUTCOME_NOT_RECORDED, EventReason.SKIPPED_JOB_KEPT, EventReason.LOCK_NOT_ALLOWED,
    EventReason.LOCK_CHANGED,
    EventReason.MAKE_UP_RUN_FAILED, EventReason.BACKFILL_REFUSED, EventReason.BACKFILL_STOPPED,
    EventReason.SUSPENDED_AFTER_FAILURES, EventReason.CATCH_UP_WITHOUT_HEARTBEAT,
    EventReason.SPEC_INVALID, EventReason.CRONJOB_REJECTED, EventReason.CRONJOB_NOT_OWNED,
    EventReason.RECONCILE_FAILED,
})


@dataclass(frozen=True)
class RunEvent:
    reason: EventReason
    message: str
    # What the event is about, stable across passes: the Job name for run events, the
    # condition message for MissedRun/Overlap. Same subject and reason = same event.
    subject: str
    run: RunRecord | None = None

    @property
    def warning(self) -> bool:
        return self.reason in WARNINGS

    def key(self) -> str:
        """A short stable digest of (reason, subject), for deterministic Event names."""
        return hashlib.sha256(f"{self.reason}\n{self.subject}".encode()).hexdigest()[:16]


def run_events(before: Mapping[str, RunRecord], after: Mapping[str, RunRecord],
               old_conditions: Sequence[Mapping[str, Any]],
               new_conditions: Sequence[Mapping[str, Any]]) -> list[RunEvent]:
    """Events for every transition from the old status to the new one (their runs by Job
    name, and their conditions), oldest run first."""
    events: list[RunEvent] = []
    for run in reversed(newest_first(after.values())):
        previous = before.get(run.job)
        if previous is None or previous.outcome is not run.outcome:
            events.append(_run_event(run))
    for kind, reason in ((cond.MISSED_RUN, EventReason.MISSED_RUN), (cond.OVERLAP, EventReason.OVERLAP)):
        event = _condition_event(old_conditions, new_conditions, kind, reason)
        if event is not None:
            events.append(event)
    return events


def _run_event(run: RunRecord) -> RunEvent:
    return RunEvent(_BY_OUTCOME[run.outcome], describe_run(run), subject=run.job, run=run)


def describe_run(run: RunRecord) -> str:
    """One line for `kubectl describe gcj`: which run, what happened, with which lease."""
    kind = "manual run" if run.manual else "run"
    slot = f" for slot {run.slot}" if run.slot is not None and not run.manual else ""
    text = {
        Outcome.RUNNING: "started",
        Outcome.SUCCEEDED: "succeeded",
        Outcome.FAILED: "failed",
        Outcome.SKIPPED: "skipped",
        Outcome.TIMED_OUT: "timed out",
        Outcome.LOST: "lost its lease",
        Outcome.GUARD_ERROR: "could not be guarded",
    }[run.outcome]
    lease = ""
    if run.outcome is not Outcome.SKIPPED and run.fence is not None:
        lease = f" (holder {run.holder}, fence {run.fence})"
    return f"{kind} {run.job}{slot} {text}{lease}: {run.reason}"


def _condition_event(old_conditions: Sequence[Mapping[str, Any]],
                     new_conditions: Sequence[Mapping[str, Any]],
                     kind: str, reason: EventReason) -> RunEvent | None:
    new = cond.get_condition(new_conditions, kind)
    if new is None or new.get("status") != "True":
        return None
    old = cond.get_condition(old_conditions, kind)
    message = str(new.get("message") or "")
    if old is not None and old.get("status") == "True" and old.get("message") == message:
        return None
    return RunEvent(reason, message, subject=message)
