"""The lease operations: acquire, renew, release, mark lost. One database call each.

The SQL functions (guard/sql/) do the work in one statement so that a contender
needs one round trip, and all timing is decided by the database clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from guardedcron.guard.errors import BadInput

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[Any, ...]]

OUTCOMES_ON_RELEASE = ("succeeded", "failed", "finished")
DEFAULT_RETAIN_DAYS = 90
DEFAULT_RETAIN_RUNS = 10_000
MAX_NAME_LENGTH = 253
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class AcquireRequest:
    lock: str
    holder: str
    lease_seconds: float
    min_hold_seconds: float = 0.0
    slot: int | None = None
    retain_days: int = DEFAULT_RETAIN_DAYS
    retain_runs: int = DEFAULT_RETAIN_RUNS

    def __post_init__(self) -> None:
        check_name("lock", self.lock)
        check_name("holder", self.holder)
        check_positive("lease seconds", self.lease_seconds)
        if self.min_hold_seconds < 0:
            raise BadInput(f"min hold seconds must not be negative, got {self.min_hold_seconds:g}")
        if self.min_hold_seconds > self.lease_seconds:
            raise BadInput(
                f"min hold ({self.min_hold_seconds:g} s) is longer than the lease "
                f"({self.lease_seconds:g} s): the lease would end before the minimum hold"
            )
        if self.slot is not None and self.slot < 0:
            raise BadInput(f"slot must be a non-negative integer, got {self.slot}")
        if self.retain_days < 1:
            raise BadInput(f"retain days must be at least 1, got {self.retain_days}")
        if self.retain_runs < 1:
            raise BadInput(f"retain runs must be at least 1, got {self.retain_runs}")


@dataclass(frozen=True)
class AcquireResult:
    acquired: bool
    reason: str  # acquired | already-held | lease-held | slot-claimed | row-busy
    holder: str  # the winner: us when acquired, else whoever holds the lease or claimed the slot
    fence: int
    locked_until: datetime | None
    run_id: int | None
    db_now: datetime | None


@dataclass(frozen=True)
class LeaseState:
    """The answer of renew and release: whether it worked, and the lease as it now is."""

    ok: bool
    holder: str | None
    fence: int | None
    locked_until: datetime | None
    db_now: datetime


def check_name(what: str, value: str) -> None:
    if not value or not value.strip():
        raise BadInput(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise BadInput(f"{what} is {len(value)} characters long; at most {MAX_NAME_LENGTH}")
    if _CONTROL.search(value):
        raise BadInput(f"{what} must not contain control characters")


def check_positive(what: str, value: float) -> None:
    if not value > 0:
        raise BadInput(f"{what} must be a positive number, got {value:g}")


def acquire(conn: Connection, request: AcquireRequest) -> AcquireResult:
    import psycopg

    try:
        row = conn.execute(
            "SELECT * FROM guardedcron.acquire_v1(%s, %s, %s, %s, %s, %s, %s)",
            (
                request.lock,
                request.holder,
                float(request.lease_seconds),
                float(request.min_hold_seconds),
                request.slot,
                request.retain_days,
                request.retain_runs,
            ),
        ).fetchone()
    except psycopg.errors.LockNotAvailable:
        # A fenced write of the previous holder kept the lease row locked past lock_timeout.
        return AcquireResult(False, "row-busy", "", 0, None, _record_row_busy(conn, request), None)
    assert row is not None
    acquired, reason, holder, fence, locked_until, run_id, db_now = row
    return AcquireResult(
        acquired=bool(acquired),
        reason=str(reason),
        holder=str(holder),
        fence=int(fence),
        locked_until=locked_until,
        run_id=run_id,
        db_now=db_now,
    )


def _record_row_busy(conn: Connection, request: AcquireRequest) -> int | None:
    """Give the attempt its history row: the function's own skip record was rolled back."""
    if not conn.autocommit:
        return None  # the caller's transaction has failed; what happens next is the caller's call
    row = conn.execute(
        "SELECT guardedcron._record_skip(%s, %s, %s, %s, clock_timestamp())",
        (
            request.lock,
            request.holder,
            request.slot,
            "lease row locked past lock_timeout by an in-flight fenced write of the previous holder",
        ),
    ).fetchone()
    return None if row is None else int(row[0])


def renew(conn: Connection, lock: str, holder: str, fence: int, lease_seconds: float) -> LeaseState:
    check_name("lock", lock)
    check_name("holder", holder)
    check_positive("lease seconds", lease_seconds)
    row = conn.execute(
        "SELECT * FROM guardedcron.renew_v1(%s, %s, %s, %s)",
        (lock, holder, fence, float(lease_seconds)),
    ).fetchone()
    assert row is not None
    return _state(row)


def release(
    conn: Connection, lock: str, holder: str, fence: int, outcome: str = "finished", reason: str = ""
) -> LeaseState:
    check_name("lock", lock)
    check_name("holder", holder)
    if outcome not in OUTCOMES_ON_RELEASE:
        raise BadInput(f"outcome must be one of {', '.join(OUTCOMES_ON_RELEASE)}, got {outcome!r}")
    row = conn.execute(
        "SELECT released, holder, fence, locked_until, db_now FROM guardedcron.release_v1(%s, %s, %s, %s)",
        (lock, holder, outcome, reason),
    ).fetchone()
    assert row is not None
    return _state(row)


def mark_lost(conn: Connection, lock: str, holder: str, fence: int, reason: str) -> bool:
    row = conn.execute(
        "SELECT guardedcron.mark_lost_v1(%s, %s, %s, %s)", (lock, holder, fence, reason)
    ).fetchone()
    return row is not None and row[0] is not None


def _state(row: tuple[Any, ...]) -> LeaseState:
    ok, holder, fence, locked_until, db_now = row
    return LeaseState(
        ok=bool(ok),
        holder=None if holder is None else str(holder),
        fence=None if fence is None else int(fence),
        locked_until=locked_until,
        db_now=db_now,
    )
