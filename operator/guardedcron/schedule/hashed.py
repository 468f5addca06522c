"""Hashed spread: `H` in a schedule field, resolved to a concrete value per lock (pure).

Written like Jenkins' `H`, one item of a field at a time:

    H              one value of the field's range
    H/step         every `step`, starting at a value below `step`
    H(low-high)    one value of low..high
    H(low-high)/step

The value comes from a SHA-256 of the *effective lock name* (never Python's `hash()`,
which is salted per process), the field and the item's position. Every cluster that
shares the lock therefore resolves the same concrete schedule, so their runs keep
claiming the same slots, while jobs with different locks spread over the range instead
of all firing at minute 0. In day-of-month a bare `H` ranges over 1-28, so that it
fires in every month.

The concrete text replaces only the `H` items; a schedule without `H` comes back as
the very same string, so the CronJob of a GuardedCronJob that does not use `H` does
not change.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from guardedcron.schedule.errors import ScheduleError
from guardedcron.schedule.fields import DAY_OF_MONTH, FIELDS, FieldSpec, parse_field

HASH_MARK: Final = "H"
# A bare H in day-of-month stays in the days every month has.
_DAY_OF_MONTH_HASH_HIGH: Final = 28
_HASHED_ITEM = re.compile(r"H(?:\((?P<low>[^()\-]*)-(?P<high>[^()\-]*)\))?(?:/(?P<step>[0-9]+))?")
_FORMS = "H, H/step, H(low-high) or H(low-high)/step"
# An H that is not part of a name such as THU.
_LONE_H = re.compile(r"(?<![A-Za-z])H(?![A-Za-z])")


def uses_hash(text: str) -> bool:
    """Whether any field of the 5-field `text` has an `H` item (macros never do)."""
    if text.startswith("@"):
        return False
    return any(_LONE_H.match(item) is not None
               for token in text.split() for item in token.split(","))


def resolve_hashed(text: str, seed: str) -> str:
    """`text` with every `H` item replaced by the concrete value `seed` (the effective lock
    name) picks; `text` itself when it has none. Raises ScheduleError for an `H` that
    means nothing (in a macro, inside a range, with a step longer than its range)."""
    if not uses_hash(text):
        if not text.startswith("@"):
            _refuse_misplaced(text)
        return text
    tokens = text.split()
    if len(tokens) != len(FIELDS):
        return text  # Schedule.parse says what is wrong with the field count
    resolved = [
        ",".join(_resolve_item(spec, item, seed, position, index)
                 for index, item in enumerate(token.split(",")))
        for position, (spec, token) in enumerate(zip(FIELDS, tokens, strict=True))
    ]
    return " ".join(resolved)


def _refuse_misplaced(text: str) -> None:
    for spec, token in zip(FIELDS, text.split(), strict=False):
        for item in token.split(","):
            if _LONE_H.search(item):
                raise _error(spec, item, f"{item!r}: H must start the item ({_FORMS})")


def _resolve_item(spec: FieldSpec, item: str, seed: str, position: int, index: int) -> str:
    if not item.startswith(HASH_MARK):
        if _LONE_H.search(item):
            raise _error(spec, item, f"{item!r}: H must start the item ({_FORMS})")
        return item
    match = _HASHED_ITEM.fullmatch(item)
    if match is None:
        raise _error(spec, item, f"{item!r} is not a hashed item: write {_FORMS}")
    low, high = _range(spec, match.group("low"), match.group("high"), item)
    width = high - low + 1
    number = _hash_number(seed, position, index)
    step_text = match.group("step")
    if step_text is None:
        return str(low + number % width)
    step = int(step_text)
    if not 0 < step <= width:
        raise _error(spec, item,
                     f"step {step} in {item!r} must be from 1 to {width}, the size of its "
                     f"range {low}-{high}")
    start = low + number % step
    return f"{start}-{high}/{step}"


def _range(spec: FieldSpec, low_text: str | None, high_text: str | None, item: str
           ) -> tuple[int, int]:
    if low_text is None or high_text is None:
        high = _DAY_OF_MONTH_HASH_HIGH if spec is DAY_OF_MONTH else spec.high
        return spec.low, high
    # The field's own parser checks each bound (numbers, names, limits) with its messages.
    low = parse_field(spec, low_text).values[0]
    high = parse_field(spec, high_text).values[0]
    if low > high:
        raise _error(spec, item, f"range in {item!r} runs backwards; H ranges do not wrap "
                                 f"around: write H({spec.low}-{high}) or H({low}-{spec.high})")
    return low, high


def _hash_number(seed: str, position: int, index: int) -> int:
    digest = hashlib.sha256(f"{seed}\n{position}\n{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _error(spec: FieldSpec, token: str, detail: str) -> ScheduleError:
    return ScheduleError(f"{spec.name} field: {detail}", field=spec.name, token=token)
