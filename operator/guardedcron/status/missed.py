"""Missed runs: an expected slot whose start deadline passed with no Job (pure).

Computed by the operator from the schedule alone, outside the CronJob controller it
watches, so a controller that is down, skipped a slot (Forbid with the previous run
still going) or gave up after `startingDeadlineSeconds` is caught all the same.

Only the latest slot whose deadline has passed is looked at: `MissedRun` says "the
run that should have started most recently did not", and clears once a later slot
runs. A slot is settled only when a run of *that* slot started somewhere (here, or in
another cluster sharing the database: the guard then finds the slot claimed). A slot whose
runs all ended `GuardError` (the guard could not decide: a database down, say), or were
skipped because the lease was held by a run of another slot, a manual run or a dead pod,
is missed too: its Job started, but its work never ran anywhere. Slots are the
schedule's fire times in its time zone (DST handled by `guardedcron.schedule`), strictly
after the GuardedCronJob was created, as the CronJob controller counts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from guardedcron.spec import ParsedSpec
from guardedcron.status.runs import Outcome, RunRecord, is_manual, scheduled_slot
from guardedcron.status.times import epoch_minute


@dataclass(frozen=True)
class MissedRun:
    scheduled_at: datetime  # the slot, UTC
    slot: int  # minutes since the epoch
    job_name: str  # the name the CronJob controller would have given its Job
    deadline: datetime  # slot + startingDeadlineSeconds + missedRunToleranceSeconds
    guard_error: str | None = None  # the guard's reason, when the slot's runs all ended GuardError
    turned_away: str | None = None  # the skip's reason, when a run of the slot found the lease held


def find_missed_run(
    parsed: ParsedSpec,
    *,
    jobs: Iterable[RunRecord | Mapping[str, Any]],
    last_schedule_time: datetime | None,
    created_at: datetime,
    now: datetime,
) -> MissedRun | None:
    """The latest slot past its deadline that no run of it settled, or None.

    `jobs` are the runs known for this GuardedCronJob: live Job objects and/or records
    (status.recentRuns keeps runs whose Jobs the history limits deleted). A record settles
    its slot as `RunRecord.settles_slot` says; a live Job object without a record yet
    counts as settling (its outcome is not known). With no run known for the slot, the
    CronJob's `lastScheduleTime` being that slot counts as a run.
    """
    spec = parsed.spec
    if spec.suspend:
        return None
    grace = timedelta(seconds=spec.starting_deadline_seconds + spec.missed_run_tolerance_seconds)
    slot_time = spec.schedule.previous_at_or_before(now - grace, spec.zone)
    if slot_time is None or slot_time <= created_at:
        return None
    slot = epoch_minute(slot_time)
    runs = [job for job in jobs if _scheduled_slot_of(job) == slot]
    if any(not isinstance(run, RunRecord) or run.settles_slot for run in runs):
        return None
    if not runs and last_schedule_time is not None and epoch_minute(last_schedule_time) == slot:
        return None
    records = [run for run in runs if isinstance(run, RunRecord)]
    errored = [r for r in records if r.outcome is Outcome.GUARD_ERROR]
    skipped = [r for r in records if r.outcome is Outcome.SKIPPED]
    return MissedRun(
        scheduled_at=slot_time,
        slot=slot,
        job_name=records[-1].job if records else f"{parsed.name}-{slot}",
        deadline=slot_time + grace,
        guard_error=errored[-1].reason if errored and not skipped else None,
        turned_away=skipped[-1].reason if skipped else None,
    )


def _scheduled_slot_of(job: RunRecord | Mapping[str, Any]) -> int | None:
    if isinstance(job, RunRecord):
        return None if job.manual else job.slot
    return None if is_manual(job) else scheduled_slot(job)

