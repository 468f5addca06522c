"""Missed runs: an expected slot whose start deadline passed with no Job (pure).

Computed by the operator from the schedule alone, outside the CronJob controller it
watches, so a controller that is down, skipped a slot (Forbid with the previous run
still going) or gave up after `startingDeadlineSeconds` is caught all the same.

Only the latest slot whose deadline has passed is looked at: `MissedRun` says "the
run that should have started most recently did not", and clears once a later slot
runs. Slots are the schedule's fire times in its time zone (DST handled by
`guardedcron.schedule`), strictly after the GuardedCronJob was created, as the
CronJob controller counts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from guardedcron.spec import ParsedSpec
from guardedcron.status.runs import RunRecord, is_manual, scheduled_slot
from guardedcron.status.times import epoch_minute


@dataclass(frozen=True)
class MissedRun:
    scheduled_at: datetime  # the slot, UTC
    slot: int  # minutes since the epoch
    job_name: str  # the name the CronJob controller would have given its Job
    deadline: datetime  # slot + startingDeadlineSeconds + missedRunToleranceSeconds


def find_missed_run(
    parsed: ParsedSpec,
    *,
    jobs: Iterable[RunRecord | Mapping[str, Any]],
    last_schedule_time: datetime | None,
    created_at: datetime,
    now: datetime,
) -> MissedRun | None:
    """The latest slot past its deadline without a Job, or None.

    `jobs` are the runs known for this GuardedCronJob: live Job objects and/or records
    (status.recentRuns keeps runs whose Jobs the history limits deleted). A slot counts
    as run when a scheduled (not manual) Job or record carries it, or when the
    CronJob's `lastScheduleTime` is that slot.
    """
    spec = parsed.spec
    if spec.suspend:
        return None
    grace = timedelta(seconds=spec.starting_deadline_seconds + spec.missed_run_tolerance_seconds)
    slot_time = spec.schedule.previous_at_or_before(now - grace, spec.zone)
    if slot_time is None or slot_time <= created_at:
        return None
    slot = epoch_minute(slot_time)
    if last_schedule_time is not None and epoch_minute(last_schedule_time) == slot:
        return None
    if slot in scheduled_slots(jobs):
        return None
    return MissedRun(
        scheduled_at=slot_time,
        slot=slot,
        job_name=f"{parsed.name}-{slot}",
        deadline=slot_time + grace,
    )


def scheduled_slots(jobs: Iterable[RunRecord | Mapping[str, Any]]) -> set[int]:
    """Slots that have a scheduled run; manual runs fill no slot."""
    slots: set[int] = set()
    for job in jobs:
        if isinstance(job, RunRecord):
            slot = None if job.manual else job.slot
        else:
            slot = None if is_manual(job) else scheduled_slot(job)
        if slot is not None:
            slots.add(slot)
    return slots


def schedule_period_seconds(parsed: ParsedSpec, now: datetime) -> float | None:
    """Seconds between the schedule's last two fire times at or before `now` (for alerts
    such as "no success within N periods"); None when it has not fired twice in 5 years."""
    spec = parsed.spec
    last = spec.schedule.previous_at_or_before(now, spec.zone)
    if last is None:
        return None
    before = spec.schedule.previous_at_or_before(last - timedelta(minutes=1), spec.zone)
    if before is None:
        return None
    return (last - before).total_seconds()
