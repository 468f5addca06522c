"""Wall times the clock skips (spec.dstPolicy.skippedTime, issue 14): which ones a
schedule loses on the 2026 spring nights of Europe/Stockholm (29 Mar), Australia/Sydney
(4 Oct) and America/Santiago (6 Sep), the key their runs claim, and when the operator
starts them (status/skipped.py), with an injected clock.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from guardedcron import contract
from guardedcron.builders import build_cronjob
from guardedcron.builders.manual import build_slot_job
from guardedcron.cli.guard_commands import claimed_slot_of, run_context_of
from guardedcron.guard.errors import BadInput
from guardedcron.planner import wants_timer
from guardedcron.schedule import Schedule
from guardedcron.schedule.dst import (
    SKIPPED_SLOT_BASE,
    is_skipped_slot,
    next_valid_minute,
    skipped_time_slot,
    skipped_times,
    skipped_wall_time,
    slot_of,
)
from guardedcron.spec import ParsedSpec, parse_guarded_cronjob
from guardedcron.status import Outcome, RunRecord, classify_run, status_changed, status_patch
from guardedcron.status.skipped import by_skipped_key, plan_skipped_times
from guardedcron.status.slots import RETRY_AFTER_SECONDS
from guardedcron.status.times import format_time
from tests.support.clock import FakeClock
from tests.support.gcj import DEFAULT_SETTINGS, base_gcj, put

STOCKHOLM = ZoneInfo("Europe/Stockholm")
# The instants the clock jumps ahead: the first minute after each jump, in UTC.
STOCKHOLM_JUMP = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 02:00 CET -> 03:00 CEST
SYDNEY_JUMP = datetime(2026, 10, 3, 16, 0, tzinfo=UTC)  # 02:00 AEST -> 03:00 AEDT
SANTIAGO_JUMP = datetime(2026, 9, 6, 4, 0, tzinfo=UTC)  # 00:00 -04 -> 01:00 -03
STOCKHOLM_BACK = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)


def around(schedule: str, zone: str, instant: datetime) -> list[Any]:
    return skipped_times(Schedule.parse(schedule), ZoneInfo(zone),
                         after=instant - timedelta(days=2), until=instant + timedelta(days=2))


# --- which wall times are skipped, and when they are due ----------------------------------

@pytest.mark.parametrize(("zone", "schedule", "jump", "walls"), [
    pytest.param("Europe/Stockholm", "30 2,3 * * *", STOCKHOLM_JUMP, ["2026-03-29T02:30"],
                 id="stockholm"),
    pytest.param("Australia/Sydney", "*/20 2 * * *", SYDNEY_JUMP,
                 ["2026-10-04T02:00", "2026-10-04T02:20", "2026-10-04T02:40"], id="sydney"),
    pytest.param("America/Santiago", "15 0 * * *", SANTIAGO_JUMP, ["2026-09-06T00:15"],
                 id="santiago"),
])
def test_the_spring_night_skips_the_gap_and_its_runs_are_due_at_the_next_minute(
        zone: str, schedule: str, jump: datetime, walls: list[str]) -> None:
    found = around(schedule, zone, jump)
    assert [s.wall.isoformat(timespec="minutes") for s in found] == walls
    assert {s.due for s in found} == {jump}
    for s in found:
        assert next_valid_minute(s.wall, ZoneInfo(zone)) == jump
        # The controller never fires them: no instant reads that wall time.
        fires = Schedule.parse(schedule).iter_between(jump - timedelta(days=2), jump + timedelta(days=2),
                                                      ZoneInfo(zone))
        assert all(t.astimezone(ZoneInfo(zone)).replace(tzinfo=None) != s.wall for t in fires)


def test_no_wall_time_is_skipped_on_the_autumn_night_or_by_a_schedule_outside_the_gap() -> None:
    assert around("30 2 * * *", "Europe/Stockholm", STOCKHOLM_BACK) == []
    assert around("30 3 * * *", "Europe/Stockholm", STOCKHOLM_JUMP) == []
    assert around("30 2 * * *", "UTC", STOCKHOLM_JUMP) == []


def test_the_key_of_a_skipped_time_is_no_real_minute_and_differs_from_the_time_that_fires() -> None:
    # `30 2,3` on the spring night: 02:30 is skipped, 03:30 CEST (01:30Z) fires. 02:30 read
    # with the winter offset IS 01:30Z, so a real-minute key would have taken 03:30's slot.
    [skipped] = around("30 2,3 * * *", "Europe/Stockholm", STOCKHOLM_JUMP)
    fires = list(Schedule.parse("30 2,3 * * *").iter_between(
        STOCKHOLM_JUMP - timedelta(days=400), STOCKHOLM_JUMP + timedelta(days=400), STOCKHOLM))
    assert datetime(2026, 3, 29, 1, 30, tzinfo=UTC) in fires
    winter_reading = skipped.wall.replace(tzinfo=STOCKHOLM)
    assert slot_of(winter_reading) == slot_of(datetime(2026, 3, 29, 1, 30, tzinfo=UTC))
    assert skipped.slot not in {slot_of(t) for t in fires}
    last_real = slot_of(datetime(9999, 12, 31, 23, 59, tzinfo=UTC))
    assert is_skipped_slot(skipped.slot) and skipped.slot > last_real
    assert not is_skipped_slot(last_real)
    # One wall time, one key (every cluster computes it alike); another wall time, another.
    assert skipped.slot == skipped_time_slot(datetime(2026, 3, 29, 2, 30)) == SKIPPED_SLOT_BASE + 29579190
    assert skipped_wall_time(skipped.slot) == skipped.wall
    assert skipped_time_slot(datetime(2026, 3, 29, 2, 31)) == skipped.slot + 1


def test_a_real_slot_or_an_existing_wall_time_is_no_skipped_time() -> None:
    with pytest.raises(ValueError, match="is not a skipped wall time's slot"):
        skipped_wall_time(slot_of(STOCKHOLM_JUMP))
    assert next_valid_minute(datetime(2026, 3, 29, 3, 30), STOCKHOLM) is None
    assert next_valid_minute(datetime(2026, 10, 25, 2, 30), STOCKHOLM) is None  # shown twice
    with pytest.raises(ValueError, match="naive"):
        skipped_time_slot(STOCKHOLM_JUMP)


# --- the plan: when the operator starts which one --------------------------------------

CREATED = datetime(2026, 3, 1, tzinfo=UTC)


def parsed(schedule: str = "*/20 2,3 * * *", *, zone: str = "Europe/Stockholm",
           policy: str | None = "RunAtNextMinute") -> ParsedSpec:
    body = put(put(base_gcj(), "spec.schedule", schedule), "spec.timeZone", zone)
    if policy is not None:
        body = put(body, "spec.dstPolicy", {"skippedTime": policy})
    return parse_guarded_cronjob(body)


def attempt(wall: str, outcome: Outcome = Outcome.SUCCEEDED, *, n: int = 1, final: bool = True,
            reason: str = "x", finished: datetime | None = None, guard_reported: bool = True) -> RunRecord:
    """An attempt at a skipped wall time: before its guard reports, status knows only the
    minute it was due (its annotation); after, the key its guard claimed."""
    key = skipped_time_slot(datetime.fromisoformat(wall))
    job = contract.attempt_job_name("nightly-invoices", key, contract.RUN_KIND_SKIPPED_TIME, n)
    return RunRecord(job=job, outcome=outcome, reason=reason,
                     slot=key if guard_reported else slot_of(STOCKHOLM_JUMP),
                     scheduled_at=STOCKHOLM_JUMP, started_at=STOCKHOLM_JUMP,
                     finished_at=(finished or STOCKHOLM_JUMP + timedelta(minutes=1)) if final else None)


def plan(spec: ParsedSpec, runs: list[RunRecord], now: datetime, *, previous: dict[str, Any] | None = None,
         busy: bool = False, suspended: bool = False, created: datetime = CREATED) -> Any:
    return plan_skipped_times(spec, runs=by_skipped_key(runs), created_at=created, previous=previous,
                              busy=busy, suspended=suspended, now=now)


def test_skip_is_the_default_and_plans_nothing() -> None:
    assert parse_guarded_cronjob(base_gcj()).spec.dst_policy.skipped_time == "Skip"
    assert plan(parsed(policy=None), [], STOCKHOLM_JUMP + timedelta(minutes=5)) is None
    assert plan(parsed(policy="Skip"), [], STOCKHOLM_JUMP + timedelta(minutes=5)) is None


def test_skipped_times_run_one_at_a_time_oldest_first_from_the_next_minute() -> None:
    spec, clock = parsed(), FakeClock(STOCKHOLM_JUMP - timedelta(seconds=30))
    assert plan(spec, [], clock()).start is None  # not due yet: the clock has not jumped
    clock.advance(seconds=40)  # 03:00:10 CEST; `*/20 2,3` fires at 03:00 too: its Job first
    waiting = plan(spec, [], clock())
    assert waiting.start is None and waiting.waiting.wall == datetime(2026, 3, 29, 2, 0)
    controller = RunRecord(job="nightly-invoices-29579160", outcome=Outcome.SUCCEEDED, reason="x",
                           slot=slot_of(STOCKHOLM_JUMP), scheduled_at=STOCKHOLM_JUMP,
                           started_at=STOCKHOLM_JUMP, finished_at=clock() + timedelta(seconds=5))
    clock.advance(seconds=20)
    first = plan(spec, [controller], clock())
    assert first.start.wall == datetime(2026, 3, 29, 2, 0) and first.attempt == 1
    assert first.to_status() == {"next": "2026-03-29T02:00", "due": "2026-03-29T01:00:00Z"}
    # While its Job runs (its guard not yet reported: status knows the due minute only).
    going = attempt("2026-03-29T02:00", Outcome.RUNNING, final=False, guard_reported=False)
    assert plan(spec, [controller, going], clock(), busy=True).start is None
    done = [controller, attempt("2026-03-29T02:00")]
    clock.advance(minutes=1)
    second = plan(spec, done, clock())
    assert second.start.wall == datetime(2026, 3, 29, 2, 20)
    done += [attempt("2026-03-29T02:20", Outcome.SKIPPED, reason="slot 1 already ran under x"),
             attempt("2026-03-29T02:40", Outcome.FAILED)]
    settled = plan(spec, done, clock())
    assert settled.start is None and settled.to_status() == {"settledThrough": format_time(STOCKHOLM_JUMP)}
    # Once settled, records that recentRunsLimit dropped do not make it look open again.
    assert plan(spec, [], clock(), previous=settled.to_status()).start is None


def test_an_attempt_turned_away_is_retried_as_a_make_up_run_is() -> None:
    spec = parsed("30 2 * * *")
    ended = STOCKHOLM_JUMP + timedelta(minutes=1)
    held = attempt("2026-03-29T02:30", Outcome.SKIPPED, reason="lease held by y (fence 3)", finished=ended)
    assert plan(spec, [held], ended + timedelta(seconds=RETRY_AFTER_SECONDS - 1)).start is None
    again = plan(spec, [held], ended + timedelta(seconds=RETRY_AFTER_SECONDS))
    assert again.start.wall == datetime(2026, 3, 29, 2, 30) and again.attempt == 2
    # A guard error reports no slot: the attempt is still counted by its Job's name.
    broken = attempt("2026-03-29T02:30", Outcome.GUARD_ERROR, finished=ended, guard_reported=False)
    assert plan(spec, [broken], ended + timedelta(seconds=1)).start is None


def test_suspended_creation_after_the_jump_and_old_jumps_run_nothing() -> None:
    spec = parsed("30 2 * * *")
    after = STOCKHOLM_JUMP + timedelta(minutes=2)
    suspended = plan(spec, [], after, suspended=True)
    assert suspended.start is None and suspended.settled_through == STOCKHOLM_JUMP
    assert plan(spec, [], after, created=STOCKHOLM_JUMP + timedelta(minutes=1)).start is None
    assert plan(spec, [], STOCKHOLM_JUMP + timedelta(days=1, minutes=1)).start is None
    assert plan(spec, [], STOCKHOLM_JUMP + timedelta(hours=23)).start is not None


@pytest.mark.parametrize(("zone", "schedule", "jump", "wall"), [
    ("Australia/Sydney", "30 2 * * *", SYDNEY_JUMP, datetime(2026, 10, 4, 2, 30)),
    ("America/Santiago", "30 0 * * *", SANTIAGO_JUMP, datetime(2026, 9, 6, 0, 30)),
])
def test_southern_spring_nights(zone: str, schedule: str, jump: datetime, wall: datetime) -> None:
    spec = parsed(schedule, zone=zone)
    assert plan(spec, [], jump - timedelta(minutes=1)).start is None
    assert plan(spec, [], jump + timedelta(seconds=30)).start.wall == wall


# --- the Job, the guard and the timer ----------------------------------------------------

def test_the_job_claims_the_key_and_its_guard_reads_the_due_minute() -> None:
    spec = parsed("30 2,3 * * *")
    cronjob = build_cronjob(spec, DEFAULT_SETTINGS)
    cronjob["metadata"]["uid"] = "cj-uid"
    key = skipped_time_slot(datetime(2026, 3, 29, 2, 30))
    job = build_slot_job(cronjob, slot=key, scheduled_at=format_time(STOCKHOLM_JUMP),
                         run_kind=contract.RUN_KIND_SKIPPED_TIME, attempt=1)
    assert job["metadata"]["name"] == f"nightly-invoices-{key}-s1"
    assert contract.attempt_of(job["metadata"]["name"]) == (key, contract.RUN_KIND_SKIPPED_TIME, 1)
    [guard] = [c for c in job["spec"]["template"]["spec"]["initContainers"]
               if c["name"] == contract.GUARD_CONTAINER]
    args = guard["args"]
    assert args[args.index("--slot") + 1] == str(key)
    assert args[args.index("--time-zone") + 1] == "Europe/Stockholm"
    assert args[args.index("--run-kind") + 1] == "skipped-time"
    # Status shows the minute it was due until the guard reports; the pass reads the key.
    record = classify_run(job, [])
    assert record.slot == slot_of(STOCKHOLM_JUMP) and not record.manual
    assert by_skipped_key([record])[0].slot == key

    namespace = argparse.Namespace(time_zone="Europe/Stockholm", repeated_time="Once",
                                   run_kind=contract.RUN_KIND_SKIPPED_TIME)
    context = run_context_of(namespace, key)
    assert claimed_slot_of(namespace, context, key) == key
    fields = context.fields()
    assert fields["run_kind"] == "skipped-time" and fields["manual"] is False
    assert fields["scheduled_time_utc"] == "2026-03-29T01:00:00Z"
    assert fields["scheduled_time"] == "2026-03-29T03:00:00+02:00"


@pytest.mark.parametrize(("slot", "zone", "message"), [
    (skipped_time_slot(datetime(2026, 3, 29, 3, 30)), "Europe/Stockholm", "does not skip"),
    (slot_of(STOCKHOLM_JUMP), "Europe/Stockholm", "is not a skipped wall time's slot"),
    (skipped_time_slot(datetime(2026, 3, 29, 2, 30)), None, "needs --time-zone"),
])
def test_the_guard_refuses_a_key_that_names_no_skipped_time(slot: int, zone: str | None,
                                                            message: str) -> None:
    namespace = argparse.Namespace(time_zone=zone, repeated_time="Twice",
                                   run_kind=contract.RUN_KIND_SKIPPED_TIME)
    with pytest.raises(BadInput, match=message):
        run_context_of(namespace, slot)


def test_only_the_policy_that_runs_skipped_times_gets_the_timer_and_the_time_zone() -> None:
    assert wants_timer(spec={"dstPolicy": {"skippedTime": "RunAtNextMinute"}}, annotations={})
    assert not wants_timer(spec={"dstPolicy": {"skippedTime": "Skip"}}, annotations={})
    assert not wants_timer(spec={"dstPolicy": {"repeatedTime": "Once"}}, annotations={})
    plain = build_cronjob(parsed(policy=None), DEFAULT_SETTINGS)
    [guard] = [c for c in plain["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
               if c["name"] == contract.GUARD_CONTAINER]
    assert "--time-zone" not in guard["args"]


def test_status_skipped_time_is_written_and_cleared_by_the_pass() -> None:
    written = {"skippedTime": {"settledThrough": format_time(STOCKHOLM_JUMP)}}
    assert status_changed({}, written)
    assert status_patch({}, written) == written
    assert status_patch(written, {}) == {"skippedTime": None}  # the policy was switched off
