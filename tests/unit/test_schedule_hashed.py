"""`H` in a schedule (issue 14): resolved from the lock by a stable hash, the same in every
process and cluster, spread over the range, and refused where it means nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from guardedcron.schedule import Schedule, ScheduleError
from guardedcron.schedule.hashed import resolve_hashed, uses_hash


# Pinned values: a change of the hash would move every H job of every user at upgrade, and
# two clusters on different versions would claim different slots for one lock.
@pytest.mark.parametrize(("text", "lock", "resolved"), [
    ("H * * * *", "ns/lock", "14 * * * *"),
    ("H/15 * * * *", "ns/lock", "14-59/15 * * * *"),
    ("H(0-29)/10 H(1-5) H * MON-THU", "ns/lock", "4-29/10 2 20 * MON-THU"),
    ("H H(1-5) * * *", "reports/cache-warm", "48 3 * * *"),
])
def test_resolution_is_pinned(text: str, lock: str, resolved: str) -> None:
    assert resolve_hashed(text, lock) == resolved
    Schedule.parse(resolved)  # and the CronJob controller's parser takes it


def test_resolution_does_not_depend_on_the_process() -> None:
    # Python's hash() of a str changes with PYTHONHASHSEED; ours must not.
    code = ("from guardedcron.schedule.hashed import resolve_hashed;"
            "print(resolve_hashed('H H * * H', 'shared:ledger-close'))")
    answers = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2", "12345")
    }
    assert answers == {resolve_hashed("H H * * H", "shared:ledger-close") + "\n"}


def test_different_locks_spread_over_the_range() -> None:
    minutes = {int(resolve_hashed("H * * * *", f"team/job-{n}").split()[0]) for n in range(300)}
    assert minutes <= set(range(60))
    assert len(minutes) >= 50  # 300 locks over 60 minutes leave few, if any, unused


def test_fields_and_items_resolve_independently() -> None:
    pairs = {tuple(resolve_hashed("H H * * *", f"ns/j{n}").split()[:2]) for n in range(50)}
    assert any(minute != hour for minute, hour in pairs)
    assert len({resolve_hashed("H,H * * * *", f"ns/j{n}") for n in range(20)}) > 1


@pytest.mark.parametrize(("text", "field", "low", "high", "step"), [
    ("H(10-20) * * * *", 0, 10, 20, None),
    ("* H(8-17) * * *", 1, 8, 17, None),
    ("* * H * *", 2, 1, 28, None),  # every month has it
    ("* * * H(JAN-MAR) *", 3, 1, 3, None),
    ("* * * * H(MON-FRI)", 4, 1, 5, None),
    ("H/7 * * * *", 0, 0, 59, 7),
    ("H(30-59)/10 * * * *", 0, 30, 59, 10),
])
def test_values_stay_in_their_range(text: str, field: int, low: int, high: int,
                                    step: int | None) -> None:
    for n in range(100):
        token = resolve_hashed(text, f"ns/job-{n}").split()[field]
        if step is None:
            assert low <= int(token) <= high, token
        else:
            start, _, rest = token.partition("-")
            assert rest == f"{high}/{step}", token
            assert low <= int(start) < low + step, token


def test_a_schedule_without_h_is_the_same_string() -> None:
    for text in ("30 2 * * *", "0 0 * * THU", "*/5 * * * MON-THU", "@hourly", " 1  2 * * * "):
        assert not uses_hash(text)
        assert resolve_hashed(text, "ns/x") is text


@pytest.mark.parametrize(("text", "words"), [
    ("H-5 * * * *", "'H-5' is not a hashed item"),
    ("5-H * * * *", "H must start the item"),
    ("H/90 * * * *", "step 90 in 'H/90' must be from 1 to 60"),
    ("H(0-9)/20 * * * *", "must be from 1 to 10, the size of its range 0-9"),
    ("H(30-10) * * * *", "H ranges do not wrap around"),
    ("H(0-60) * * * *", "'60' is out of range 0-59"),
    ("* * * * H(1-7)", "no 7 for Sunday"),
    ("H(a-b) * * * *", "'a' is not a number"),
])
def test_meaningless_h_is_refused_with_its_field(text: str, words: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        resolve_hashed(text, "ns/x")
    assert words in str(caught.value)
    assert caught.value.field is not None
