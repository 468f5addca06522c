"""Daylight-saving policy: which slot a run claims (pure).

The CronJob controller reads the schedule on the wall clock (see `search`): a wall time
the clock shows twice fires twice, one slot per instant. With spec.dstPolicy
`repeatedTime: Once` every run claims the slot of the *first* instant that shows its
wall-clock minute (`wall_clock_slot`): the second 02:30 of an autumn night claims the
slot the first one already claimed, in whichever cluster it runs, and is skipped.

A wall time the clock *skips* (spring forward) never fires in the controller. With
`skippedTime: RunAtNextMinute` the operator starts its run at the first minute after the
jump (`skipped_times`), claiming a key of its own (`skipped_time_slot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING

from guardedcron.schedule.search import MINUTE, floor_minute, require_aware

if TYPE_CHECKING:
    from guardedcron.schedule.expression import Schedule

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


# --- wall times the clock skips (spring forward): spec.dstPolicy `skippedTime`
#
# A skipped wall time has no instant, so no minute since the epoch can name it without
# meaning some real minute too (02:30 of a Stockholm spring night read with the winter
# offset is 03:30 summer time, which `30 2,3 * * *` fires at). Its slot therefore lives
# where no real minute does: SKIPPED_SLOT_BASE plus the wall time's own minute count (the
# wall clock read as if it were UTC). Real slots stop at year 9999 (4,223,371,679, the
# last minute RFC 3339 and the Kubernetes API can write), so every key is above every
# real slot, and one wall time has one key in every cluster.
SKIPPED_SLOT_BASE = 10_000_000_000
_LAST_REAL_SLOT = (datetime(9999, 12, 31, 23, 59, tzinfo=UTC) - _EPOCH) // MINUTE
_NAIVE_EPOCH = _EPOCH.replace(tzinfo=None)
# The longest a clock has jumped ahead (Samoa skipped 30 Dec 2011): bounds the walk
# over a gap's wall minutes.
_LONGEST_JUMP = timedelta(days=1)


@dataclass(frozen=True)
class SkippedTime:
    """A wall time of the schedule that the clock skipped, and when its run is due."""

    wall: datetime  # naive: the wall-clock reading that did not happen
    slot: int  # skipped_time_slot(wall): the key its run claims
    due: datetime  # UTC: the first minute after the jump (the next valid minute)


def is_skipped_slot(slot: int) -> bool:
    return slot >= SKIPPED_SLOT_BASE


def skipped_time_slot(wall: datetime) -> int:
    """The key a skipped wall time's run claims (never a real minute's slot)."""
    if wall.tzinfo is not None:
        raise ValueError("a skipped wall time is a naive wall-clock reading")
    return SKIPPED_SLOT_BASE + (wall.replace(second=0, microsecond=0) - _NAIVE_EPOCH) // MINUTE


def skipped_wall_time(slot: int) -> datetime:
    """The naive wall time a key stands for; ValueError for a key no wall time has."""
    minutes = slot - SKIPPED_SLOT_BASE
    if not 0 <= minutes <= _LAST_REAL_SLOT:
        raise ValueError(f"{slot} is not a skipped wall time's slot (from {SKIPPED_SLOT_BASE} "
                         f"to {SKIPPED_SLOT_BASE + _LAST_REAL_SLOT})")
    return _NAIVE_EPOCH + minutes * MINUTE


def next_valid_minute(wall: datetime, zone: tzinfo) -> datetime | None:
    """The first instant (UTC, a whole minute) after the jump that skipped `wall`; None
    when `wall` is not skipped in `zone` (it happens, once or twice)."""
    earlier = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    later = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if _wall(earlier, zone) == wall or _wall(later, zone) == wall:
        return None
    # fold=1 lands before the jump, fold=0 after it: the jump is the first minute between
    # them whose wall clock reads past `wall`.
    low, high = floor_minute(min(earlier, later)), floor_minute(max(earlier, later))
    while high - low > MINUTE:
        middle = floor_minute(low + (high - low) // 2)
        if _wall(middle, zone) > wall:
            high = middle
        else:
            low = middle
    return high


def skipped_times(schedule: Schedule, zone: tzinfo, *, after: datetime,
                  until: datetime) -> list[SkippedTime]:
    """The schedule's wall times that the clock skipped in a jump at an instant in
    (after, until], oldest first. The CronJob controller never fires them."""
    require_aware(after)
    require_aware(until)
    found: list[SkippedTime] = []
    start = floor_minute(after)
    while (jump := _next_jump(zone, start, until)) is not None:
        before = _wall(jump - MINUTE, zone) + MINUTE  # the first wall minute not shown
        wall, end = before, _wall(jump, zone)
        while wall < end and wall - before < _LONGEST_JUMP:
            if schedule.wall_matches(wall):
                found.append(SkippedTime(wall=wall, slot=skipped_time_slot(wall), due=jump))
            wall += MINUTE
        start = jump
    return found


def _next_jump(zone: tzinfo, start: datetime, until: datetime) -> datetime | None:
    """The first minute in (start, until] whose wall clock is more than a minute ahead of
    the minute before's. Clocks change at most a few times a year, so the walk goes by
    days and searches only a day that holds a jump ahead."""
    day = timedelta(days=1)
    low = start
    while low < until:
        high = min(low + day, floor_minute(until))
        if high <= low:
            return None
        if _wall(high, zone) - _wall(low, zone) > high - low:
            while high - low > MINUTE:  # the wall clock gained between low and high
                middle = floor_minute(low + (high - low) // 2)
                if _wall(middle, zone) - _wall(low, zone) > middle - low:
                    high = middle
                else:
                    low = middle
            return high
        low = high
    return None


def _wall(t: datetime, zone: tzinfo) -> datetime:
    return t.astimezone(zone).replace(tzinfo=None)
