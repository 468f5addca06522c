"""What schema 6 made cheaper in an acquisition and a release (issue 13), on a real PostgreSQL.

Each test fails on schema 5: there every update of a run rewrote all of `runs`' indexes (the
index of running runs has `outcome` in its predicate), and acquire_v2 planned its retention
statements again on every call. The figures are in docs/benchmarks.md; these guard the causes.
"""

from __future__ import annotations

from typing import Any

import psycopg

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest

Connection = psycopg.Connection[tuple[Any, ...]]

# What a run's end (a release, a takeover's `abandoned`, the keeper's `lost`) writes.
END_COLUMNS = ("outcome", "finished_at", "reason")


def connect(dsn: str) -> Connection:
    return psycopg.connect(dsn, autocommit=True)


def run_updates(conn: Connection) -> tuple[int, int]:
    """(updates, HOT updates) of `runs` so far, as the statistics have them (flushed first)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'guardedcron.runs'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_release_and_a_takeover_end_the_run_in_place(dsn: str) -> None:
    """Ending a run changes no indexed column, so PostgreSQL updates its row in place (HOT):
    no new entry in any of the table's indexes, a fraction of the WAL."""
    with connect(dsn) as conn:
        before = run_updates(conn)
        for generation in range(20):
            holder = f"h{generation}"
            won = lease_ops.acquire(conn, AcquireRequest("job", holder, 60))
            assert won.acquired, won
            if generation % 2:
                assert lease_ops.release(conn, "job", holder, won.fence, "succeeded").ok
            else:
                # Left running: the next acquisition takes over and marks it abandoned.
                conn.execute(
                    "UPDATE guardedcron.leases SET locked_until = clock_timestamp() - interval '1 ms'"
                    " WHERE lock_name = 'job'"
                )
        updates, hot = (after - first for after, first in zip(run_updates(conn), before, strict=True))
        outcomes = conn.execute(
            "SELECT outcome, count(*) FROM guardedcron.runs GROUP BY outcome ORDER BY outcome"
        ).fetchall()
    assert outcomes == [("abandoned", 10), ("succeeded", 10)]
    assert (updates, hot) == (20, 20)  # schema 5: 20 updates, 0 HOT


def test_no_index_of_runs_reads_what_a_run_s_end_changes(dsn: str) -> None:
    """The cause of the test above, said directly: a new index on an end column (or with one in
    its predicate) would make every release rewrite all of the table's indexes again."""
    with connect(dsn) as conn:
        definitions = [
            str(row[0])
            for row in conn.execute(
                "SELECT pg_get_indexdef(indexrelid) FROM pg_index"
                " WHERE indrelid = 'guardedcron.runs'::regclass"
            )
        ]
    assert len(definitions) == 6, definitions  # id, and 5 for the readers (docs/design.md "Schema")
    for definition in definitions:
        assert not any(column in definition for column in END_COLUMNS), definition


def table_scans(conn: Connection) -> int:
    """Sequential scans of `runs` and `leases` so far, as the statistics have them (flushed first)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT sum(seq_scan) FROM pg_stat_user_tables"
        " WHERE relid IN ('guardedcron.runs'::regclass, 'guardedcron.leases'::regclass)"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_session_begun_on_a_young_table_keeps_probing_by_index(dsn: str) -> None:
    """acquire_v2 plans once per session (a pooled server connection lives long): schema 5
    made its retention batch's custom plan again on every call. A plan made while the tables
    were nearly empty must not scan them once they have grown: without enable_seqscan = off
    on the functions, this session's late calls scan `runs` (checked by hand)."""
    with connect(dsn) as session, connect(dsn) as other:
        for generation in range(8):  # past the 5 custom plans PostgreSQL tries first
            won = lease_ops.acquire(session, AcquireRequest("job", f"h{generation}", 60))
            assert lease_ops.release(session, "job", f"h{generation}", won.fence, "succeeded").ok
        # Other locks' history arrives (as in a fleet) after the session made its plans.
        other.execute(
            "INSERT INTO guardedcron.runs (lock_name, holder, fence, started_at, outcome, generation)"
            " SELECT 'other-' || g % 50, 'x', g, clock_timestamp(), 'succeeded', g / 50 + 1"
            "   FROM generate_series(1, 5000) g"
        )
        before = table_scans(session)
        won = lease_ops.acquire(session, AcquireRequest("job", "late", 60))
        assert lease_ops.release(session, "job", "late", won.fence, "succeeded").ok
        assert table_scans(session) - before == 0
        row = session.execute(
            "SELECT proconfig FROM pg_proc"
            " WHERE oid = 'guardedcron.acquire_v2(text, text, double precision, double precision,"
            " bigint, integer, integer)'::regprocedure"
        ).fetchone()
    assert row is not None and "plan_cache_mode=force_generic_plan" in row[0], row
