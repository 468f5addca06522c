"""What the pooler tests ask of a real PgBouncer: fill a pool, and read every server session.

A transaction pooler hides the server sessions behind it, and PostgreSQL shows a
session's prepared statements, `SET`s, advisory locks, `LISTEN`s, temporary tables
and open cursors only to that session itself. So `session_state` asks each server
connection of a pool through the pooler, from as many clients in a transaction at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from guardedcron_devenv.pgbouncer import PgBouncer

# What PgBouncer itself keeps in step between a client and whichever server session it
# gets (it re-sends them with SET on every switch): session settings, but the pooler's.
POOLER_TRACKED_SETTINGS = ["application_name", "client_encoding", "DateStyle", "TimeZone",
                           "standard_conforming_strings"]  # fmt: skip
VISIT_ROUNDS = 5

STATE_SQL = """
SELECT pg_backend_pid(),
       (SELECT coalesce(array_agg(name || ': ' || statement ORDER BY name), '{}')
          FROM pg_prepared_statements),
       (SELECT coalesce(array_agg(name || '=' || setting ORDER BY name), '{}')
          FROM pg_settings WHERE source = 'session' AND NOT (name = ANY(%s))),
       (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'),
       (SELECT count(*) FROM pg_listening_channels()),
       (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()),
       (SELECT count(*) FROM pg_cursors WHERE is_holdable)  -- only WITH HOLD outlives a transaction
"""


@dataclass(frozen=True)
class SessionState:
    """What one server session holds beyond a transaction (all empty or 0 when nothing leaked)."""

    prepared: list[str]
    settings: list[str]
    advisory_locks: int
    listening: int
    temp_tables: int
    cursors: int

    @property
    def clean(self) -> bool:
        return self == SessionState([], [], 0, 0, 0, 0)


def connect_plain(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A pooler-safe connection of the test's own (no server-side prepared statements)."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=None, connect_timeout=5)


def open_server_connections(pooled_dsn: str, count: int) -> set[int]:
    """Make the pool hold `count` server connections: as many clients in a transaction at
    once, each on a server session of its own. Returns the sessions' backend pids."""
    clients = [connect_plain(pooled_dsn) for _ in range(count)]
    try:
        pids: set[int] = set()
        for conn in clients:
            conn.execute("BEGIN")
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pids.add(int(row[0]))
        for conn in clients:
            conn.execute("COMMIT")
    finally:
        for conn in clients:
            conn.close()
    assert len(pids) == count, f"{count} clients in a transaction shared server sessions: {pids}"
    return pids


def server_pids(pooler: PgBouncer, pooled_dsn: str) -> set[int]:
    dbname = conninfo_to_dict(pooled_dsn)["dbname"]
    return {int(row["remote_pid"]) for row in pooler.show("SERVERS") if row["database"] == dbname}


def session_state(pooler: PgBouncer, pooled_dsn: str) -> dict[int, SessionState]:
    """The state of every server session in `pooled_dsn`'s pool, by backend pid.

    As many clients as the pool has server sessions each open a transaction at once, so
    each is on a session of its own, and ask it; again, up to a few times, while the
    pool's list of sessions changes (a session the server ended is replaced)."""
    seen: dict[int, SessionState] = {}
    for _ in range(VISIT_ROUNDS):
        wanted = server_pids(pooler, pooled_dsn)
        if wanted and wanted <= set(seen):
            return {pid: seen[pid] for pid in wanted}
        clients = [connect_plain(pooled_dsn) for _ in range(max(1, len(wanted)))]
        try:
            for conn in clients:
                conn.execute("BEGIN")
                row = conn.execute(STATE_SQL, (POOLER_TRACKED_SETTINGS,)).fetchone()
                assert row is not None
                pid, *state = row
                seen[int(pid)] = SessionState(list(state[0]), list(state[1]), *(int(n) for n in state[2:]))
            for conn in clients:
                conn.execute("COMMIT")
        finally:
            for conn in clients:
                conn.close()
    raise AssertionError(f"visited server sessions {sorted(seen)}, not all of {sorted(wanted)}")
