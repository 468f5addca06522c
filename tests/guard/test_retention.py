"""Retention in bounded batches (schema 5, issue 13), on a real PostgreSQL.

Schema 4's winner deleted everything past its count cut-off in one call, found by walking
the lock's whole history, and counted skipped attempts toward retain_runs: each test here
fails on it (and on a tree without migration 5).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import RETENTION_BATCH, AcquireRequest
from guardedcron.guard.migrations import LATEST_VERSION, migrate
from tests.support import run_cli
from tests.support.schema import apply_up_to

Connection = psycopg.Connection[tuple[Any, ...]]


def connect(dsn: str) -> Connection:
    return psycopg.connect(dsn, autocommit=True)


def win(conn: Connection, lock: str, holder: str, *, retain_runs: int, **more: Any) -> int:
    """Take the lock over (its lease aged by hand: the function reads the database clock); the fence."""
    conn.execute(
        "UPDATE guardedcron.leases SET locked_until = clock_timestamp() - interval '1 ms'"
        " WHERE lock_name = %s",
        (lock,),
    )
    result = lease_ops.acquire(conn, AcquireRequest(lock, holder, 60, retain_runs=retain_runs, **more))
    assert result.acquired, result
    return result.fence


def lose(conn: Connection, lock: str, holder: str, **more: Any) -> None:
    result = lease_ops.acquire(conn, AcquireRequest(lock, holder, 60, **more))
    assert not result.acquired, result


def history(conn: Connection, lock: str) -> tuple[int, int]:
    """(winning runs, all rows) of the lock."""
    row = conn.execute(
        "SELECT count(fence), count(*) FROM guardedcron.runs WHERE lock_name = %s", (lock,)
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_win_deletes_one_batch_of_a_long_history_at_most(dsn: str) -> None:
    """120 rows past a cap lowered to 5: each win deletes RETENTION_BATCH of them, oldest first,
    until only the last 5 generations are left (schema 4 deleted all 116 in the first call)."""
    with connect(dsn) as conn:
        for generation in range(60):
            win(conn, "job", f"w{generation % 2}", retain_runs=1000)
            lose(conn, "job", "loser")
        assert history(conn, "job") == (60, 120)
        deleted_per_win = []
        oldest_kept: list[int] = []
        for step in range(12):
            before = history(conn, "job")[1]
            win(conn, "job", f"w{step % 2}", retain_runs=5)
            deleted_per_win.append(before + 1 - history(conn, "job")[1])
            row = conn.execute("SELECT min(id) FROM guardedcron.runs WHERE lock_name = 'job'").fetchone()
            assert row is not None
            oldest_kept.append(int(row[0]))
            lose(conn, "job", "loser")
        assert RETENTION_BATCH == 16
        # Win k (from 0) puts generations 1..56+k, two rows each, past the cap: 112 + 2k rows.
        # 16 a win catch up at the eighth; from then on each win deletes the generation it
        # pushes out, a winner and its loser.
        assert deleted_per_win == [16] * 7 + [14, 2, 2, 2, 2], deleted_per_win
        assert oldest_kept == sorted(oldest_kept)  # oldest first
        assert history(conn, "job") == (5, 10)


def test_claims_past_their_age_go_one_batch_a_win(dsn: str) -> None:
    with connect(dsn) as conn:
        win(conn, "job", "a", retain_runs=10, slot=1_000)
        conn.execute(
            "INSERT INTO guardedcron.slot_claims (lock_name, slot, holder, fence, claimed_at)"
            " SELECT 'job', s, 'old', s, clock_timestamp() - interval '100 days'"
            " FROM generate_series(1, 40) s"
        )
        left = []
        for slot in range(1_001, 1_005):
            win(conn, "job", "a", retain_runs=10, slot=slot, retain_days=90)
            row = conn.execute(
                "SELECT count(*) FROM guardedcron.slot_claims"
                " WHERE claimed_at < clock_timestamp() - interval '90 days'"
            ).fetchone()
            left.append(row[0] if row else None)
        assert left == [24, 8, 0, 0]  # schema 4: [0, 0, 0, 0]
        kept = conn.execute("SELECT count(*) FROM guardedcron.slot_claims").fetchone()
        assert kept == (5,)  # every claim of the last 90 days stays: one run per slot


@pytest.mark.parametrize("losers_per_generation", [0, 1, 3])
def test_history_keeps_exactly_the_last_generations(dsn: str, losers_per_generation: int) -> None:
    """After every round, the lock keeps its last R winning runs and the attempts that lost to
    them, whatever the number of rounds (schema 4 counted the losers toward R)."""
    retain = 7
    with connect(dsn) as conn:
        for generation in range(1, 50):
            win(conn, "job", f"cluster-{generation % 2}", retain_runs=retain, slot=generation)
            for loser in range(losers_per_generation):
                # the other cluster for the same minute, and late retries
                lose(conn, "job", f"late-{loser}", slot=generation)
            kept = min(generation, retain)
            assert history(conn, "job") == (kept, kept * (1 + losers_per_generation)), generation
        numbers = conn.execute(
            "SELECT generation FROM guardedcron.runs"
            " WHERE lock_name = 'job' AND fence IS NOT NULL ORDER BY id"
        ).fetchall()
        assert [n for (n,) in numbers] == list(range(43, 50))
        assert conn.execute("SELECT generation FROM guardedcron.leases").fetchone() == (49,)


def test_a_generation_with_more_losers_than_a_batch_drains_on_later_wins(dsn: str) -> None:
    with connect(dsn) as conn:
        win(conn, "job", "a", retain_runs=2)
        for loser in range(40):  # a burst of retries while the first run holds the lease
            lose(conn, "job", f"retry-{loser}")
        deleted = []
        for step in range(6):
            before = history(conn, "job")[1]
            win(conn, "job", f"w{step}", retain_runs=2)
            deleted.append(before + 1 - history(conn, "job")[1])
        assert max(deleted) <= RETENTION_BATCH
        assert deleted == [0, 16, 16, 11, 1, 1], deleted  # generation 1's 41 rows, then a run a win
        assert history(conn, "job") == (2, 2)


def test_a_lease_row_deleted_by_hand_counts_on_from_the_kept_history(dsn: str) -> None:
    with connect(dsn) as conn:
        fences = [win(conn, "job", f"h{i}", retain_runs=3) for i in range(5)]
        conn.execute("DELETE FROM guardedcron.leases")
        fence = win(conn, "job", "after", retain_runs=3)
        assert fence > max(fences)
        numbers = conn.execute(
            "SELECT generation FROM guardedcron.runs WHERE lock_name = 'job' ORDER BY id"
        ).fetchall()
        # Generation 6, not 1: the three kept runs stay the lock's newest but two.
        assert [n for (n,) in numbers] == [4, 5, 6]


def test_upgrading_a_schema_4_database_keeps_its_history_and_numbers_its_wins(empty_dsn: str) -> None:
    apply_up_to(empty_dsn, 4)
    with connect(empty_dsn) as conn:
        fences: dict[str, list[int]] = {"a": [], "b": []}
        for round_number in range(4):
            fences["a"].append(win(conn, "a", f"a{round_number}", retain_runs=100))
            lose(conn, "a", "other-cluster")
        fences["b"].append(win(conn, "b", "b0", retain_runs=100))
        before = conn.execute(
            "SELECT id, lock_name, holder, fence, outcome FROM guardedcron.runs ORDER BY id"
        ).fetchall()

        assert [m.version for m in migrate(conn)] == list(range(5, LATEST_VERSION + 1))

        after = conn.execute(
            "SELECT id, lock_name, holder, fence, outcome FROM guardedcron.runs ORDER BY id"
        ).fetchall()
        assert after == before  # nothing lost or changed
        numbered = conn.execute(
            "SELECT lock_name, generation FROM guardedcron.runs WHERE fence IS NOT NULL ORDER BY id"
        ).fetchall()
        assert numbered == [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 1)]
        skips = conn.execute(
            "SELECT count(*) FROM guardedcron.runs WHERE fence IS NULL AND generation IS NULL"
        ).fetchone()
        assert skips == (4,)
        leases = conn.execute("SELECT lock_name, generation FROM guardedcron.leases ORDER BY 1").fetchall()
        assert leases == [("a", 4), ("b", 1)]

        # Acquisition goes on from there, fences still growing, the old fence refused.
        fence = win(conn, "a", "new", retain_runs=2)
        assert fence > max(fences["a"] + fences["b"])
        with conn.transaction():
            conn.execute("SELECT guardedcron.check_fence('a', %s)", (fence,))
        with pytest.raises(psycopg.Error) as stale, conn.transaction():
            conn.execute("SELECT guardedcron.check_fence('a', %s)", (fences["a"][-1],))
        assert stale.value.sqlstate == "GC001"
        assert conn.execute(
            "SELECT generation FROM guardedcron.runs WHERE fence = %s", (fence,)
        ).fetchone() == (5,)

        assert migrate(conn) == []  # idempotent
        public = conn.execute(
            "SELECT p.oid::regprocedure::text"
            "  FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a"
            " WHERE p.pronamespace = 'guardedcron'::regnamespace AND a.grantee = 0"
        ).fetchall()
        assert public == []
    again = run_cli(["db", "migrate"], dsn=empty_dsn)
    assert again.code == 0 and again.json["applied"] == [], again
    status = run_cli(["db", "status"], dsn=empty_dsn)
    assert status.code == 0 and status.json["schema_version"] == LATEST_VERSION, status


def index_tuples_read(conn: Connection) -> int:
    """Index entries of `runs` read so far, as the statistics have them (flushed first)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relid = 'guardedcron.runs'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_takeover_and_a_release_read_their_own_locks_runs_only(dsn: str) -> None:
    """At the top of the minute a fleet's runs start one after the other; each takeover and
    each release reads a handful of index entries, not every running run. Schema 4 looked the
    previous run up by id and `outcome = 'running'` alone, and planned while no run was
    running (the minute before, every run had ended) it read the running runs of every lock."""
    with connect(dsn) as conn:
        fences = [win(conn, f"job-{lock}", "before", retain_runs=100) for lock in range(300)]
        for lock, fence in enumerate(fences):
            assert lease_ops.release(conn, f"job-{lock}", "before", fence, "succeeded").ok
        conn.execute("VACUUM ANALYZE guardedcron.runs")
    with connect(dsn) as conn:
        fences = [win(conn, f"job-{lock}", "now", retain_runs=100) for lock in range(299)]
        before = index_tuples_read(conn)
        win(conn, "job-299", "now", retain_runs=100)
        taken = index_tuples_read(conn) - before
        before = index_tuples_read(conn)
        assert lease_ops.release(conn, "job-0", "now", fences[0], "succeeded").ok
        released = index_tuples_read(conn) - before
    assert taken < 50 and released < 50, (taken, released)  # schema 4: about 300 each
