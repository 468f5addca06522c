"""The lease operations: acquire, renew, release, mark lost. One database call each.

The SQL functions (guard/sql/) do the work in one statement so that a contender
needs one round trip, and all timing is decided by the database clock. Every input
is checked here first, against the same bounds the functions enforce, so bad input
never reaches the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from guardedcron.contract import (
    BIGINT_MAX,
    CONTROL_CHARACTERS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    NAME_MAX,
    SLOT_CLAIM_RETAIN_DAYS,
    AcquireReason,
    ReleaseOutcome,
)
from guardedcron.guard.errors import BadInput, FenceExhausted, not_granted, out_of_bounds

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[Any, ...]]

OUTCOMES_ON_RELEASE = tuple(outcome.value for outcome in ReleaseOutcome)
DEFAULT_RETAIN_DAYS = SLOT_CLAIM_RETAIN_DAYS  # the operator's backfill bound relies on it
DEFAULT_RETAIN_RUNS = 10_000  # winning runs (lease generations) per lock, from schema 5
# From schema 5 a winning acquisition deletes at most this many rows of history, and of slot
# claims (the constant retention_batch in guard/sql/0005_amortised_retention.sql).
RETENTION_BATCH = 16
# A century of history; beyond it the database's date arithmetic would overflow.
MAX_RETAIN_DAYS = 36_500
MAX_RETAIN_RUNS = 2**31 - 1  # the SQL functions take an integer
FENCE_EXHAUSTED_SQLSTATE = "GC002"
# Another isolation level than READ COMMITTED can fail a contended acquisition with a
# serialization failure (or a deadlock); a new transaction then sees the winner. The
# tries are few because each retry follows a commit by someone else.
SERIALIZATION_TRIES = 5


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
        check_lease_seconds("lease seconds", self.lease_seconds)
        if not 0 <= self.min_hold_seconds <= MAX_LEASE_SECONDS:
            raise BadInput(
                f"min hold seconds must be between 0 and {MAX_LEASE_SECONDS}, got {self.min_hold_seconds:g}"
            )
        if self.min_hold_seconds > self.lease_seconds:
            raise BadInput(
                f"min hold ({self.min_hold_seconds:g} s) is longer than the lease "
                f"({self.lease_seconds:g} s): the lease would end before the minimum hold"
            )
        if self.slot is not None and not 0 <= self.slot <= BIGINT_MAX:
            raise BadInput(f"slot must be an integer from 0 to {BIGINT_MAX}, got {self.slot}")
        if not 1 <= self.retain_days <= MAX_RETAIN_DAYS:
            raise BadInput(f"retain days must be from 1 to {MAX_RETAIN_DAYS}, got {self.retain_days}")
        if not 1 <= self.retain_runs <= MAX_RETAIN_RUNS:
            raise BadInput(f"retain runs must be from 1 to {MAX_RETAIN_RUNS}, got {self.retain_runs}")


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
    if len(value) > NAME_MAX:
        raise BadInput(f"{what} is {len(value)} characters long; at most {NAME_MAX}")
    if CONTROL_CHARACTERS.search(value):
        raise BadInput(f"{what} must not contain control characters")


def check_lease_seconds(what: str, value: float) -> None:
    if not MIN_LEASE_SECONDS <= value <= MAX_LEASE_SECONDS:
        raise BadInput(
            f"{what} must be from {MIN_LEASE_SECONDS:g} to {MAX_LEASE_SECONDS} (7 days), got {value:g}"
        )


def check_fence_value(fence: int) -> None:
    if not 1 <= fence <= BIGINT_MAX:
        raise BadInput(f"fence must be an integer from 1 to {BIGINT_MAX}, got {fence}")


def acquire(conn: Connection, request: AcquireRequest) -> AcquireResult:
    """Take the lease in one call on `conn`, which must be in autocommit mode and idle.

    Inside a caller's transaction a rollback would undo the history row and the slot
    claim while the workload already runs, so that is refused.
    """
    import psycopg
    from psycopg.pq import TransactionStatus

    from guardedcron.guard.timestamps import reading

    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        raise BadInput(
            "acquire needs a connection of its own in autocommit mode, outside any transaction: "
            "a rollback must not be able to undo a won lease, its slot claim or its history"
        )
    arguments = (
        request.lock,
        request.holder,
        float(request.lease_seconds),
        float(request.min_hold_seconds),
        request.slot,
        request.retain_days,
        request.retain_runs,
    )
    for attempt in range(1, SERIALIZATION_TRIES + 1):
        try:
            row = reading(conn).execute(
                "SELECT * FROM guardedcron.acquire_v2(%s, %s, %s, %s, %s, %s, %s)", arguments
            ).fetchone()
            break
        except psycopg.errors.LockNotAvailable:
            # A fenced write of the previous holder kept the lease row locked past lock_timeout.
            return _row_busy(
                conn,
                request,
                "lease row locked past lock_timeout by an in-flight fenced write of the previous holder",
            )
        except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
            if attempt == SERIALIZATION_TRIES:
                return _row_busy(
                    conn,
                    request,
                    f"serialization failures on {attempt} tries "
                    "(the database's default isolation level is above READ COMMITTED)",
                )
        except psycopg.Error as exc:
            if exc.sqlstate == FENCE_EXHAUSTED_SQLSTATE:
                raise FenceExhausted(str(exc.diag.message_primary or exc)) from None
            refusal = not_granted(exc, request.lock, conn.info.user) or out_of_bounds(exc)
            if refusal is not None:
                raise refusal from None
            raise
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


def _row_busy(conn: Connection, request: AcquireRequest, why: str) -> AcquireResult:
    """Answer a contended attempt as a skip, with its history row (the function's own was rolled back)."""
    import psycopg

    try:
        row = conn.execute(
            "SELECT guardedcron.record_skip_v1(%s, %s, %s, %s)",
            (request.lock, request.holder, request.slot, why),
        ).fetchone()
    except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
        row = None  # a skip without its history row beats a skip reported as an outage
    run_id = None if row is None else int(row[0])
    return AcquireResult(False, AcquireReason.ROW_BUSY, "", 0, None, run_id, None)


def renew(conn: Connection, lock: str, holder: str, fence: int, lease_seconds: float) -> LeaseState:
    check_name("lock", lock)
    check_name("holder", holder)
    check_fence_value(fence)
    check_lease_seconds("lease seconds", lease_seconds)
    return _state(
        _fetch_retrying(
            conn,
            lock,
            "SELECT * FROM guardedcron.renew_v2(%s, %s, %s, %s)",
            (lock, holder, fence, float(lease_seconds)),
        )
    )


def release(
    conn: Connection,
    lock: str,
    holder: str,
    fence: int,
    outcome: str = ReleaseOutcome.FINISHED.value,
    reason: str = "",
) -> LeaseState:
    """End the lease if `holder` still holds it with `fence`; never a newer generation's."""
    check_name("lock", lock)
    check_name("holder", holder)
    check_fence_value(fence)
    if outcome not in OUTCOMES_ON_RELEASE:
        raise BadInput(f"outcome must be one of {', '.join(OUTCOMES_ON_RELEASE)}, got {outcome!r}")
    return _state(
        _fetch_retrying(
            conn,
            lock,
            "SELECT released, holder, fence, locked_until, db_now"
            " FROM guardedcron.release_v2(%s, %s, %s, %s, %s)",
            (lock, holder, fence, outcome, reason),
        )
    )


def mark_lost(conn: Connection, lock: str, holder: str, fence: int, reason: str) -> bool:
    row = _fetch_retrying(
        conn, lock, "SELECT guardedcron.mark_lost_v1(%s, %s, %s, %s)", (lock, holder, fence, reason)
    )
    return row[0] is not None


def _fetch_retrying(conn: Connection, lock: str, query: str, arguments: tuple[Any, ...]) -> tuple[Any, ...]:
    """One row of a one-statement call on `lock`, retried on serialization failures (other
    isolation levels); a refused grant is LockNotGranted."""
    import psycopg

    from guardedcron.guard.timestamps import reading

    for attempt in range(1, SERIALIZATION_TRIES + 1):
        try:
            row = reading(conn).execute(query, arguments).fetchone()
        except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
            if attempt == SERIALIZATION_TRIES or not conn.autocommit:
                raise
            continue
        except psycopg.Error as exc:
            refusal = not_granted(exc, lock, conn.info.user) or out_of_bounds(exc)
            if refusal is not None:
                raise refusal from None
            raise
        assert row is not None
        return row
    raise AssertionError("unreachable: the last try returns or raises")


def _state(row: tuple[Any, ...]) -> LeaseState:
    ok, holder, fence, locked_until, db_now = row
    return LeaseState(
        ok=bool(ok),
        holder=None if holder is None else str(holder),
        fence=None if fence is None else int(fence),
        locked_until=locked_until,
        db_now=db_now,
    )
