"""The instants the schedule-aware alerts compare with `time()` (pure; the clock is the caller's).

The operator exports deadlines, not periods: the rule engine knows neither the schedule
nor its time zone, so "N slots" cannot be a multiple of a period there (`0 9 * * 1-5`
waits 72 hours over a weekend, `*/5 9-17 * * *` all night, a daily job 23 or 25 hours
at a clock change). Each gauge is set on every pass and is right without one: a slot
that comes and goes with no run (no event, no pass) still trips `time() > deadline`.

Slots are the schedule's fire times in its time zone (`guardedcron.schedule`: DST and
the resolved `H`), strictly after the GuardedCronJob was created, as `status.missed`
counts them; a slot has until `due + startingDeadlineSeconds + missedRunToleranceSeconds`
to start, the grace of MissedRun.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from guardedcron.schedule.dst import slot_of, wall_clock_slot
from guardedcron.spec import GuardedCronJobSpec, ParsedSpec


@dataclass(frozen=True)
class AlertDeadlines:
    """The gauges of one GuardedCronJob that runs on its schedule (not suspended, spec valid)."""

    next_slot: datetime | None  # the earliest slot not started yet; None: no fire time in 5 years
    next_slot_start_deadline: datetime | None  # next_slot + the start grace
    # The instant `no_success_slots` slots in a row have passed without a success; None:
    # the schedule has not that many fire times within 5 years.
    success_overdue: datetime | None


def start_grace(spec: GuardedCronJobSpec) -> timedelta:
    """How late a slot may start before it counts as missed (the grace of MissedRun)."""
    return timedelta(seconds=spec.starting_deadline_seconds + spec.missed_run_tolerance_seconds)


def next_slot_due(parsed: ParsedSpec, *, last_scheduled: datetime | None,
                  created_at: datetime) -> datetime | None:
    """The earliest slot after the newest one that started (status.lastScheduleTime), or
    after the creation when none did. It stays put while that slot does not start, so
    its deadline passes and the alert holds until a later slot runs (as MissedRun)."""
    spec = parsed.spec
    after = created_at if last_scheduled is None else max(last_scheduled, created_at)
    return spec.schedule.next_after(after, spec.zone)


def success_overdue_at(parsed: ParsedSpec, *, last_success: datetime | None,
                       created_at: datetime, slots: int) -> datetime | None:
    """When `slots` slots in a row after the last success (after the creation, if none
    ever succeeded) have passed without one.

    A slot has passed once the next slot's start deadline has: its run had until then to
    succeed. Counting to a slot's own start deadline would page while its run is still
    going (with 1, during every run longer than the grace). With `repeatedTime: Once`
    a wall time the clock shows twice is one slot (its second showing only finds the
    first's claim), so it counts once.
    """
    spec = parsed.spec
    since = created_at if last_success is None else last_success
    wanted = slots + 1  # the `slots` slots, and the one whose start deadline ends the last
    for count, due in enumerate(_counted_slots(parsed, after=since), start=1):
        if count == wanted:
            return due + start_grace(spec)
    return None


def alert_deadlines(parsed: ParsedSpec, *, last_scheduled: datetime | None,
                    last_success: datetime | None, created_at: datetime,
                    no_success_slots: int) -> AlertDeadlines:
    """Every deadline gauge of a GuardedCronJob whose runs are expected (the caller leaves
    suspended and invalid ones without series)."""
    due = next_slot_due(parsed, last_scheduled=last_scheduled, created_at=created_at)
    return AlertDeadlines(
        next_slot=due,
        next_slot_start_deadline=due + start_grace(parsed.spec) if due is not None else None,
        success_overdue=success_overdue_at(parsed, last_success=last_success,
                                           created_at=created_at, slots=no_success_slots),
    )


def _counted_slots(parsed: ParsedSpec, *, after: datetime) -> Iterator[datetime]:
    """Fire times after `after`, the second showing of a repeated wall time left out
    under `repeatedTime: Once`; ends when the schedule has none within 5 years."""
    spec = parsed.spec
    once = spec.dst_policy.repeated_time == "Once"
    due = spec.schedule.next_after(after, spec.zone)
    while due is not None:
        if not once or wall_clock_slot(slot_of(due), spec.zone) == slot_of(due):
            yield due
        due = spec.schedule.next_after(due, spec.zone)
