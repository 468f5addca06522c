"""One cron field: its bounds and names, and the parser for its text.

The grammar is the one of robfig/cron v3's standard parser, which the Kubernetes API
server validates with and the CronJob controller schedules with:

    field := item ("," item)*
    item  := base ("/" step)?
    base  := "*" | "?" | value ("-" value)?
    value := decimal number | three-letter name (months, weekdays; any case)

`N/step` means `N-max/step`. `*` and `?` are the same everywhere. Day-of-week is 0-6
with 0 = Sunday: robfig refuses 7, so the API server does too, and so do we.

Where robfig is lenient by accident we refuse with a message instead (the schedule
would otherwise mean something the author did not write): empty list items (`1,,2`),
a range starting with a star (`*-5`, which robfig reads as `*`), and signed numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from guardedcron.schedule.errors import ScheduleError

_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class FieldSpec:
    name: str
    low: int
    high: int
    names: Mapping[str, int]
    name_hint: str = ""


MINUTE = FieldSpec("minute", 0, 59, {})
HOUR = FieldSpec("hour", 0, 23, {})
DAY_OF_MONTH = FieldSpec("day-of-month", 1, 31, {})
MONTH = FieldSpec(
    "month", 1, 12,
    {name: number for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1)},
    name_hint=" or a month name (JAN-DEC)",
)
DAY_OF_WEEK = FieldSpec(
    "day-of-week", 0, 6,
    {name: number for number, name in enumerate(
        ("sun", "mon", "tue", "wed", "thu", "fri", "sat"))},
    name_hint=" or a weekday name (SUN-SAT)",
)

FIELDS = (MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK)


@dataclass(frozen=True)
class ParsedField:
    values: tuple[int, ...]  # sorted, no duplicates
    # True when some item is a bare (or /1-stepped) `*` or `?`. robfig keeps this as a
    # "star bit", and it decides whether day-of-month and day-of-week are ANDed or ORed.
    unrestricted: bool


def parse_field(spec: FieldSpec, text: str) -> ParsedField:
    values: set[int] = set()
    unrestricted = False
    for item in text.split(","):
        if not item:
            raise _error(spec, text, f"empty list item in {text!r}")
        item_values, item_unrestricted = _parse_item(spec, item)
        values.update(item_values)
        unrestricted = unrestricted or item_unrestricted
    return ParsedField(tuple(sorted(values)), unrestricted)


def _parse_item(spec: FieldSpec, item: str) -> tuple[range, bool]:
    base, slash, step_text = item.partition("/")
    if "/" in step_text:
        raise _error(spec, item, f"{item!r} has more than one '/'")
    step = 1
    if slash:
        if not _NUMBER.fullmatch(step_text):
            raise _error(spec, item, f"step {step_text!r} in {item!r} is not a number")
        step = int(step_text)
        if step == 0:
            raise _error(spec, item, f"step in {item!r} must be a positive number")

    if base in ("*", "?"):
        return range(spec.low, spec.high + 1, step), step == 1
    if base.startswith(("*", "?")):
        raise _error(spec, item, f"{item!r}: a range cannot start with {base[0]!r}")

    low_text, dash, high_text = base.partition("-")
    if "-" in high_text:
        raise _error(spec, item, f"{item!r} has more than one '-'")
    low = _value(spec, low_text, item)
    # `N/step` runs from N to the end of the field, `N` alone is just N.
    high = _value(spec, high_text, item) if dash else spec.high if slash else low
    if low > high:  # only a written range can run backwards: N/step ends at the maximum
        raise _error(
            spec, item,
            f"range {item!r} runs backwards; ranges do not wrap around, "
            f"write it as a list: '{low_text}-{spec.high},{spec.low}-{high_text}'",
        )
    return range(low, high + 1, step), False


def _value(spec: FieldSpec, text: str, item: str) -> int:
    if _NUMBER.fullmatch(text):
        number = int(text)
    elif text.lower() in spec.names:
        return spec.names[text.lower()]
    else:
        raise _error(
            spec, item,
            f"{text!r} is not a number{spec.name_hint}" if text else f"{item!r} is missing a value",
        )
    if not spec.low <= number <= spec.high:
        hint = ""
        if spec is DAY_OF_WEEK and number == 7:
            hint = " (Kubernetes' cron parser has no 7 for Sunday: write 0 or SUN)"
        raise _error(spec, item, f"{text!r} is out of range {spec.low}-{spec.high}{hint}")
    return number


def _error(spec: FieldSpec, token: str, detail: str) -> ScheduleError:
    return ScheduleError(f"{spec.name} field: {detail}", field=spec.name, token=token)
