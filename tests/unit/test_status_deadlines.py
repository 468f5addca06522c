"""The alerts' deadlines on real schedules (status/deadlines.py), with an injected clock.

Every case uses startingDeadlineSeconds 600 and missedRunToleranceSeconds 60 (the
README's example, tests/support/gcj.py): a slot must have started 11 minutes after it
is due. Instants worked out by hand: Europe/Berlin is UTC+1 in winter, UTC+2 in summer,
and in 2025 goes forward on 30 March (02:00 -> 03:00) and back on 26 October (03:00 ->
02:00, so 02:30 comes twice: 00:30Z and 01:30Z). 6 June 2025 is a Friday.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from guardedcron.spec import ParsedSpec, parse_guarded_cronjob
from guardedcron.status import alert_deadlines
from guardedcron.status.deadlines import next_slot_due, success_overdue_at
from tests.support.gcj import on_schedule

GRACE = timedelta(minutes=11)
LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)


def z(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def parsed(schedule: str, zone: str | None, **spec: Any) -> ParsedSpec:
    return parse_guarded_cronjob(on_schedule(schedule, zone, **spec))


# (schedule, zone, the newest slot that started, expected next slot due)
NEXT_SLOT = [
    # Weekdays: after Friday's run the next slot is Monday's, not Saturday's.
    ("0 9 * * 1-5", "Europe/Berlin", "2025-06-06T07:00:00", "2025-06-09T07:00:00"),
    # Business hours: after 17:55 the next is 09:00 the next morning.
    ("*/5 9-17 * * *", "Europe/Berlin", "2025-06-06T15:55:00", "2025-06-07T07:00:00"),
    # Spring forward: 30 March has no 02:30, the next is 31 March 02:30 CEST.
    ("30 2 * * *", "Europe/Berlin", "2025-03-29T01:30:00", "2025-03-31T00:30:00"),
    # Fall back: 02:30 CEST is followed an hour later by 02:30 CET, then by the next day's.
    ("30 2 * * *", "Europe/Berlin", "2025-10-26T00:30:00", "2025-10-26T01:30:00"),
    ("30 2 * * *", "Europe/Berlin", "2025-10-26T01:30:00", "2025-10-27T01:30:00"),
    ("0 3 * * *", "Europe/Berlin", "2025-10-25T01:00:00", "2025-10-26T02:00:00"),
    # `H H * * *` for the lock billing/nightly-invoices is 02:47 (pinned below).
    ("H H * * *", None, "2025-06-02T02:47:00", "2025-06-03T02:47:00"),
]


@pytest.mark.parametrize(("schedule", "zone", "last_scheduled", "due"), NEXT_SLOT)
def test_next_slot_is_the_schedules_next_fire_time(schedule: str, zone: str | None,
                                                   last_scheduled: str, due: str) -> None:
    spec = parsed(schedule, zone)
    assert next_slot_due(spec, last_scheduled=z(last_scheduled), created_at=LONG_AGO) == z(due)
    deadlines = alert_deadlines(spec, last_scheduled=z(last_scheduled), last_success=None,
                                created_at=LONG_AGO, no_success_slots=2)
    assert deadlines.next_slot == z(due)
    assert deadlines.next_slot_start_deadline == z(due) + GRACE


def test_the_hashed_schedule_is_the_resolved_one() -> None:
    assert parsed("H H * * *", None).spec.schedule_text == "47 2 * * *"


def test_a_job_that_never_started_waits_for_its_first_slot_after_creation() -> None:
    spec = parsed("0 * * * *", None)
    assert next_slot_due(spec, last_scheduled=None, created_at=z("2025-06-02T10:20:00")) \
        == z("2025-06-02T11:00:00")
    # A lastScheduleTime older than the object (its CronJob adopted) does not count before it.
    assert next_slot_due(spec, last_scheduled=z("2025-06-01T00:00:00"),
                         created_at=z("2025-06-02T10:20:00")) == z("2025-06-02T11:00:00")


# (schedule, zone, extra spec, last success, slots, expected overdue instant): the start
# deadline of the slot after the `slots`-th slot after the last success.
OVERDUE: list[tuple[str, str | None, dict[str, Any], str, int, str]] = [
    # Friday's success: Monday and Tuesday must pass (until Wednesday's start deadline);
    # nothing is due over the weekend. A period formula (1 day, Thursday to Friday) said Sunday.
    ("0 9 * * 1-5", "Europe/Berlin", {}, "2025-06-06T07:05:00", 2, "2025-06-11T07:11:00"),
    ("0 9 * * 1-5", "Europe/Berlin", {}, "2025-06-06T07:05:00", 1, "2025-06-10T07:11:00"),
    # 17:55's success: 09:00 and 09:05 the next morning, overdue at 09:10's deadline. A
    # period formula (5 minutes) said 18:06 that evening.
    ("*/5 9-17 * * *", "Europe/Berlin", {}, "2025-06-06T15:56:00", 2, "2025-06-07T07:21:00"),
    # Spring forward: no slot on 30 March; 31 March and 1 April, overdue at 2 April's.
    ("30 2 * * *", "Europe/Berlin", {}, "2025-03-29T01:40:00", 2, "2025-04-02T00:41:00"),
    ("0 3 * * *", "Europe/Berlin", {}, "2025-03-29T02:10:00", 2, "2025-04-01T01:11:00"),
    # Fall back, both showings of 02:30 succeeded: from the second, three days on. A
    # period formula (1 hour between the two showings) said 03:40Z that same night.
    ("30 2 * * *", "Europe/Berlin", {}, "2025-10-26T01:40:00", 2, "2025-10-29T01:41:00"),
    # From the first showing: the second is a slot of its own (`repeatedTime: Twice`).
    ("30 2 * * *", "Europe/Berlin", {}, "2025-10-26T00:40:00", 2, "2025-10-28T01:41:00"),
    # With `repeatedTime: Once` the second showing claims the first's slot: one slot.
    ("30 2 * * *", "Europe/Berlin", {"dstPolicy": {"repeatedTime": "Once"}},
     "2025-10-26T00:40:00", 2, "2025-10-29T01:41:00"),
    ("0 3 * * *", "Europe/Berlin", {}, "2025-10-25T01:10:00", 2, "2025-10-28T02:11:00"),
    # Hashed: 02:47 UTC every day.
    ("H H * * *", None, {}, "2025-06-02T02:50:00", 2, "2025-06-05T02:58:00"),
]


@pytest.mark.parametrize(("schedule", "zone", "spec", "last_success", "slots", "overdue"), OVERDUE)
def test_success_overdue_counts_the_schedules_slots(schedule: str, zone: str | None, spec: dict[str, Any],
                                                    last_success: str, slots: int, overdue: str) -> None:
    got = success_overdue_at(parsed(schedule, zone, **spec), last_success=z(last_success),
                             created_at=LONG_AGO, slots=slots)
    assert got == z(overdue)


def test_a_job_failing_since_its_first_run_is_overdue_counted_from_its_creation() -> None:
    """No success ever: the slots after the creation count (11:00 and 12:00 failed; 13:00
    had until its start deadline)."""
    spec = parsed("0 * * * *", None)
    created = z("2025-06-02T10:20:00")
    deadlines = alert_deadlines(spec, last_scheduled=z("2025-06-02T12:00:00"), last_success=None,
                                created_at=created, no_success_slots=2)
    assert deadlines.success_overdue == z("2025-06-02T13:11:00")
    assert deadlines.next_slot == z("2025-06-02T13:00:00")


def test_a_schedule_that_never_fires_has_no_deadlines() -> None:
    spec = parsed("0 0 30 2 *", None)  # 30 February
    deadlines = alert_deadlines(spec, last_scheduled=None, last_success=None, created_at=LONG_AGO,
                                no_success_slots=2)
    assert deadlines.next_slot is None and deadlines.next_slot_start_deadline is None
    assert deadlines.success_overdue is None
