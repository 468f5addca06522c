"""A win is durable whatever the session's `synchronous_commit` says, on a real PostgreSQL
that is crashed (immediate stop: no shutdown checkpoint, WAL buffers lost) right after
the wins were acknowledged.

The server is durable, and its WAL writer waits 10 s between rounds, so a commit that
does not flush its WAL itself is still in shared memory when the server dies. A session
asks for `synchronous_commit = off` through the database's settings, the role's, or
PGOPTIONS; every acknowledged win must survive the crash: its slot stays claimed, and no
fence is handed out again; an acknowledged renewal keeps its lease.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from guardedcron.guard.migrations import migrate
from guardedcron.guard.replication import replication_of
from guardedcron_devenv.postgres import ThrowawayPostgres

Connection = psycopg.Connection[tuple[Any, ...]]
WINS = 6


@pytest.fixture(scope="module")
def durable_server() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres(durable=True, settings=[("wal_writer_delay", "'10s'")]) as server:
        yield server


def weak_session_dsn(server: ThrowawayPostgres, how: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A migrated database, and a DSN whose sessions get synchronous_commit = off by `how`."""
    name = f"d_{uuid.uuid4().hex[:12]}"
    admin_dsn = server.create_database(name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        migrate(conn)
        if how == "database":
            conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
            return admin_dsn
        if how == "role":
            role, password = f"r_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(12)
            conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
            conn.execute(f"ALTER ROLE {role} SET synchronous_commit = off")
            return f"postgresql://{role}:{password}@127.0.0.1:{server.port}/{name}"
    monkeypatch.setenv("PGOPTIONS", "-c synchronous_commit=off")
    return admin_dsn


@pytest.mark.parametrize("how", ["database", "role", "pgoptions"])
def test_acknowledged_wins_survive_a_crash_whatever_the_session_asks(
    durable_server: ThrowawayPostgres, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = weak_session_dsn(durable_server, how, monkeypatch)
    won: dict[int, int] = {}  # slot -> fence, as acknowledged
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        for slot in range(WINS):
            result = lease_ops.acquire(conn, AcquireRequest("job", f"h{slot}", 0.1, slot=slot))
            assert result.acquired, result
            won[slot] = result.fence
            conn.execute(
                "UPDATE guardedcron.leases SET locked_until = clock_timestamp() WHERE lock_name = 'job'"
            )  # the next slot's holder takes over at once (an aged lease, as after a crash)
        last = WINS - 1
        renewed = lease_ops.renew(conn, "job", f"h{last}", won[last], 3600)
        assert renewed.ok, renewed
    durable_server.stop("immediate")
    durable_server.start()

    with psycopg.connect(dsn, autocommit=True) as conn:
        claimed = dict(conn.execute("SELECT slot, fence FROM guardedcron.slot_claims").fetchall())
        lost = sorted(set(won) - set(claimed))
        assert not lost, f"acknowledged wins lost by the crash (slots): {lost}"
        assert claimed == won
        kept = conn.execute("SELECT holder, locked_until FROM guardedcron.leases").fetchone()
        assert kept == (f"h{last}", renewed.locked_until), "an acknowledged renewal was lost by the crash"
        conn.execute("UPDATE guardedcron.leases SET locked_until = clock_timestamp()")
        again = [lease_ops.acquire(conn, AcquireRequest("job", f"re{slot}", 60, slot=slot)) for slot in won]
        assert [r.reason for r in again] == ["slot-claimed"] * WINS
        fresh = lease_ops.acquire(conn, AcquireRequest("job", "fresh", 60, slot=WINS))
        assert fresh.acquired and fresh.fence > max(won.values()), (fresh, won)


def test_a_connection_lost_during_the_replication_query_is_raised_not_taken_for_no_advice(dsn: str) -> None:
    """The advice query runs first on the acquire's connection. Swallowing a lost
    connection there left acquire a dead connection, which it refused as bad input
    (exit 64) where the guard must say the database is unavailable (69)."""
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            replication_of(victim)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert replication_of(conn) is not None  # a live connection still gets its advice
