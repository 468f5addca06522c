"""Daylight-saving policy: which slot a run claims, and the runs a skipped time moves to (pure).

The CronJob controller reads the schedule on the wall clock (see `search`): a wall time
the clock shows twice fires twice, one slot per instant, and a wall time the clock skips
does not fire. spec.dstPolicy changes both, with slot claims doing the work:

- `repeatedTime: Once`: every run claims the slot of the *first* instant that shows its
  wall-clock minute (`wall_clock_slot`). The second 02:30 of an autumn night claims the
  slot the first one already claimed, in whichever cluster it runs, and is skipped.
- `skippedTime: RunAtNextMinute`: a matching wall time inside a spring-forward gap runs
  at the first minute after the jump (`skipped_time_runs`), once per jump, with that
  minute's slot; if the schedule fires at that minute anyway, that run is the one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING

from guardedcron.schedule.search import MINUTE, floor_minute, require_aware

if TYPE_CHECKING:
    from guardedcron.schedule.expression import Schedule

# Offsets are compared this far apart: shorter than any two clock changes of one zone.
_PROBE_STEP = timedelta(hours=6)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def slot_time(slot: int) -> datetime:
    """The instant of a slot (a minute since the Unix epoch), in UTC."""
    return _EPOCH + slot * MINUTE


def slot_of(t: datetime) -> int:
    """The slot (minute since the Unix epoch) of the minute holding `t`."""
    require_aware(t)
    return (floor_minute(t) - _EPOCH) // MINUTE


def wall_clock_slot(slot: int, zone: tzinfo) -> int:
    """The slot a `repeatedTime: Once` run claims: the first instant whose wall clock in
    `zone` reads what it reads at `slot`. The same slot for every minute but those the
    clock shows a second time, which get the slot of their first showing."""
    wall = slot_time(slot).astimezone(zone).replace(tzinfo=None)
    return slot_of(wall.replace(tzinfo=zone, fold=0))


def skipped_time_runs(schedule: Schedule, zone: tzinfo, start: datetime, end: datetime
                      ) -> Iterator[datetime]:
    """For `skippedTime: RunAtNextMinute`: the instants in (start, end], in UTC and in
    order, at which the clock jumped forward over a wall time the schedule matches and the
    schedule does not fire anyway. Each is the first minute after its jump."""
    require_aware(start)
    require_aware(end)
    for jump in _jumps_forward(zone, start, end):
        if schedule.fires_at(jump, zone):
            continue  # the CronJob runs at that minute already
        if any(schedule.wall_matches(wall) for wall in _skipped_walls(jump, zone)):
            yield jump


def _jumps_forward(zone: tzinfo, start: datetime, end: datetime) -> Iterator[datetime]:
    """Instants in (start, end] at which the offset grows (the clock is set forward)."""
    low = floor_minute(start)
    end = floor_minute(end)
    while low < end:
        high = min(low + _PROBE_STEP, end)
        if _offset(high, zone) > _offset(low, zone):
            yield _first_with_offset_of(high, low, zone)
        low = high


def _first_with_offset_of(high: datetime, low: datetime, zone: tzinfo) -> datetime:
    target = _offset(high, zone)
    while high - low > MINUTE:  # offset(low) < target == offset(high)
        middle = floor_minute(low + (high - low) / 2)
        if middle <= low:
            middle = low + MINUTE
        if _offset(middle, zone) == target:
            high = middle
        else:
            low = middle
    return high


def _skipped_walls(jump: datetime, zone: tzinfo) -> Iterator[datetime]:
    """The wall-clock minutes (naive) the clock never showed at `jump`."""
    before = (jump - MINUTE).astimezone(zone).replace(tzinfo=None)
    after = jump.astimezone(zone).replace(tzinfo=None)
    wall = before + MINUTE
    while wall < after:
        yield wall
        wall += MINUTE


def _offset(t: datetime, zone: tzinfo) -> timedelta:
    offset = t.astimezone(zone).utcoffset()
    assert offset is not None  # an aware datetime converted to a tzinfo always has one
    return offset
