"""A losing attempt's record commits without a WAL flush; a win still waits for one
(schema 7, issue 13), on a real PostgreSQL.

Each test fails on schema 6, where every loss was a durable commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from guardedcron.guard.migrations import migrate
from guardedcron_devenv.postgres import ThrowawayPostgres

Connection = psycopg.Connection[tuple[Any, ...]]

ACQUIRE = "SELECT acquired, reason FROM guardedcron.acquire_v2(%s, %s, 60, 0, %s, 30, 10000)"
ROUNDS = 10


def connect(dsn: str) -> Connection:
    return psycopg.connect(dsn, autocommit=True)


def age_lease(conn: Connection, lock: str) -> None:
    conn.execute(
        "UPDATE guardedcron.leases SET locked_until = clock_timestamp() - interval '1 ms'"
        " WHERE lock_name = %s", (lock,),
    )  # fmt: skip


def synchronous_commit_after(conn: Connection, lock: str, holder: str, slot: int | None) -> tuple[str, str]:
    """(reason, synchronous_commit) inside the transaction of one acquire_v2 call."""
    with conn.transaction():
        row = conn.execute(ACQUIRE, (lock, holder, slot)).fetchone()
        setting = conn.execute("SHOW synchronous_commit").fetchone()
    assert row is not None and setting is not None
    return str(row[1]), str(setting[0])


def test_only_a_losing_call_turns_synchronous_commit_off_and_only_for_its_transaction(dsn: str) -> None:
    with connect(dsn) as conn:
        # The suite's server runs with synchronous_commit off; a durable session says on.
        conn.execute("SET synchronous_commit = on")
        assert synchronous_commit_after(conn, "job", "a", 1) == ("acquired", "on")
        assert synchronous_commit_after(conn, "job", "b", 2) == ("lease-held", "off")
        age_lease(conn, "job")
        assert synchronous_commit_after(conn, "job", "c", 1) == ("slot-claimed", "off")
        # The next transaction of the session is durable again.
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert synchronous_commit_after(conn, "job", "d", 3) == ("acquired", "on")
        # The library's own skip record (row-busy) is a loss too.
        with conn.transaction():
            conn.execute("SELECT guardedcron.record_skip_v1('job', 'e', 4, 'row-busy')")
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        outcomes = conn.execute("SELECT holder, outcome FROM guardedcron.runs ORDER BY id").fetchall()
    assert outcomes == [("a", "abandoned"), ("b", "skipped"), ("c", "skipped"), ("d", "running"),
                        ("e", "skipped")]  # fmt: skip


@pytest.fixture(scope="module")
def durable_dsn() -> Iterator[str]:
    """A durable server whose WAL writer waits 10 s between rounds, so WAL that no commit
    flushed stays unflushed while the test looks."""
    with ThrowawayPostgres(durable=True, settings=[("wal_writer_delay", "'10s'")]) as server:
        dsn = server.dsn()
        with connect(dsn) as conn:
            migrate(conn)
        yield dsn


def unflushed_bytes(conn: Connection) -> int:
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - pg_current_wal_flush_lsn()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_win_waits_for_its_wal_flush_and_a_loss_does_not(durable_dsn: str) -> None:
    """Through the library, as a guard calls: after a win all WAL is on disk; after a loss
    its record is not yet (a durable server, the WAL writer held back). Counted over
    rounds, since the server's own background work may write or flush WAL at any moment."""
    flushed_wins = unflushed_losses = 0
    with connect(durable_dsn) as conn, connect(durable_dsn) as looker:
        for round_number in range(ROUNDS):
            age_lease(conn, "job")
            won = lease_ops.acquire(conn, AcquireRequest("job", f"w{round_number}", 60))
            assert won.acquired, won
            flushed_wins += unflushed_bytes(looker) == 0
            lost = lease_ops.acquire(conn, AcquireRequest("job", f"l{round_number}", 60))
            assert not lost.acquired and lost.reason == "lease-held", lost
            unflushed_losses += unflushed_bytes(looker) > 0
    assert flushed_wins >= ROUNDS - 2, flushed_wins
    assert unflushed_losses >= ROUNDS - 2, unflushed_losses
