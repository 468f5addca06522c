"""A parsed cron schedule, and the question "does this wall-clock minute match?".

Accepted text is what the Kubernetes API server accepts for a CronJob (robfig/cron
v3 `ParseStandard`), with three refusals of our own, each with its reason:

- `TZ=`/`CRON_TZ=` prefixes: Kubernetes forbids them since 1.27; `timeZone` replaces them.
- `@every <duration>`: Kubernetes accepts it, but its run times count from each
  CronJob's creation (or last run), not from the clock. Two clusters sharing a lease
  would then disagree on the slots, and no one could say from the schedule alone
  when a run was due (missed-run detection, `nextScheduleTime`).
- the lenient corners listed in `fields`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, tzinfo

from guardedcron.schedule import search
from guardedcron.schedule.errors import ScheduleError
from guardedcron.schedule.fields import FIELDS, parse_field

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_FIELD_ORDER = " ".join(spec.name for spec in FIELDS)


@dataclass(frozen=True)
class Schedule:
    """Which wall-clock minutes fire. Times in and out of the search methods are aware."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days_of_month: tuple[int, ...]
    months: tuple[int, ...]
    days_of_week: tuple[int, ...]  # 0 = Sunday
    # robfig: when either day field is unrestricted (`*`/`?`) a day must match both,
    # otherwise it may match either (`0 0 1,15 * MON` = the 1st, the 15th and Mondays).
    days_either: bool

    @classmethod
    def parse(cls, text: str) -> Schedule:
        if not text.strip():
            raise ScheduleError(
                f"schedule is empty: write 5 fields ({_FIELD_ORDER}) or a macro such as @daily",
                token=text,
            )
        if "TZ" in text:  # the API server's own test: any "TZ" in the text is refused
            raise ScheduleError(
                "schedule must not carry TZ= or CRON_TZ= (Kubernetes refuses it since 1.27): "
                "set spec.timeZone instead",
                token=next(token for token in text.split() if "TZ" in token),
            )
        fields_text = _expand_macro(text) if text.startswith("@") else text
        tokens = fields_text.split()
        if len(tokens) != len(FIELDS):
            seconds = " (there is no seconds field)" if len(tokens) == 6 else ""
            raise ScheduleError(
                f"schedule has {len(tokens)} field{'s' if len(tokens) != 1 else ''}{seconds}; "
                f"expected 5: {_FIELD_ORDER}",
                token=text,
            )
        minute, hour, dom, month, dow = (
            parse_field(spec, token) for spec, token in zip(FIELDS, tokens, strict=True))
        return cls(
            text=text,
            minutes=minute.values,
            hours=hour.values,
            days_of_month=dom.values,
            months=month.values,
            days_of_week=dow.values,
            days_either=not (dom.unrestricted or dow.unrestricted),
        )

    def day_matches(self, day: date) -> bool:
        dom = day.day in self.days_of_month
        dow = (day.weekday() + 1) % 7 in self.days_of_week  # Python: Monday = 0
        return (dom or dow) if self.days_either else (dom and dow)

    def wall_matches(self, wall: datetime) -> bool:
        """Whether a wall-clock reading (naive or aware; only its fields count) fires."""
        return (wall.minute in self.minutes and wall.hour in self.hours
                and wall.month in self.months and self.day_matches(wall.date()))

    def fires_at(self, t: datetime, tz: tzinfo) -> bool:
        """Whether the instant `t` is one of this schedule's fire times in `tz`."""
        search.require_aware(t)
        return search.floor_minute(t) == t and self.wall_matches(t.astimezone(tz))

    def next_after(self, t: datetime, tz: tzinfo) -> datetime | None:
        """The first fire time strictly after `t`, in UTC; None if none within 5 years."""
        return search.next_after(self, t, tz)

    def previous_at_or_before(self, t: datetime, tz: tzinfo) -> datetime | None:
        """The last fire time at or before `t`, in UTC; None if none within 5 years."""
        return search.previous_at_or_before(self, t, tz)

    def iter_between(self, start: datetime, end: datetime, tz: tzinfo) -> Iterator[datetime]:
        """Fire times t with start < t <= end, in order, in UTC."""
        t = self.next_after(start, tz)
        while t is not None and t <= end:
            yield t
            t = self.next_after(t, tz)


def _expand_macro(text: str) -> str:
    if text in MACROS:
        return MACROS[text]
    if text.startswith("@every"):
        raise ScheduleError(
            "@every is not supported: its run times count from when each CronJob was "
            "created, so clusters sharing a lease would disagree on the slots; "
            "write the interval as 5 fields, e.g. '*/15 * * * *'",
            token=text,
        )
    raise ScheduleError(
        f"unknown macro {text!r}; use one of {', '.join(MACROS)} (exactly, lower case)",
        token=text,
    )
