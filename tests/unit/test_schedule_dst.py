"""DST policy slot keys (issue 14) around both 2026 clock changes of a northern zone
(Europe/Stockholm) and two southern ones (Australia/Sydney, America/Santiago).

The fire times come from `Schedule` (the CronJob controller's rule, one slot per
instant); `repeatedTime: Once` maps each to the slot of the first showing of its wall
clock minute, which is what the guard claims (RunContext.claimed_slot)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from guardedcron import contract
from guardedcron.guard.outputs import RunContext
from guardedcron.schedule import Schedule
from guardedcron.schedule.dst import slot_of, slot_time, wall_clock_slot
from tests.support.clock import FakeClock

# (zone, schedule, the UTC instant the clock is set back, the UTC instant it jumps ahead)
TRANSITIONS = [
    pytest.param("Europe/Stockholm", "30 2 * * *",
                 datetime(2026, 10, 25, 1, 0, tzinfo=UTC), datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
                 id="stockholm"),
    pytest.param("Australia/Sydney", "30 2 * * *",
                 datetime(2026, 4, 4, 16, 0, tzinfo=UTC), datetime(2026, 10, 3, 16, 0, tzinfo=UTC),
                 id="sydney"),
    pytest.param("America/Santiago", "30 23 * * *",
                 datetime(2026, 4, 5, 3, 0, tzinfo=UTC), datetime(2026, 9, 6, 4, 0, tzinfo=UTC),
                 id="santiago"),
]


def fires_around(schedule: str, zone: ZoneInfo, instant: datetime) -> list[datetime]:
    clock = FakeClock(instant - timedelta(hours=36))
    return list(Schedule.parse(schedule).iter_between(clock(), instant + timedelta(hours=36), zone))


@pytest.mark.parametrize(("zone_name", "schedule", "back", "ahead"), TRANSITIONS)
def test_fall_back_night_runs_twice_by_default_and_claims_one_slot_once(
        zone_name: str, schedule: str, back: datetime, ahead: datetime) -> None:
    zone = ZoneInfo(zone_name)
    fires = fires_around(schedule, zone, back)
    walls = [t.astimezone(zone).replace(tzinfo=None) for t in fires]
    repeated = [t for t, wall in zip(fires, walls, strict=True) if walls.count(wall) == 2]
    assert len(repeated) == 2 and repeated[1] - repeated[0] == timedelta(hours=1)
    # Twice (today's behaviour): each showing is its own slot.
    assert len({slot_of(t) for t in fires}) == len(fires)
    # Once: both showings claim the first's slot; every other night keeps its own.
    claimed = [wall_clock_slot(slot_of(t), zone) for t in fires]
    assert claimed[fires.index(repeated[1])] == slot_of(repeated[0])
    assert len(set(claimed)) == len(fires) - 1
    assert [c for c, t in zip(claimed, fires, strict=True) if t not in repeated[1:]] == [
        slot_of(t) for t in fires if t not in repeated[1:]]


@pytest.mark.parametrize(("zone_name", "schedule", "back", "ahead"), TRANSITIONS)
def test_spring_night_is_unchanged_by_once(zone_name: str, schedule: str, back: datetime,
                                           ahead: datetime) -> None:
    zone = ZoneInfo(zone_name)
    fires = fires_around(schedule, zone, ahead)
    assert len(fires) >= 2
    assert [wall_clock_slot(slot_of(t), zone) for t in fires] == [slot_of(t) for t in fires]


@pytest.mark.parametrize(("zone_name", "schedule", "back", "ahead"), TRANSITIONS)
def test_only_the_second_showing_of_the_repeated_hour_moves(
        zone_name: str, schedule: str, back: datetime, ahead: datetime) -> None:
    zone = ZoneInfo(zone_name)
    for instant in (back, ahead):
        start = slot_of(instant) - 180
        moved = {slot: wall_clock_slot(slot, zone) for slot in range(start, start + 360)
                 if wall_clock_slot(slot, zone) != slot}
        if instant == ahead:
            assert moved == {}
        else:
            first = slot_of(back)
            assert moved == {first + n: first - 60 + n for n in range(60)}


def test_run_context_claims_the_first_showing_and_reports_the_real_time() -> None:
    zone = ZoneInfo("Europe/Stockholm")
    second = slot_of(datetime(2026, 10, 25, 1, 30, tzinfo=UTC))  # 02:30 CET, the second 02:30
    context = RunContext(scheduled_slot=second, time_zone="Europe/Stockholm", zone=zone,
                         once_per_wall_minute=True, run_kind=None)
    assert context.claimed_slot == second - 60
    assert context.fields() == {
        contract.KEY_RUN_KIND: contract.RUN_KIND_SCHEDULED,
        contract.KEY_MANUAL: False,
        contract.KEY_SCHEDULED_TIME_UTC: "2026-10-25T01:30:00Z",
        contract.KEY_SCHEDULED_TIME: "2026-10-25T02:30:00+01:00",
        contract.KEY_TIME_ZONE: "Europe/Stockholm",
    }
    twice = RunContext(scheduled_slot=second, time_zone="Europe/Stockholm", zone=zone,
                       once_per_wall_minute=False, run_kind=None)
    assert twice.claimed_slot == second


def test_run_context_of_manual_and_made_up_runs() -> None:
    manual = RunContext(scheduled_slot=None, time_zone=None, zone=None,
                        once_per_wall_minute=False, run_kind=None)
    assert manual.claimed_slot is None
    assert manual.fields() == {
        contract.KEY_RUN_KIND: contract.RUN_KIND_MANUAL, contract.KEY_MANUAL: True,
        contract.KEY_SCHEDULED_TIME_UTC: None, contract.KEY_SCHEDULED_TIME: None,
        contract.KEY_TIME_ZONE: None,
    }
    slot = slot_of(datetime(2026, 7, 1, 0, 30, tzinfo=UTC))
    backfill = RunContext(scheduled_slot=slot, time_zone=None, zone=None,
                          once_per_wall_minute=False, run_kind=contract.RUN_KIND_BACKFILL)
    fields = backfill.fields()
    assert (fields[contract.KEY_RUN_KIND], fields[contract.KEY_MANUAL]) == ("backfill", False)
    assert fields[contract.KEY_SCHEDULED_TIME_UTC] == "2026-07-01T00:30:00Z"
    assert fields[contract.KEY_SCHEDULED_TIME] is None  # the guard was not told the zone


def test_slot_time_and_slot_of_agree() -> None:
    t = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert slot_time(slot_of(t)) == t
    assert slot_of(t + timedelta(seconds=59)) == slot_of(t)
