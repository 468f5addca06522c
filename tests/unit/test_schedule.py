"""Cron maths: parsing, next/previous fire times, daylight-saving changes, refusals.

Expected times are written by hand from the calendar and from the behaviour of
robfig/cron v3 (the library the Kubernetes CronJob controller runs), whose own tests
pin the daylight-saving cases: a skipped wall time never fires, a repeated one fires
twice. The brute-force test at the end checks the jumping search against a plain
minute-by-minute scan around real clock changes.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from guardedcron.schedule import MACROS, Schedule, ScheduleError, load_time_zone

STOCKHOLM = "Europe/Stockholm"  # 2024: 02:00 -> 03:00 on 31 March, 03:00 -> 02:00 on 27 October
NEW_YORK = "America/New_York"  # 2024: 02:00 -> 03:00 on 10 March, 02:00 -> 01:00 on 3 November
SAO_PAULO = "America/Sao_Paulo"  # 2018: 00:00 -> 01:00 on 4 November (midnight does not exist)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


NEXT = [
    # schedule, zone, after, expected first fire time strictly after it
    ("*/5 * * * *", "UTC", "2024-01-01T10:02:30+00:00", "2024-01-01T10:05:00+00:00"),
    ("*/5 * * * *", "UTC", "2024-01-01T10:05:00+00:00", "2024-01-01T10:10:00+00:00"),
    ("0/15 * * * *", "UTC", "2012-07-09T14:59:59+00:00", "2012-07-09T15:00:00+00:00"),
    ("5/15 * * * *", "UTC", "2012-07-09T15:06:00+00:00", "2012-07-09T15:20:00+00:00"),
    ("20-35/15 * * * *", "UTC", "2012-07-09T15:45:00+00:00", "2012-07-09T16:20:00+00:00"),
    ("1-30/2 * * * *", "UTC", "2024-05-01T10:29:00+00:00", "2024-05-01T11:01:00+00:00"),
    ("*/61 * * * *", "UTC", "2024-05-01T10:00:00+00:00", "2024-05-01T11:00:00+00:00"),
    ("0,30 9-17 * * *", "UTC", "2024-05-01T17:30:00+00:00", "2024-05-02T09:00:00+00:00"),
    ("* * * * *", "UTC", "2012-12-31T23:59:45+00:00", "2013-01-01T00:00:00+00:00"),
    ("? ? ? ? ?", "UTC", "2024-05-01T10:00:00+00:00", "2024-05-01T10:01:00+00:00"),
    # names, any case
    ("0 0 * * MON-FRI", "UTC", "2024-03-08T00:00:00+00:00", "2024-03-11T00:00:00+00:00"),
    ("0 0 1 jan,Jul *", "UTC", "2024-02-01T00:00:00+00:00", "2024-07-01T00:00:00+00:00"),
    ("0 12 * JUN-AUG *", "UTC", "2024-09-01T00:00:00+00:00", "2025-06-01T12:00:00+00:00"),
    ("30 8 ? JUL SUN", "UTC", "2012-07-09T00:00:00+00:00", "2012-07-15T08:30:00+00:00"),
    # day-of-month and day-of-week both restricted: either may match (OR)
    ("0 0 1,15 * SUN", "UTC", "2012-07-02T00:00:00+00:00", "2012-07-08T00:00:00+00:00"),
    ("0 0 1,15 * SUN", "UTC", "2012-07-29T00:00:00+00:00", "2012-08-01T00:00:00+00:00"),
    ("0 0 13 * FRI", "UTC", "2024-09-01T00:00:00+00:00", "2024-09-06T00:00:00+00:00"),
    # a stepped star is a restriction (robfig #70): */10 is days 1, 11, 21, 31 -> OR
    ("0 0 */10 * SUN", "UTC", "2012-07-09T00:00:00+00:00", "2012-07-11T00:00:00+00:00"),
    ("0 0 */10 * SUN", "UTC", "2012-07-11T00:00:00+00:00", "2012-07-15T00:00:00+00:00"),
    # an unrestricted day field (*, ?, */1) makes it AND
    ("0 0 * * MON", "UTC", "2012-07-15T00:00:00+00:00", "2012-07-16T00:00:00+00:00"),
    ("0 0 1,15 * *", "UTC", "2012-07-02T00:00:00+00:00", "2012-07-15T00:00:00+00:00"),
    ("0 0 1,15 * ?", "UTC", "2012-07-02T00:00:00+00:00", "2012-07-15T00:00:00+00:00"),
    ("0 0 */1 * SUN", "UTC", "2012-07-09T00:00:00+00:00", "2012-07-15T00:00:00+00:00"),
    ("0 0 ? * 1-5", "UTC", "2024-03-09T00:00:00+00:00", "2024-03-11T00:00:00+00:00"),
    # macros
    ("@hourly", "UTC", "2024-05-01T10:30:00+00:00", "2024-05-01T11:00:00+00:00"),
    ("@daily", "UTC", "2024-05-01T10:30:00+00:00", "2024-05-02T00:00:00+00:00"),
    ("@midnight", "UTC", "2024-05-01T00:00:00+00:00", "2024-05-02T00:00:00+00:00"),
    ("@weekly", "UTC", "2024-01-03T12:00:00+00:00", "2024-01-07T00:00:00+00:00"),
    ("@monthly", "UTC", "2024-01-15T00:00:00+00:00", "2024-02-01T00:00:00+00:00"),
    ("@yearly", "UTC", "2024-06-01T00:00:00+00:00", "2025-01-01T00:00:00+00:00"),
    ("@annually", "UTC", "2024-01-01T00:00:00+00:00", "2025-01-01T00:00:00+00:00"),
    ("@daily", STOCKHOLM, "2024-05-01T12:00:00+02:00", "2024-05-02T00:00:00+02:00"),
    # leap years (2100 is not one)
    ("0 0 29 2 *", "UTC", "2012-07-09T23:35:00+00:00", "2016-02-29T00:00:00+00:00"),
    ("0 0 29 2 *", "UTC", "2095-01-01T00:00:00+00:00", "2096-02-29T00:00:00+00:00"),
    ("0 0 29 FEB MON", "UTC", "2024-02-01T00:00:00+00:00", "2024-02-05T00:00:00+00:00"),
    # Europe/Stockholm, spring forward: 02:xx does not exist on 31 March 2024
    ("30 2 * * *", STOCKHOLM, "2024-03-30T02:30:00+01:00", "2024-04-01T02:30:00+02:00"),
    ("0 * * * *", STOCKHOLM, "2024-03-31T01:00:00+01:00", "2024-03-31T03:00:00+02:00"),
    ("*/20 * * * *", STOCKHOLM, "2024-03-31T01:40:00+01:00", "2024-03-31T03:00:00+02:00"),
    ("30 3 * * *", STOCKHOLM, "2024-03-31T00:00:00+01:00", "2024-03-31T03:30:00+02:00"),
    ("30 2 31 3 *", STOCKHOLM, "2024-03-01T00:00:00+01:00", "2025-03-31T02:30:00+02:00"),
    # Europe/Stockholm, fall back: 02:xx happens twice on 27 October 2024, and fires twice
    ("30 2 * * *", STOCKHOLM, "2024-10-27T00:00:00+02:00", "2024-10-27T02:30:00+02:00"),
    ("30 2 * * *", STOCKHOLM, "2024-10-27T02:30:00+02:00", "2024-10-27T02:30:00+01:00"),
    ("30 2 * * *", STOCKHOLM, "2024-10-27T02:45:00+02:00", "2024-10-27T02:30:00+01:00"),
    ("30 2 * * *", STOCKHOLM, "2024-10-27T02:30:00+01:00", "2024-10-28T02:30:00+01:00"),
    ("0 3 * * *", STOCKHOLM, "2024-10-27T00:00:00+02:00", "2024-10-27T03:00:00+01:00"),
    ("0 * * * *", STOCKHOLM, "2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00"),
    ("0 * * * *", STOCKHOLM, "2024-10-27T02:00:00+01:00", "2024-10-27T03:00:00+01:00"),
    # America/New_York, the dates of robfig's own daylight-saving tests moved to 2024
    ("0 2 * * *", NEW_YORK, "2024-03-10T00:00:00-05:00", "2024-03-11T02:00:00-04:00"),
    ("0 1 * * *", NEW_YORK, "2024-03-10T01:00:00-05:00", "2024-03-11T01:00:00-04:00"),
    ("0 * * * *", NEW_YORK, "2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00"),
    ("0 1 * * *", NEW_YORK, "2024-11-03T00:00:00-04:00", "2024-11-03T01:00:00-04:00"),
    ("0 1 * * *", NEW_YORK, "2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00"),
    ("0 1 * * *", NEW_YORK, "2024-11-03T01:00:00-05:00", "2024-11-04T01:00:00-05:00"),
    ("30 1 3 11 *", NEW_YORK, "2024-11-03T01:45:00-04:00", "2024-11-03T01:30:00-05:00"),
    ("0 2 * * *", NEW_YORK, "2024-11-03T00:00:00-04:00", "2024-11-03T02:00:00-05:00"),
    ("0 3 3 * *", NEW_YORK, "2012-11-04T00:00:00-04:00", "2012-12-03T03:00:00-05:00"),
    # America/Sao_Paulo: midnight itself is skipped when the clock jumps at 00:00
    ("0 0 * * *", SAO_PAULO, "2018-11-03T00:00:00-03:00", "2018-11-05T00:00:00-02:00"),
    ("0 * 4 11 *", SAO_PAULO, "2018-11-03T12:00:00-03:00", "2018-11-04T01:00:00-02:00"),
    ("0 9 10 * *", SAO_PAULO, "2018-10-17T05:00:00-04:00", "2018-11-10T09:00:00-02:00"),
]


@pytest.mark.parametrize(("text", "zone", "after", "expected"), NEXT)
def test_next_after(text: str, zone: str, after: str, expected: str) -> None:
    result = Schedule.parse(text).next_after(at(after), ZoneInfo(zone))
    assert result == at(expected)
    assert result is not None
    assert result.tzinfo is UTC


NEVER = ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 APR ?", "0 0 30,31 FEB *"]


@pytest.mark.parametrize("text", NEVER)
def test_schedules_that_never_fire_give_none_quickly(text: str) -> None:
    schedule = Schedule.parse(text)
    started = time.perf_counter()
    assert schedule.next_after(at("2024-01-01T00:00:00+00:00"), ZoneInfo(STOCKHOLM)) is None
    assert schedule.previous_at_or_before(at("2024-01-01T00:00:00+00:00"), UTC) is None
    # A minute-by-minute scan over five years takes many seconds; jumping takes milliseconds.
    assert time.perf_counter() - started < 1.0


def test_search_gives_up_after_five_years_like_robfig() -> None:
    # After 2096 the next 29 February is in 2104 (2100 is not a leap year): beyond 5 years.
    assert Schedule.parse("0 0 29 2 *").next_after(at("2097-01-01T00:00:00+00:00"), UTC) is None


def test_a_yearly_schedule_is_fast() -> None:
    schedule = Schedule.parse("@yearly")
    tz = ZoneInfo(NEW_YORK)
    started = time.perf_counter()
    fires = list(schedule.iter_between(at("2000-01-01T00:00:00+00:00"),
                                       at("2100-01-01T00:00:00+00:00"), tz))
    assert len(fires) == 100
    assert fires[0] == at("2000-01-01T00:00:00-05:00")
    assert time.perf_counter() - started < 1.0


PREVIOUS = [
    # schedule, zone, at or before, expected last fire time at or before it
    ("*/5 * * * *", "UTC", "2024-01-01T10:05:00+00:00", "2024-01-01T10:05:00+00:00"),
    ("*/5 * * * *", "UTC", "2024-01-01T10:04:59+00:00", "2024-01-01T10:00:00+00:00"),
    ("0 0 1,15 * SUN", "UTC", "2012-07-31T12:00:00+00:00", "2012-07-29T00:00:00+00:00"),
    ("@yearly", "UTC", "2024-06-01T00:00:00+00:00", "2024-01-01T00:00:00+00:00"),
    ("0 0 29 2 *", "UTC", "2015-12-31T00:00:00+00:00", "2012-02-29T00:00:00+00:00"),
    ("30 2 * * *", STOCKHOLM, "2024-04-01T00:00:00+02:00", "2024-03-30T02:30:00+01:00"),
    ("30 2 * * *", STOCKHOLM, "2024-10-27T02:45:00+01:00", "2024-10-27T02:30:00+01:00"),
    ("30 2 * * *", STOCKHOLM, "2024-10-27T02:10:00+01:00", "2024-10-27T02:30:00+02:00"),
    ("30 2 * * *", STOCKHOLM, "2024-10-27T02:29:00+02:00", "2024-10-26T02:30:00+02:00"),
    ("0 1 * * *", NEW_YORK, "2024-11-03T01:59:00-05:00", "2024-11-03T01:00:00-05:00"),
    ("0 1 * * *", NEW_YORK, "2024-11-03T00:59:00-05:00", "2024-11-03T01:00:00-04:00"),
    ("0 2 * * *", NEW_YORK, "2024-03-11T01:00:00-04:00", "2024-03-09T02:00:00-05:00"),
]


@pytest.mark.parametrize(("text", "zone", "before", "expected"), PREVIOUS)
def test_previous_at_or_before(text: str, zone: str, before: str, expected: str) -> None:
    result = Schedule.parse(text).previous_at_or_before(at(before), ZoneInfo(zone))
    assert result == at(expected)


@pytest.mark.parametrize(("text", "zone", "day", "count"), [
    ("0 * * * *", STOCKHOLM, "2024-10-27", 25),  # the day with 25 hours
    ("0 * * * *", STOCKHOLM, "2024-03-31", 23),  # the day with 23 hours
    ("*/15 * * * *", NEW_YORK, "2024-11-03", 100),
    ("*/15 * * * *", NEW_YORK, "2024-03-10", 92),
    ("30 2 * * *", STOCKHOLM, "2024-10-27", 2),
    ("30 2 * * *", STOCKHOLM, "2024-03-31", 0),
])
def test_fire_count_over_a_local_day(text: str, zone: str, day: str, count: int) -> None:
    tz = ZoneInfo(zone)
    start = datetime.fromisoformat(day).replace(tzinfo=tz)
    end = start + timedelta(days=1)  # wall-clock arithmetic: the next local midnight
    # (start - 1 minute, end - 1 minute]: exactly the minutes of that local day
    fires = list(Schedule.parse(text).iter_between(start - timedelta(minutes=1),
                                                   end - timedelta(minutes=1), tz))
    assert len(fires) == count
    assert fires == sorted(set(fires))


def test_iter_between_is_half_open() -> None:
    schedule = Schedule.parse("0 * * * *")
    fires = list(schedule.iter_between(at("2024-01-01T10:00:00+00:00"),
                                       at("2024-01-01T12:00:00+00:00"), UTC))
    assert fires == [at("2024-01-01T11:00:00+00:00"), at("2024-01-01T12:00:00+00:00")]


def test_a_month_of_a_nightly_job_across_fall_back() -> None:
    fires = list(Schedule.parse("30 2 * * *").iter_between(
        at("2024-10-01T00:00:00+02:00"), at("2024-11-01T00:00:00+01:00"), ZoneInfo(STOCKHOLM)))
    assert len(fires) == 32  # 31 nights, one of them twice


def test_fires_at() -> None:
    schedule = Schedule.parse("30 2 * * *")
    tz = ZoneInfo(STOCKHOLM)
    assert schedule.fires_at(at("2024-10-27T02:30:00+01:00"), tz)
    assert schedule.fires_at(at("2024-10-27T01:30:00+00:00"), tz)
    assert not schedule.fires_at(at("2024-10-27T02:30:01+01:00"), tz)
    assert not schedule.fires_at(at("2024-10-27T03:30:00+01:00"), tz)


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        Schedule.parse("@daily").next_after(datetime(2024, 1, 1), UTC)


def test_macros_equal_their_expansions() -> None:
    for macro, fields in MACROS.items():
        parsed, expanded = Schedule.parse(macro), Schedule.parse(fields)
        assert (parsed.minutes, parsed.hours, parsed.days_of_month, parsed.months,
                parsed.days_of_week, parsed.days_either) == (
            expanded.minutes, expanded.hours, expanded.days_of_month, expanded.months,
            expanded.days_of_week, expanded.days_either)
        assert parsed.text == macro


REJECTED = [
    # text, field at fault (None: the whole expression), words the message must contain
    ("", None, "schedule is empty"),
    ("   ", None, "schedule is empty"),
    ("0 0 * *", None, "schedule has 4 fields; expected 5: minute hour day-of-month month"),
    ("0 0 0 * * *", None, "has 6 fields (there is no seconds field)"),
    ("daily", None, "schedule has 1 field; expected 5"),
    ("61 * * * *", "minute", "minute field: '61' is out of range 0-59"),
    ("* 24 * * *", "hour", "hour field: '24' is out of range 0-23"),
    ("* * 0 * *", "day-of-month", "day-of-month field: '0' is out of range 1-31"),
    ("* * 32 * *", "day-of-month", "day-of-month field: '32' is out of range 1-31"),
    ("* * * 13 *", "month", "month field: '13' is out of range 1-12"),
    ("* * * * 7", "day-of-week", "'7' is out of range 0-6 (Kubernetes' cron parser has no 7"),
    ("0 0 * * 5-7", "day-of-week", "'7' is out of range 0-6"),
    ("*/0 * * * *", "minute", "step in '*/0' must be a positive number"),
    ("*/x * * * *", "minute", "step 'x' in '*/x' is not a number"),
    ("5-3 * * * *", "minute", "range '5-3' runs backwards; ranges do not wrap around"),
    ("0 22-2 * * *", "hour", "write it as a list: '22-23,0-2'"),
    ("1,,2 * * * *", "minute", "empty list item in '1,,2'"),
    ("0 0 * * 1,", "day-of-week", "empty list item"),
    ("* * * FOO *", "month", "'FOO' is not a number or a month name (JAN-DEC)"),
    ("* * * * MONDAY", "day-of-week", "'MONDAY' is not a number or a weekday name (SUN-SAT)"),
    ("* * * JAN-MON *", "month", "'MON' is not a number or a month name"),
    ("0 0 1 * JAN", "day-of-week", "'JAN' is not a number or a weekday name"),
    ("1/2/3 * * * *", "minute", "'1/2/3' has more than one '/'"),
    ("1-2-3 * * * *", "minute", "'1-2-3' has more than one '-'"),
    ("*-5 * * * *", "minute", "'*-5': a range cannot start with '*'"),
    ("-5 * * * *", "minute", "'-5' is missing a value"),
    ("5- * * * *", "minute", "'5-' is missing a value"),
    ("+5 * * * *", "minute", "'+5' is not a number"),
    ("\u0661 * * * *", "minute", "is not a number"),  # an Arabic-Indic digit one
    ("TZ=UTC 0 0 * * *", None, "must not carry TZ= or CRON_TZ="),
    ("CRON_TZ=Europe/Stockholm 30 2 * * *", None, "set spec.timeZone instead"),
    ("@every 1h", None, "@every is not supported"),
    ("@every 30s", None, "write the interval as 5 fields"),
    ("@fortnightly", None, "unknown macro '@fortnightly'; use one of @yearly, @annually"),
    ("@Daily", None, "unknown macro '@Daily'"),
    ("@daily ", None, "unknown macro '@daily '"),
]


@pytest.mark.parametrize(("text", "field", "words"), REJECTED)
def test_rejected(text: str, field: str | None, words: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule.parse(text)
    assert words in str(caught.value)
    assert caught.value.field == field
    assert isinstance(caught.value, ValueError)


def test_the_token_at_fault_is_named() -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule.parse("0,61 * * * *")
    assert caught.value.token == "61"
    with pytest.raises(ScheduleError) as caught:
        Schedule.parse("TZ=UTC 0 0 * * *")
    assert caught.value.token == "TZ=UTC"


@pytest.mark.parametrize("name", ["Europe/Stockholm", "America/New_York", "UTC", "Etc/GMT+5",
                                  "America/Argentina/Buenos_Aires"])
def test_known_time_zones_load(name: str) -> None:
    assert load_time_zone(name).key == name


@pytest.mark.parametrize(("name", "words"), [
    ("", "time zone name is empty"),
    ("Local", "time zone 'Local' is refused"),
    ("local", "time zone 'local' is refused"),
    ("Europe/Stockholmm", "unknown time zone 'Europe/Stockholmm'"),
    ("Nowhere/Atlantis", "unknown time zone 'Nowhere/Atlantis'"),
    ("../etc/passwd", "is not a valid IANA name"),
    ("/Europe/Stockholm", "is not a valid IANA name"),
    ("Europe//Stockholm", "is not a valid IANA name"),
    ("Europe/Stockholm ", "is not a valid IANA name"),
    ("America/Argentina_Buenos_Aires_Long", "is not a valid IANA name"),
])
def test_bad_time_zones(name: str, words: str) -> None:
    with pytest.raises(ScheduleError, match=words.replace("(", r"\(")):
        load_time_zone(name)


# --- the jumping search against a minute-by-minute scan around real clock changes

_BRUTE_ZONES = ["Europe/Stockholm", "America/New_York", "America/Sao_Paulo",
                "Australia/Lord_Howe", "Antarctica/Troll", "America/Santiago"]


def _clock_changes(tz: ZoneInfo, year: int) -> list[datetime]:
    changes, u = [], datetime(year, 1, 1, tzinfo=UTC)
    offset = u.astimezone(tz).utcoffset()
    while u.year == year:
        u += timedelta(hours=1)
        if u.astimezone(tz).utcoffset() != offset:
            changes.append(u)
            offset = u.astimezone(tz).utcoffset()
    return changes


def _random_field(rng: random.Random, low: int, high: int) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return "*"
    if kind == 1:
        return f"*/{rng.randint(2, 7)}"
    first = rng.randint(low, high)
    if kind == 2:
        return ",".join(str(v) for v in sorted({first, rng.randint(low, high)}))
    return f"{first}-{rng.randint(first, high)}"


def _scan(schedule: Schedule, start: datetime, tz: ZoneInfo, step: timedelta) -> datetime | None:
    u = start
    for _ in range(3 * 24 * 60):
        if schedule.wall_matches(u.astimezone(tz)):
            return u
        u += step
    return None


def test_search_agrees_with_a_minute_by_minute_scan_around_clock_changes() -> None:
    rng = random.Random(20240331)
    minute = timedelta(minutes=1)
    for zone in _BRUTE_ZONES:
        tz = ZoneInfo(zone)
        for change in _clock_changes(tz, 2024):
            for _ in range(12):
                schedule = Schedule.parse(" ".join([
                    _random_field(rng, 0, 59), _random_field(rng, 0, 5), "*", "*",
                    rng.choice(["*", "*", "0-5"]),
                ]))
                t = change + timedelta(minutes=rng.randint(-240, 240))
                expected_next = _scan(schedule, t + minute, tz, minute)
                expected_previous = _scan(schedule, t, tz, -minute)
                context = f"{schedule.text!r} in {zone} around {t.isoformat()}"
                if expected_next is not None:
                    assert schedule.next_after(t, tz) == expected_next, context
                if expected_previous is not None:
                    assert schedule.previous_at_or_before(t, tz) == expected_previous, context
