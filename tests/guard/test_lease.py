"""The lease operations against a real PostgreSQL: fences, holders, slots, min hold, clocks."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(dsn, autocommit=True)


def lease_row(conn: psycopg.Connection[tuple[Any, ...]], lock: str) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT holder, fence, acquired_at, locked_until, min_hold_until, run_id"
        " FROM guardedcron.leases WHERE lock_name = %s",
        (lock,),
    ).fetchone()
    assert row is not None
    return row


def expire(conn: psycopg.Connection[tuple[Any, ...]], lock: str) -> None:
    """Age a lease instead of sleeping through it (the function under test reads the DB clock)."""
    conn.execute(
        "UPDATE guardedcron.leases SET locked_until = clock_timestamp() - interval '1 ms',"
        " min_hold_until = clock_timestamp() - interval '1 ms' WHERE lock_name = %s",
        (lock,),
    )


def test_first_acquisition_gets_fence_one_and_a_running_history_row(dsn: str) -> None:
    with connect(dsn) as conn:
        result = lease_ops.acquire(conn, AcquireRequest("job", "a", 60))
        assert (result.acquired, result.reason, result.holder, result.fence) == (True, "acquired", "a", 1)
        assert result.locked_until is not None and result.db_now is not None
        assert 59 < (result.locked_until - result.db_now).total_seconds() <= 60
        run = conn.execute(
            "SELECT holder, fence, outcome, slot FROM guardedcron.runs WHERE id = %s",
            (result.run_id,),
        ).fetchone()
        assert run == ("a", 1, "running", None)


def test_live_lease_cannot_be_taken_and_the_loser_learns_the_holder(dsn: str) -> None:
    with connect(dsn) as conn:
        first = lease_ops.acquire(conn, AcquireRequest("job", "a", 60))
        before = lease_row(conn, "job")
        second = lease_ops.acquire(conn, AcquireRequest("job", "b", 60))
        assert not second.acquired
        assert (second.reason, second.holder, second.fence) == ("lease-held", "a", first.fence)
        assert lease_row(conn, "job") == before
        skipped = conn.execute(
            "SELECT holder, outcome, fence, finished_at IS NOT NULL FROM guardedcron.runs WHERE id = %s",
            (second.run_id,),
        ).fetchone()
        assert skipped == ("b", "skipped", None, True)


def test_fences_grow_with_every_acquisition_across_expiry_and_takeover(dsn: str) -> None:
    holders = ["a", "b", "a", "c", "c", "b"]
    with connect(dsn) as conn:
        fences = []
        for holder in holders:
            result = lease_ops.acquire(conn, AcquireRequest("job", holder, 60))
            assert result.acquired, result
            fences.append(result.fence)
            expire(conn, "job")
        assert fences == [1, 2, 3, 4, 5, 6]
        # Each takeover marked the previous still-running run abandoned.
        outcomes = [
            r[0]
            for r in conn.execute("SELECT outcome FROM guardedcron.runs WHERE lock_name = 'job' ORDER BY id")
        ]
        assert outcomes == ["abandoned"] * 5 + ["running"]


def test_fences_survive_real_expiry(dsn: str) -> None:
    with connect(dsn) as conn:
        first = lease_ops.acquire(conn, AcquireRequest("job", "a", 0.3))
        assert first.acquired
        assert not lease_ops.acquire(conn, AcquireRequest("job", "b", 0.3)).acquired
        time.sleep(0.4)
        second = lease_ops.acquire(conn, AcquireRequest("job", "b", 0.3))
        assert second.acquired and second.fence == first.fence + 1


def test_the_same_holder_asking_again_gets_its_own_lease_back(dsn: str) -> None:
    with connect(dsn) as conn:
        first = lease_ops.acquire(conn, AcquireRequest("job", "a", 60))
        again = lease_ops.acquire(conn, AcquireRequest("job", "a", 60))
        assert (again.acquired, again.reason, again.fence, again.run_id) == (
            True,
            "already-held",
            first.fence,
            first.run_id,
        )


def test_release_and_renew_by_a_non_holder_change_nothing(dsn: str) -> None:
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "a", 60))
        before = lease_row(conn, "job")
        released = lease_ops.release(conn, "job", "b", held.fence, "succeeded")
        assert not released.ok and released.holder == "a"
        renewed = lease_ops.renew(conn, "job", "b", held.fence, 600)
        assert not renewed.ok
        renewed_wrong_fence = lease_ops.renew(conn, "job", "a", held.fence + 1, 600)
        assert not renewed_wrong_fence.ok
        assert lease_row(conn, "job") == before
        outcome = conn.execute(
            "SELECT outcome FROM guardedcron.runs WHERE id = %s", (held.run_id,)
        ).fetchone()
        assert outcome == ("running",)


def test_renew_by_the_holder_extends_from_the_database_clock(dsn: str) -> None:
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "a", 5))
        state = lease_ops.renew(conn, "job", "a", held.fence, 600)
        assert state.ok and state.locked_until is not None
        assert 599 < (state.locked_until - state.db_now).total_seconds() <= 600
        # A shorter renewal never shortens the lease.
        shorter = lease_ops.renew(conn, "job", "a", held.fence, 1)
        assert shorter.locked_until == state.locked_until


def test_release_frees_the_lease_and_records_the_outcome(dsn: str) -> None:
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "a", 60))
        assert lease_ops.release(conn, "job", "a", held.fence, "succeeded").ok
        run = conn.execute(
            "SELECT outcome, finished_at IS NOT NULL FROM guardedcron.runs WHERE id = %s", (held.run_id,)
        ).fetchone()
        assert run == ("succeeded", True)
        nxt = lease_ops.acquire(conn, AcquireRequest("job", "b", 60))
        assert nxt.acquired and nxt.fence == held.fence + 1


def test_minimum_hold_keeps_a_fast_run_locked(dsn: str) -> None:
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "a", 60, min_hold_seconds=1.0))
        assert lease_ops.release(conn, "job", "a", held.fence, "succeeded").ok
        refused = lease_ops.acquire(conn, AcquireRequest("job", "b", 60))
        assert not refused.acquired and refused.reason == "lease-held"
        time.sleep(1.1)
        assert lease_ops.acquire(conn, AcquireRequest("job", "b", 60)).acquired


def test_a_slot_runs_once_even_after_its_run_released(dsn: str) -> None:
    with connect(dsn) as conn:
        first = lease_ops.acquire(conn, AcquireRequest("job", "cluster-a/pod", 60, slot=29_000_000))
        assert first.acquired
        assert lease_ops.release(conn, "job", "cluster-a/pod", first.fence, "succeeded").ok
        again = lease_ops.acquire(conn, AcquireRequest("job", "cluster-b/pod", 60, slot=29_000_000))
        assert not again.acquired
        assert (again.reason, again.holder, again.fence) == ("slot-claimed", "cluster-a/pod", first.fence)
        # The refused attempt did not touch the lease: the fence did not move.
        assert lease_row(conn, "job")[1] == first.fence
        following = lease_ops.acquire(conn, AcquireRequest("job", "cluster-b/pod", 60, slot=29_000_001))
        assert following.acquired and following.fence == first.fence + 1



def test_a_loser_says_whether_its_slot_ran_while_the_lease_is_held(dsn: str) -> None:
    """'lease-held' means the slot did not run; 'slot-claimed' that it did, also while the
    winner of that slot still holds the lease (the other cluster's run is going on)."""
    with connect(dsn) as conn:
        first = lease_ops.acquire(conn, AcquireRequest("job", "cluster-a/pod", 60, slot=29_000_000))
        assert first.acquired
        same_slot = lease_ops.acquire(conn, AcquireRequest("job", "cluster-b/pod", 60, slot=29_000_000))
        assert (same_slot.reason, same_slot.holder) == ("slot-claimed", "cluster-a/pod")
        assert same_slot.fence == first.fence
        next_slot = lease_ops.acquire(conn, AcquireRequest("job", "cluster-b/pod-2", 60, slot=29_000_001))
        assert (next_slot.reason, next_slot.holder) == ("lease-held", "cluster-a/pod")
        reasons = conn.execute(
            "SELECT holder, reason FROM guardedcron.runs WHERE outcome = 'skipped' ORDER BY id"
        ).fetchall()
        assert reasons[0][0] == "cluster-b/pod" and reasons[0][1].startswith("slot 29000000 already run by")
        assert reasons[1][0] == "cluster-b/pod-2" and reasons[1][1].startswith("lease held by cluster-a/pod")

def test_manual_runs_rely_on_the_lease_alone(dsn: str) -> None:
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "a", 60))
        assert held.acquired
        assert not lease_ops.acquire(conn, AcquireRequest("job", "b", 60)).acquired
        assert lease_ops.release(conn, "job", "a", held.fence, "succeeded").ok
        assert lease_ops.acquire(conn, AcquireRequest("job", "b", 60)).acquired


def test_locks_are_independent(dsn: str) -> None:
    with connect(dsn) as conn:
        assert lease_ops.acquire(conn, AcquireRequest("one", "a", 60)).acquired
        other = lease_ops.acquire(conn, AcquireRequest("two", "b", 60))
        # Fences are drawn from one database-wide sequence: unique across locks too.
        assert other.acquired and other.fence == 2


def test_lease_taken_inside_a_long_transaction_uses_the_current_time(dsn: str) -> None:
    """The ShedLock double run: now() inside an old transaction makes a lease expired at birth."""
    with psycopg.connect(dsn) as conn:  # not autocommit: one long transaction
        conn.execute("SELECT 1")  # the transaction starts here; now() is frozen from this point
        time.sleep(1.5)
        # The library refuses this (a rollback could undo a won lease); the SQL function
        # itself must still read the current time when another client calls it like this.
        result = conn.execute(
            "SELECT acquired FROM guardedcron.acquire_v2('job', 'a', 1.0, 0, NULL, 90, 10000)"
        )
        assert result.fetchone() == (True,)
        row = conn.execute(
            "SELECT locked_until > clock_timestamp(), locked_until > now() + "
            "interval '1.2 s' FROM guardedcron.leases WHERE lock_name = 'job'"
        ).fetchone()
        assert row == (True, True)
        conn.commit()
    with connect(dsn) as other:
        refused = lease_ops.acquire(other, AcquireRequest("job", "b", 1.0))
        assert not refused.acquired, "the lease must still be live right after the commit"


def test_history_is_bounded_by_count(dsn: str) -> None:
    with connect(dsn) as conn:
        for _ in range(12):
            lease_ops.acquire(conn, AcquireRequest("job", "a", 60, retain_runs=5))
            lease_ops.acquire(conn, AcquireRequest("job", "b", 60, retain_runs=5))  # skipped
            expire(conn, "job")
        count = conn.execute(
            "SELECT count(fence), count(*) FROM guardedcron.runs WHERE lock_name='job'"
        ).fetchone()
        # Schema 5: the last retain_runs winning runs, each with the attempt that lost to it.
        assert count == (5, 10)


def test_history_and_claims_are_bounded_by_age(dsn: str) -> None:
    with connect(dsn) as conn:
        lease_ops.acquire(conn, AcquireRequest("job", "a", 60, slot=1))
        conn.execute("UPDATE guardedcron.runs SET started_at = started_at - interval '40 days'")
        conn.execute("UPDATE guardedcron.slot_claims SET claimed_at = claimed_at - interval '40 days'")
        expire(conn, "job")
        lease_ops.acquire(conn, AcquireRequest("job", "a", 60, slot=2, retain_days=30))
        runs = conn.execute("SELECT slot FROM guardedcron.runs ORDER BY id").fetchall()
        claims = conn.execute("SELECT slot FROM guardedcron.slot_claims ORDER BY slot").fetchall()
        assert runs == [(2,)] and claims == [(2,)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lock": ""}, "lock must not be empty"),
        ({"lock": "   "}, "lock must not be empty"),
        ({"lock": "x" * 254}, "at most 253"),
        ({"lock": "a\nb"}, "control characters"),
        ({"holder": ""}, "holder must not be empty"),
        ({"lease_seconds": 0}, "from 0.1 to 604800"),
        ({"lease_seconds": -5}, "from 0.1 to 604800"),
        ({"lease_seconds": 1e-7}, "from 0.1 to 604800"),  # would be a zero-length lease
        ({"lease_seconds": 604_801}, "from 0.1 to 604800"),
        ({"lease_seconds": 1e300}, "from 0.1 to 604800"),
        ({"lease_seconds": float("nan")}, "from 0.1 to 604800"),
        ({"min_hold_seconds": -1}, "between 0 and 604800"),
        ({"min_hold_seconds": 61}, "longer than the lease"),
        ({"slot": -1}, "from 0 to 9223372036854775807"),
        ({"slot": 2**63}, "from 0 to 9223372036854775807"),
        ({"retain_days": 0}, "retain days"),
        ({"retain_days": 2**31}, "retain days must be from 1 to 36500"),
        ({"retain_runs": 0}, "retain runs"),
        ({"retain_runs": 2**31}, "retain runs must be from 1 to 2147483647"),
    ],
)
def test_bad_requests_are_refused_before_any_database_call(kwargs: dict[str, object], message: str) -> None:
    from guardedcron.guard.errors import BadInput

    base: dict[str, object] = {"lock": "job", "holder": "a", "lease_seconds": 60}
    with pytest.raises(BadInput, match=message):
        AcquireRequest(**{**base, **kwargs})  # type: ignore[arg-type]
