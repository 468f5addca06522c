"""Fire times: which instants a schedule fires at in a time zone, found by jumping.

The rule, the same as robfig/cron v3 (the Kubernetes CronJob controller): an instant
on a whole minute fires when its wall-clock reading in the zone matches the schedule.
robfig gets there by stepping through absolute time and reading the local fields at
each step, so at daylight-saving changes:

- a wall time the clock skips (spring forward) never fires: `30 2 * * *` does not run
  on that day in Europe/Stockholm;
- a wall time the clock shows twice (fall back) fires twice, an hour apart: robfig's
  own tests call this "1am nightly job (runs twice)". The two runs are two slots (the
  CronJob controller names Jobs after the minute since the epoch), so guardedcron
  guards each of them; it does not merge them.

We search in absolute time too, but jump over whole months, days, hours and minutes
that cannot match instead of stepping. A jump is to the first instant whose wall clock
reaches the next candidate wall time. The one place a jump could pass a match is a
fall-back just ahead, where the clock replays wall times already behind us; the search
stops at the fall-back instant and carries on from there. Backwards, the same.
"""

from __future__ import annotations

import bisect
import calendar
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from guardedcron.schedule.expression import Schedule

MINUTE = timedelta(minutes=1)
# robfig gives up after 5 years of wall-clock time; so do we ("0 0 30 2 *" never fires).
YEARS_TO_SEARCH = 5
# Longer than any clock change a zone has made since 1970 (the largest are 3 hours).
_CLOCK_CHANGE_HORIZON = timedelta(hours=6)


def require_aware(t: datetime) -> None:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{t.isoformat()} is a naive datetime; pass an aware one")


def floor_minute(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(second=0, microsecond=0)


def next_after(schedule: Schedule, t: datetime, tz: tzinfo) -> datetime | None:
    require_aware(t)
    u = floor_minute(t) + MINUTE
    last_year = _wall(u, tz).year + YEARS_TO_SEARCH
    while True:
        wall = _wall(u, tz)
        if wall.year > last_year:
            return None
        target = _next_candidate(schedule, wall)
        if target is None:
            return u
        reached = _first_instant_at_or_past(target, tz, after=u)
        u = _clock_goes_back_between(u, reached, tz) or reached


def previous_at_or_before(schedule: Schedule, t: datetime, tz: tzinfo) -> datetime | None:
    require_aware(t)
    u = floor_minute(t)
    first_year = _wall(u, tz).year - YEARS_TO_SEARCH
    while True:
        wall = _wall(u, tz)
        if wall.year < first_year:
            return None
        target = _previous_candidate(schedule, wall)
        if target is None:
            return u
        reached = _last_instant_at_or_before(target, tz, before=u)
        went_back = _clock_went_back_between(reached, u, tz)
        u = went_back - MINUTE if went_back is not None else reached


# --- candidate wall times (naive, pure calendar arithmetic)

def _next_candidate(schedule: Schedule, wall: datetime) -> datetime | None:
    """The earliest wall time after `wall` that may match, or None if `wall` matches.

    Every wall time from `wall` up to (not including) the answer fails to match.
    """
    if wall.month not in schedule.months:
        return _start_of_next_month(schedule, wall.year, wall.month)
    if not schedule.day_matches(wall.date()):
        day = _next_day_in_month(schedule, wall.date())
        if day is None:
            return _start_of_next_month(schedule, wall.year, wall.month)
        return datetime.combine(day, time())
    if wall.hour not in schedule.hours:
        hour = _following(schedule.hours, wall.hour)
        if hour is None:
            return datetime.combine(wall.date() + timedelta(days=1), time())
        return datetime.combine(wall.date(), time(hour))
    if wall.minute not in schedule.minutes:
        minute = _following(schedule.minutes, wall.minute)
        if minute is None:
            return wall.replace(minute=0) + timedelta(hours=1)
        return wall.replace(minute=minute)
    return None


def _previous_candidate(schedule: Schedule, wall: datetime) -> datetime | None:
    """The latest wall time before `wall` that may match, or None if `wall` matches."""
    if wall.month not in schedule.months:
        return _end_of_previous_month(schedule, wall.year, wall.month)
    if not schedule.day_matches(wall.date()):
        day = _previous_day_in_month(schedule, wall.date())
        if day is None:
            return datetime.combine(wall.date().replace(day=1), time()) - MINUTE
        return datetime.combine(day, time(23, 59))
    if wall.hour not in schedule.hours:
        hour = _preceding(schedule.hours, wall.hour)
        if hour is None:
            return datetime.combine(wall.date(), time()) - MINUTE
        return datetime.combine(wall.date(), time(hour, 59))
    if wall.minute not in schedule.minutes:
        minute = _preceding(schedule.minutes, wall.minute)
        if minute is None:
            return wall.replace(minute=0) - MINUTE
        return wall.replace(minute=minute)
    return None


def _following(values: tuple[int, ...], current: int) -> int | None:
    index = bisect.bisect_right(values, current)
    return values[index] if index < len(values) else None


def _preceding(values: tuple[int, ...], current: int) -> int | None:
    index = bisect.bisect_left(values, current)
    return values[index - 1] if index > 0 else None


def _start_of_next_month(schedule: Schedule, year: int, month: int) -> datetime:
    following = _following(schedule.months, month)
    if following is None:
        return datetime(year + 1, schedule.months[0], 1)
    return datetime(year, following, 1)


def _end_of_previous_month(schedule: Schedule, year: int, month: int) -> datetime:
    preceding = _preceding(schedule.months, month)
    if preceding is None:
        year, preceding = year - 1, schedule.months[-1]
    return datetime(year, preceding, calendar.monthrange(year, preceding)[1], 23, 59)


def _next_day_in_month(schedule: Schedule, day: date) -> date | None:
    last = calendar.monthrange(day.year, day.month)[1]
    for number in range(day.day + 1, last + 1):
        candidate = day.replace(day=number)
        if schedule.day_matches(candidate):
            return candidate
    return None


def _previous_day_in_month(schedule: Schedule, day: date) -> date | None:
    for number in range(day.day - 1, 0, -1):
        candidate = day.replace(day=number)
        if schedule.day_matches(candidate):
            return candidate
    return None


# --- from wall times to instants (the only place time zones matter)

def _wall(u: datetime, tz: tzinfo) -> datetime:
    return u.astimezone(tz).replace(tzinfo=None)


def _instants(wall: datetime, tz: tzinfo) -> tuple[datetime, datetime, bool]:
    """The instants for `wall` read with the earlier and the later offset (PEP 495 fold),
    and whether the wall time exists at all (it does not in a spring-forward gap)."""
    earlier = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    later = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    return earlier, later, _wall(earlier, tz) == wall


def _first_instant_at_or_past(wall: datetime, tz: tzinfo, *, after: datetime) -> datetime:
    """The first instant after `after` whose wall clock reads `wall` or later."""
    earlier, later, exists = _instants(wall, tz)
    if exists:
        for instant in (earlier, later):
            if instant > after:
                return instant
        return after + MINUTE  # not reached: `wall` is ahead of the clock at `after`
    # In a gap the two readings straddle the jump: fold=1 lands before it, fold=0 after.
    return _first_true(lambda x: _wall(x, tz) >= wall, max(later, after), earlier)


def _last_instant_at_or_before(wall: datetime, tz: tzinfo, *, before: datetime) -> datetime:
    """The last instant before `before` whose wall clock reads `wall` or earlier."""
    earlier, later, exists = _instants(wall, tz)
    if exists:
        for instant in (later, earlier):
            if instant < before:
                return instant
        return before - MINUTE  # not reached: `wall` is behind the clock at `before`
    jump = _first_true(lambda x: _wall(x, tz) > wall, later, min(earlier, before))
    return jump - MINUTE


def _clock_goes_back_between(start: datetime, end: datetime, tz: tzinfo) -> datetime | None:
    """The instant in (start, end] at which the clock is set back, if it is near `start`."""
    end = min(end, start + _CLOCK_CHANGE_HORIZON)
    offset = _offset(start, tz)
    if _offset(end, tz) >= offset:
        return None
    return _first_true(lambda x: _offset(x, tz) < offset, start, end)


def _clock_went_back_between(start: datetime, end: datetime, tz: tzinfo) -> datetime | None:
    """The instant in (start, end] at which the clock was set back, if it is near `end`."""
    start = max(start, end - _CLOCK_CHANGE_HORIZON)
    offset = _offset(end, tz)
    if _offset(start, tz) <= offset:
        return None
    return _first_true(lambda x: _offset(x, tz) <= offset, start, end)


def _offset(u: datetime, tz: tzinfo) -> timedelta:
    offset = u.astimezone(tz).utcoffset()
    assert offset is not None  # an aware datetime converted to a tzinfo always has one
    return offset


def _first_true(predicate: Callable[[datetime], bool], low: datetime, high: datetime) -> datetime:
    """Binary search over whole minutes: `predicate` is false at `low`, true at `high`."""
    while high - low > MINUTE:
        middle = low + (high - low) // 2
        middle = middle.replace(second=0, microsecond=0)
        if middle <= low:
            middle = low + MINUTE
        if predicate(middle):
            high = middle
        else:
            low = middle
    return high
