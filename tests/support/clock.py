"""A clock the test sets: passes and handlers take `now` from it instead of the wall clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

# A winter Friday noon: "30 2 * * *" in Europe/Stockholm (UTC+1) fires next at 01:30Z.
T0 = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)
