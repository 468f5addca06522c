"""Run history on crafted data: overlaps, gaps against a schedule, abandoned runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from guardedcron.guard import history
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from tests.support import run_cli

T0 = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)


def insert_run(
    conn: psycopg.Connection[tuple[Any, ...]],
    *,
    start_min: float,
    end_min: float | None,
    fence: int | None,
    outcome: str = "succeeded",
    slot: int | None = None,
    holder: str = "h",
) -> None:
    started = T0 + timedelta(minutes=start_min)
    finished = None if end_min is None else T0 + timedelta(minutes=end_min)
    conn.execute(
        "INSERT INTO guardedcron.runs (lock_name, slot, holder, fence, started_at, finished_at,"
        " outcome) VALUES ('job', %s, %s, %s, %s, %s, %s)",
        (slot, holder, fence, started, finished, outcome),
    )


def test_overlaps_are_found_and_skips_never_count(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert_run(conn, start_min=0, end_min=10, fence=1)
        insert_run(conn, start_min=5, end_min=6, fence=2)  # inside run 1: overlap
        insert_run(conn, start_min=7, end_min=7, fence=None, outcome="skipped")  # not a runner
        insert_run(conn, start_min=20, end_min=30, fence=3)
        insert_run(conn, start_min=30, end_min=40, fence=4)  # starts as 3 ends: no overlap
        insert_run(conn, start_min=35, end_min=None, fence=5, outcome="running")  # overlap with 4
        found = history.find_overlaps(conn, "job")
    assert [(o.earlier.fence, o.later.fence) for o in found] == [(1, 2), (4, 5)]


def test_no_overlaps_in_clean_history(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(10):
            insert_run(conn, start_min=i * 10, end_min=i * 10 + 5, fence=i + 1)
        assert history.find_overlaps(conn, "job") == []


def test_gaps_by_slot_a_manual_run_covers_none(dsn: str) -> None:
    expected = [T0 + timedelta(minutes=5 * i) for i in range(6)]  # 02:00 .. 02:25
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert_run(conn, start_min=0.2, end_min=1, fence=1, slot=history.slot_of(expected[0]))
        insert_run(
            conn, start_min=5.1, end_min=6, fence=None, outcome="skipped", slot=history.slot_of(expected[1])
        )  # only a skip for 02:05: a gap
        insert_run(
            conn, start_min=10.3, end_min=11, fence=2, slot=history.slot_of(expected[2]), outcome="failed"
        )  # failed, but it ran: no gap
        insert_run(conn, start_min=20.5, end_min=21, fence=3)  # manual, 30 s after 02:20: no slot of its own
        gaps = history.find_gaps(conn, "job", expected)
    assert [g.expected_at for g in gaps] == [expected[1], expected[3], expected[4], expected[5]]


def test_runs_cli_reports_gaps_against_a_cron_schedule(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for minute in (0, 5, 15):  # 02:10 is missing
            when = T0 + timedelta(minutes=minute)
            insert_run(
                conn, start_min=minute + 0.1, end_min=minute + 1, fence=minute + 1, slot=history.slot_of(when)
            )
    result = run_cli(
        [
            "runs",
            "--lock",
            "job",
            "--gaps",
            "--schedule",
            "*/5 * * * *",
            "--since",
            "2026-03-01T02:00:00+00:00",
            "--until",
            "2026-03-01T02:15:00+00:00",
            "--json",
        ],
        dsn=dsn,
    )
    assert result.code == 1, result.stderr  # trouble found: non-zero for alerting scripts
    report = result.json
    assert [g["expected_at"] for g in report["gaps"]] == ["2026-03-01T02:10:00+00:00"]  # type: ignore[index]
    assert report["gap_window"]["expected"] == 4  # type: ignore[index]


def test_runs_cli_lists_and_marks_abandoned(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "a", 0.2))
        assert held.acquired
    import time

    time.sleep(0.3)
    result = run_cli(["runs", "--lock", "job", "--mark-abandoned", "--overlaps", "--json"], dsn=dsn)
    assert result.code == 0, result.stderr
    report = result.json
    assert report["marked_abandoned"] == 1
    runs = report["runs"]
    assert isinstance(runs, list) and runs[0]["outcome"] == "abandoned"
    assert "ran out" in runs[0]["reason"]
    assert report["overlaps"] == []


def test_gaps_are_not_reported_before_the_oldest_run_retention_kept(dsn: str) -> None:
    """Retention prunes old runs; the default gap window must not call their absence a gap."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT date_trunc('hour', clock_timestamp()) - interval '1 hour'").fetchone()
        assert row is not None
        hour: datetime = row[0]
        for minute in (0, 5, 10, 20, 25):  # :15 is missing; everything before :00 was "pruned"
            when = hour + timedelta(minutes=minute)
            conn.execute(
                "INSERT INTO guardedcron.runs (lock_name, slot, holder, fence, started_at, finished_at,"
                " outcome) VALUES ('job', %s, 'h', %s, %s, %s, 'succeeded')",
                (
                    history.slot_of(when),
                    minute + 1,
                    when + timedelta(seconds=5),
                    when + timedelta(seconds=30),
                ),
            )
    until = (hour + timedelta(minutes=25)).isoformat()
    result = run_cli(
        ["runs", "--lock", "job", "--gaps", "--schedule", "*/5 * * * *", "--until", until, "--json"], dsn=dsn
    )
    assert result.code == 1, result.stderr
    report = result.json
    assert [g["expected_at"] for g in report["gaps"]] == [  # type: ignore[index]
        (hour + timedelta(minutes=15)).isoformat()
    ]
    assert report["gap_window"]["expected"] == 6  # type: ignore[index]  # :00 to :25, not 7 days
