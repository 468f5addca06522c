"""Missed runs across daylight-saving changes and time zones, with an injected clock.

Expected instants are worked out by hand from the zones' rules for 2025:
Europe/Stockholm goes CET→CEST on 30 March (02:00→03:00) and back on 26 October
(03:00→02:00); America/New_York EST→EDT on 9 March (02:00→03:00) and back on
2 November (02:00→01:00). Every case uses startingDeadlineSeconds 600 and
missedRunToleranceSeconds 60: a slot is due 11 minutes after it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from guardedcron.spec import ParsedSpec, parse_guarded_cronjob
from guardedcron.status import MissedRun, Outcome, RunRecord, find_missed_run
from tests.support import status_objects as k
from tests.support.gcj import on_schedule

LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)


def z(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def parsed(schedule: str, zone: str | None, **spec: Any) -> ParsedSpec:
    return parse_guarded_cronjob(on_schedule(schedule, zone, **spec))


def record(slot: datetime, *, manual: bool = False) -> RunRecord:
    minute = k.minute_of(slot)
    return RunRecord(job=f"{k.CRONJOB}-{minute}", outcome=Outcome.SUCCEEDED, reason="workload completed",
                     slot=None if manual else minute, manual=manual, scheduled_at=None if manual else slot)


def missed(spec: ParsedSpec, slot: datetime) -> MissedRun:
    minute = k.minute_of(slot)
    return MissedRun(scheduled_at=slot, slot=minute, job_name=f"{spec.name}-{minute}",
                     deadline=slot + timedelta(minutes=11))


# (schedule, zone, now, slots that have runs, expected missed slot or None)
CASES = [
    # Stockholm, spring forward: 30 March 2025 has no 02:30.
    ("30 2 * * *", "Europe/Stockholm", "2025-03-30T12:00:00", [], "2025-03-29T01:30:00"),
    ("30 2 * * *", "Europe/Stockholm", "2025-03-30T12:00:00", ["2025-03-29T01:30:00"], None),
    ("30 2 * * *", "Europe/Stockholm", "2025-03-31T00:40:59", ["2025-03-29T01:30:00"], None),
    ("30 2 * * *", "Europe/Stockholm", "2025-03-31T00:41:00", ["2025-03-29T01:30:00"], "2025-03-31T00:30:00"),
    ("30 2 * * *", "Europe/Stockholm", "2025-03-31T00:41:00", ["2025-03-31T00:30:00"], None),
    # Stockholm, fall back: 02:30 happens twice on 26 October 2025, two slots.
    ("30 2 * * *", "Europe/Stockholm", "2025-10-26T01:40:59", ["2025-10-26T00:30:00"], None),
    ("30 2 * * *", "Europe/Stockholm", "2025-10-26T01:41:00", ["2025-10-26T00:30:00"], "2025-10-26T01:30:00"),
    ("30 2 * * *", "Europe/Stockholm", "2025-10-26T01:41:00",
     ["2025-10-26T00:30:00", "2025-10-26T01:30:00"], None),
    ("30 2 * * *", "Europe/Stockholm", "2025-10-26T01:10:00", [], "2025-10-26T00:30:00"),
    # New York, spring forward: no 02:00 on 9 March 2025.
    ("0 2 * * *", "America/New_York", "2025-03-09T20:00:00", ["2025-03-08T07:00:00"], None),
    ("0 2 * * *", "America/New_York", "2025-03-10T06:11:00", ["2025-03-08T07:00:00"], "2025-03-10T06:00:00"),
    # New York, fall back: 01:30 EDT then 01:30 EST on 2 November 2025.
    ("30 1 * * *", "America/New_York", "2025-11-02T06:41:00", ["2025-11-02T05:30:00"], "2025-11-02T06:30:00"),
    ("30 1 * * *", "America/New_York", "2025-11-02T06:41:00",
     ["2025-11-02T05:30:00", "2025-11-02T06:30:00"], None),
    # A time-zone schedule without DST: 09:00 on weekdays in Tokyo is 00:00 UTC.
    ("0 9 * * 1-5", "Asia/Tokyo", "2025-06-02T00:11:00", ["2025-06-02T00:00:00"], None),
    ("0 9 * * 1-5", "Asia/Tokyo", "2025-06-02T09:30:00", ["2025-06-02T09:00:00"], "2025-06-02T00:00:00"),
    ("0 9 * * 1-5", "Asia/Tokyo", "2025-06-08T12:00:00", ["2025-06-06T00:00:00"], None),
    ("0 9 * * 1-5", "Asia/Tokyo", "2025-06-08T12:00:00", [], "2025-06-06T00:00:00"),
    # No timeZone: UTC.
    ("0 0 * * *", None, "2025-06-02T00:11:00", [], "2025-06-02T00:00:00"),
    ("@hourly", None, "2025-06-02T10:10:59", ["2025-06-02T09:00:00"], None),
    ("@hourly", None, "2025-06-02T10:11:00", ["2025-06-02T09:00:00"], "2025-06-02T10:00:00"),
]


@pytest.mark.parametrize(("schedule", "zone", "now", "ran", "expected"), CASES)
def test_missed_runs_table(schedule: str, zone: str | None, now: str, ran: list[str],
                           expected: str | None) -> None:
    spec = parsed(schedule, zone)
    got = find_missed_run(spec, jobs=[record(z(s)) for s in ran], last_schedule_time=None,
                          created_at=LONG_AGO, now=z(now))
    assert got == (missed(spec, z(expected)) if expected else None)


def test_live_job_objects_count_by_name_or_by_annotation() -> None:
    spec = parsed("30 2 * * *", "Europe/Stockholm")
    slot, now = z("2025-03-31T00:30:00"), z("2025-03-31T00:41:00")
    by_name = k.job(slot_time=slot, created=slot, zone_offset=timedelta(hours=2))
    assert find_missed_run(spec, jobs=[by_name], last_schedule_time=None, created_at=LONG_AGO,
                           now=now) is None
    by_annotation = k.job(slot_time=slot, created=slot, zone_offset=timedelta(hours=2), name="renamed")
    assert find_missed_run(spec, jobs=[by_annotation], last_schedule_time=None, created_at=LONG_AGO,
                           now=now) is None


def test_manual_runs_fill_no_slot() -> None:
    spec = parsed("30 2 * * *", "Europe/Stockholm")
    slot, now = z("2025-03-31T00:30:00"), z("2025-03-31T00:41:00")
    manual_job = k.job(slot_time=slot, created=slot, zone_offset=timedelta(hours=2),
                       manual_annotation="kubectl")
    for jobs in ([record(slot, manual=True)], [manual_job]):
        assert find_missed_run(spec, jobs=jobs, last_schedule_time=None, created_at=LONG_AGO,
                               now=now) == missed(spec, slot)


def test_the_cronjobs_last_schedule_time_covers_a_job_already_deleted() -> None:
    spec = parsed("0 0 * * *", None)
    slot, now = z("2025-06-02T00:00:00"), z("2025-06-02T06:00:00")
    assert find_missed_run(spec, jobs=[], last_schedule_time=slot, created_at=LONG_AGO, now=now) is None
    earlier = z("2025-06-01T00:00:00")
    assert find_missed_run(spec, jobs=[], last_schedule_time=earlier, created_at=LONG_AGO,
                           now=now) == missed(spec, slot)


def test_a_slot_whose_runs_all_ended_guard_error_is_missed() -> None:
    """The Job ran but the guard could not decide (database down): the work never ran."""
    spec = parsed("0 0 * * *", None)
    slot, now = z("2025-06-02T00:00:00"), z("2025-06-02T06:00:00")
    minute = k.minute_of(slot)
    errored = RunRecord(job=f"{k.CRONJOB}-{minute}", outcome=Outcome.GUARD_ERROR,
                        reason="database unreachable", slot=minute, scheduled_at=slot,
                        finished_at=slot + timedelta(seconds=5))  # fmt: skip
    got = find_missed_run(spec, jobs=[errored], last_schedule_time=slot, created_at=LONG_AGO, now=now)
    assert got == MissedRun(scheduled_at=slot, slot=minute, job_name=errored.job,
                            deadline=slot + timedelta(minutes=11), guard_error="database unreachable")
    # A second run of the same slot that got to its work: the slot ran.
    retried = RunRecord(job=f"{k.CRONJOB}-{minute}", outcome=Outcome.SUCCEEDED, reason="workload completed",
                        slot=minute, scheduled_at=slot, finished_at=slot + timedelta(minutes=1))
    assert find_missed_run(spec, jobs=[errored, retried], last_schedule_time=slot, created_at=LONG_AGO,
                           now=now) is None
    # A manual run that errored fills no slot either way.
    manual = RunRecord(job="manual-1", outcome=Outcome.GUARD_ERROR, reason="x", manual=True,
                       finished_at=slot)
    assert find_missed_run(spec, jobs=[manual], last_schedule_time=None, created_at=LONG_AGO,
                           now=now) == missed(spec, slot)


def test_no_slot_before_the_guardedcronjob_existed() -> None:
    spec = parsed("0 0 * * *", None)
    slot, now = z("2025-06-02T00:00:00"), z("2025-06-02T06:00:00")
    # The CronJob controller schedules strictly after creation: created at the slot is too late.
    assert find_missed_run(spec, jobs=[], last_schedule_time=None, created_at=slot, now=now) is None
    assert find_missed_run(spec, jobs=[], last_schedule_time=None, created_at=slot - timedelta(seconds=1),
                           now=now) == missed(spec, slot)


def test_suspended_expects_nothing() -> None:
    spec = parsed("0 0 * * *", None, suspend=True)
    assert find_missed_run(spec, jobs=[], last_schedule_time=None, created_at=LONG_AGO,
                           now=z("2025-06-02T06:00:00")) is None


def test_tolerance_and_starting_deadline_both_delay_the_verdict() -> None:
    spec = parsed("0 0 * * *", None, startingDeadlineSeconds=3600, missedRunToleranceSeconds=300)
    slot = z("2025-06-02T00:00:00")
    before = slot + timedelta(seconds=3899)
    assert find_missed_run(spec, jobs=[], last_schedule_time=None, created_at=LONG_AGO,
                           now=before) == MissedRun(
        scheduled_at=slot - timedelta(days=1), slot=k.minute_of(slot - timedelta(days=1)),
        job_name=f"{spec.name}-{k.minute_of(slot - timedelta(days=1))}",
        deadline=slot - timedelta(days=1) + timedelta(seconds=3900))
    got = find_missed_run(spec, jobs=[], last_schedule_time=None, created_at=LONG_AGO,
                          now=slot + timedelta(seconds=3900))
    assert got is not None and got.scheduled_at == slot


def skip(slot: datetime, reason: str) -> RunRecord:
    minute = k.minute_of(slot)
    return RunRecord(job=f"{k.CRONJOB}-{minute}", outcome=Outcome.SKIPPED, reason=reason, slot=minute,
                     scheduled_at=slot, started_at=slot, finished_at=slot + timedelta(seconds=5))


def test_a_skip_settles_its_slot_only_when_the_slot_ran_elsewhere() -> None:
    """One meaning of missed: the lease held by a run of another slot (or a dead pod) leaves
    the slot unrun, so it is missed; a slot claimed by another cluster's run is settled."""
    spec = parsed("0 * * * *", None)
    slot, now = z("2025-06-02T10:00:00"), z("2025-06-02T10:11:00")
    held = skip(slot, "lease held by eu-2/billing/nightly-invoices-29145480-x (fence 8)")
    got = find_missed_run(spec, jobs=[held], last_schedule_time=slot, created_at=LONG_AGO, now=now)
    assert got is not None and (got.slot, got.job_name) == (k.minute_of(slot), held.job)
    assert got.turned_away == held.reason and got.guard_error is None
    claimed = skip(slot, f"slot {k.minute_of(slot)} already ran under eu-2/billing/x (fence 9)")
    assert find_missed_run(spec, jobs=[held, claimed], last_schedule_time=slot, created_at=LONG_AGO,
                           now=now) is None
