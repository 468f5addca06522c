"""The library's fence check only where it protects a write: in an open transaction.

On an autocommit connection outside a transaction the check is a statement of its own:
its lock on the lease row ends with it, a takeover commits, and the stale holder's
write lands after the new holder's. The library's own `connect()` gives such a
connection, so `check_fence` refuses it, and `fenced_transaction` is the pattern that
cannot get this wrong.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.connection import connect
from guardedcron.guard.errors import BadInput, StaleFenceError
from guardedcron.guard.fence import check_fence, fenced_transaction
from guardedcron.guard.lease import AcquireRequest


def make_ledger(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (item text PRIMARY KEY, fence bigint NOT NULL)")


def ledger(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return [(str(item), int(fence)) for item, fence in conn.execute("SELECT * FROM ledger ORDER BY item")]


def test_check_fence_refuses_an_autocommit_connection_outside_a_transaction(dsn: str) -> None:
    make_ledger(dsn)
    with connect(dsn, 5) as conn:
        won = lease_ops.acquire(conn, AcquireRequest("job", "a", 30))
        with pytest.raises(BadInput, match="autocommit"):
            check_fence(conn, "job", won.fence)
        with pytest.raises(BadInput, match="autocommit"):
            check_fence(conn, "job", won.fence + 1)  # refused before it is even checked
        # The same connection inside a transaction block is what the check protects.
        with conn.transaction():
            check_fence(conn, "job", won.fence)
            conn.execute("INSERT INTO ledger VALUES ('a', %s)", (won.fence,))
    assert ledger(dsn) == [("a", 1)]


def test_fenced_transaction_holds_a_takeover_until_the_write_commits(dsn: str) -> None:
    """The write inside the block commits before a takeover can; after it, the old
    fence is refused and the block writes nothing."""
    make_ledger(dsn)
    with connect(dsn, 5) as conn:
        old = lease_ops.acquire(conn, AcquireRequest("job", "a", 0.5))
    taken: list[lease_ops.AcquireResult] = []

    def take_over() -> None:
        with connect(dsn, 5) as thief:
            taken.append(lease_ops.acquire(thief, AcquireRequest("job", "b", 60)))

    thief = threading.Thread(target=take_over)
    with connect(dsn, 5) as conn:  # autocommit, as the library gives it
        with fenced_transaction(conn, "job", old.fence) as writer:
            time.sleep(0.7)  # the lease runs out inside the fenced transaction
            thief.start()
            thief.join(0.5)
            assert thief.is_alive(), "the takeover must wait for the fenced write"
            writer.execute("INSERT INTO ledger VALUES ('late', %s)", (old.fence,))
        thief.join(10)
        assert taken and taken[0].acquired and taken[0].fence > old.fence
        with pytest.raises(StaleFenceError), fenced_transaction(conn, "job", old.fence) as writer:
            writer.execute("INSERT INTO ledger VALUES ('stale', %s)", (old.fence,))
    assert ledger(dsn) == [("late", old.fence)]


def test_fenced_transaction_rolls_the_write_back_when_the_block_fails(dsn: str) -> None:
    make_ledger(dsn)
    with connect(dsn, 5) as conn:
        won = lease_ops.acquire(conn, AcquireRequest("job", "a", 30))
        with pytest.raises(RuntimeError), fenced_transaction(conn, "job", won.fence) as writer:
            writer.execute("INSERT INTO ledger VALUES ('half', %s)", (won.fence,))
            raise RuntimeError("the workload failed mid-write")
        with psycopg.connect(dsn) as plain, fenced_transaction(plain, "job", won.fence) as writer:
            writer.execute("INSERT INTO ledger VALUES ('whole', %s)", (won.fence,))  # not autocommit too
    assert ledger(dsn) == [("whole", won.fence)]
