"""Daylight-saving policy: which slot a run claims (pure).

The CronJob controller reads the schedule on the wall clock (see `search`): a wall time
the clock shows twice fires twice, one slot per instant. With spec.dstPolicy
`repeatedTime: Once` every run claims the slot of the *first* instant that shows its
wall-clock minute (`wall_clock_slot`): the second 02:30 of an autumn night claims the
slot the first one already claimed, in whichever cluster it runs, and is skipped.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo

from guardedcron.schedule.search import MINUTE, floor_minute, require_aware

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
