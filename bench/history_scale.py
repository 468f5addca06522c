"""The run history at scale: one year of a job that runs every minute.

About 535,000 rows for one lock (a run per minute, a skipped attempt per hour, a missed
minute every ~3.5 days, three overlapping manual runs), then:

- the gap query (guardedcron.guard.history.find_gaps) over a day and over a week, and the
  whole `guardedcron runs --gaps` command over the same windows;
- the overlap query (history.find_overlaps) over the whole history;
- EXPLAIN (ANALYZE, BUFFERS) of every statement those run, to show which index serves it;
- retention: acquisitions with the default limits (90 days, 10,000 winning runs per lock)
  over the year: from schema 5 each deletes at most 16 rows of what lies past the cap
  (the year drains on the wins that follow), and costs the same as on a short history.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime, timedelta
from typing import Any

from tests.support import GUARDEDCRON

from bench.common import Connection, Table, connect, median, ms
from guardedcron.guard import history
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from guardedcron.schedule import Schedule, load_time_zone

LOCK = "billing/minutely"
MINUTES = 525_600
GAP_EVERY = 5000  # minutes: ~105 missed runs in the year
TOLERANCE = timedelta(seconds=60)

GENERATE = """
WITH minutes AS (
    SELECT m FROM generate_series(%(first)s::bigint, %(last)s::bigint) m WHERE m %% %(gap_every)s <> 17
)
INSERT INTO guardedcron.runs (lock_name, slot, holder, fence, started_at, finished_at, outcome, reason,
                             generation)
SELECT %(lock)s, m, 'billing/minutely-' || m || '-pod', row_number() OVER (ORDER BY m),
       to_timestamp(m * 60 + 2), to_timestamp(m * 60 + 32), 'succeeded', '', row_number() OVER (ORDER BY m)
  FROM minutes
UNION ALL
SELECT %(lock)s, m, 'other-cluster/minutely-' || m || '-pod', NULL,
       to_timestamp(m * 60 + 3), to_timestamp(m * 60 + 3), 'skipped', 'lease held', NULL
  FROM minutes WHERE m %% 60 = 0
UNION ALL
SELECT %(lock)s, NULL, 'manual-' || m, -m,
       to_timestamp(m * 60 + 10), to_timestamp(m * 60 + 50), 'succeeded', '', NULL
  FROM generate_series(%(last)s - 3000, %(last)s - 1000, 1000) m
"""


class Explaining:
    """Stands in for a connection (or a cursor of it): EXPLAIN ANALYZE each distinct statement
    once, then run it."""

    def __init__(self, conn: Any, plans: dict[str, str] | None = None) -> None:
        self.conn = conn
        self.plans: dict[str, str] = {} if plans is None else plans

    @property
    def adapters(self) -> Any:
        return self.conn.adapters

    def cursor(self) -> Explaining:
        """The history queries read through guard.timestamps.reading(conn), a cursor."""
        return Explaining(self.conn.cursor(), self.plans)

    def execute(self, query: Any, params: Any = None) -> Any:
        text = query if isinstance(query, str) else query.decode()
        if text not in self.plans:
            rows = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + text, params).fetchall()
            self.plans[text] = "\n".join(str(r[0]) for r in rows)
        return self.conn.execute(query, params)


def timed(action: Any, repeat: int = 7) -> float:
    action()  # warm the cache: a dashboard asks the same question again and again
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return median(samples)


def expected_minutes(start: datetime, end: datetime) -> list[datetime]:
    return list(
        Schedule.parse("* * * * *").iter_between(
            start - timedelta(microseconds=1), end, load_time_zone("UTC")
        )
    )


def cli_gaps_seconds(dsn: str, since: datetime, until: datetime, repeat: int = 5) -> tuple[float, int]:
    env = {**os.environ, "GUARDEDCRON_DSN": dsn}
    command = [
        GUARDEDCRON,
        "runs",
        "--lock",
        LOCK,
        "--gaps",
        "--schedule",
        "* * * * *",
        "--json",
        "--since",
        since.isoformat(),
        "--until",
        until.isoformat(),
    ]
    samples, code = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        code = subprocess.run(command, env=env, capture_output=True, check=False).returncode
        samples.append(time.perf_counter() - started)
    return median(samples), code


def count_runs(conn: Connection) -> int:
    row = conn.execute("SELECT count(*) FROM guardedcron.runs WHERE lock_name = %s", (LOCK,)).fetchone()
    return int(row[0]) if row else 0


def table_bytes(conn: Connection) -> int:
    row = conn.execute("SELECT pg_total_relation_size('guardedcron.runs')").fetchone()
    return int(row[0]) if row else 0


def run(dsn: str) -> tuple[list[Table], dict[str, str]]:
    queries = Table(
        "History at scale: one year of a one-minute job", ["query", "window", "rows", "median ms"]
    )
    plans: dict[str, str] = {}
    with connect(dsn) as conn:
        db_now = conn.execute("SELECT date_trunc('minute', clock_timestamp())").fetchone()
        assert db_now is not None
        now: datetime = db_now[0]
        last = int(now.timestamp()) // 60 - 1
        started = time.perf_counter()
        conn.execute(
            GENERATE, {"first": last - MINUTES + 1, "last": last, "gap_every": GAP_EVERY, "lock": LOCK}
        )
        conn.execute("VACUUM ANALYZE guardedcron.runs")
        generated = time.perf_counter() - started
        rows = count_runs(conn)
        size_before = table_bytes(conn)
        queries.notes.append(
            f"{rows:,} rows generated in {generated:.1f} s;"
            f" runs table with its indexes {size_before / 2**20:.0f} MiB."
        )
        end = now - TOLERANCE
        for label, span in (("day", timedelta(days=1)), ("week", timedelta(days=7))):
            expected = expected_minutes(end - span, end)
            gaps = history.find_gaps(conn, LOCK, expected)
            seconds = timed(lambda e=expected: history.find_gaps(conn, LOCK, e))
            queries.add(
                f"history.find_gaps ({len(gaps)} gaps found)",
                label,
                f"{len(expected):,} expected",
                ms(seconds),
            )
            cli, code = cli_gaps_seconds(dsn, end - span, end)
            queries.add(f"`guardedcron runs --gaps` whole command (exit {code})", label, "", ms(cli))
            explaining = Explaining(conn)
            history.find_gaps(explaining, LOCK, expected)  # type: ignore[arg-type]
            plans.update({f"find_gaps, {label} window": plan for plan in explaining.plans.values()})
        overlaps = history.find_overlaps(conn, LOCK)
        seconds = timed(lambda: history.find_overlaps(conn, LOCK), repeat=3)
        queries.add(f"history.find_overlaps ({len(overlaps)} found)", "all history", f"{rows:,}", ms(seconds))
        explaining = Explaining(conn)
        history.find_overlaps(explaining, LOCK)  # type: ignore[arg-type]
        for i, plan in enumerate(explaining.plans.values()):
            plans["find_overlaps, " + ("window pass" if i == 0 else "earlier run of one overlap")] = plan

        retention = Table(
            "Retention with the default limits (90 days, 10,000 winning runs per lock; 16 rows a win)",
            ["step", "ms", "runs of the lock after", "table + indexes MiB"],
        )
        for step in range(3):
            conn.execute(
                "UPDATE guardedcron.leases SET locked_until = clock_timestamp() WHERE lock_name = %s", (LOCK,)
            )
            t0 = time.perf_counter()
            result = lease_ops.acquire(conn, AcquireRequest(LOCK, f"retention-{step}", 60))
            took = time.perf_counter() - t0
            assert result.acquired, result
            label = "first acquisition after a year of history" if step == 0 else f"acquisition {step + 1}"
            retention.add(label, ms(took), f"{count_runs(conn):,}", f"{table_bytes(conn) / 2**20:.0f}")
        conn.execute("VACUUM guardedcron.runs")
        retention.add("after VACUUM", "", f"{count_runs(conn):,}", f"{table_bytes(conn) / 2**20:.0f}")
        week = expected_minutes(end - timedelta(days=7), end)
        pruned_gaps = history.find_gaps(conn, LOCK, week)
        oldest = conn.execute(
            "SELECT min(started_at) FROM guardedcron.runs WHERE lock_name = %s", (LOCK,)
        ).fetchone()
        past = conn.execute(
            "SELECT count(*) FROM guardedcron.runs WHERE lock_name = %(lock)s AND id < ("
            " SELECT id FROM guardedcron.runs WHERE lock_name = %(lock)s AND generation > ("
            "  SELECT generation FROM guardedcron.leases WHERE lock_name = %(lock)s) - 10000"
            " ORDER BY generation LIMIT 1)",
            {"lock": LOCK},
        ).fetchone()
        surplus = int(past[0]) if past else 0
        retention.notes.append(
            f"Each acquisition deleted at most 16 rows (schema 5): {surplus:,} rows are still past the"
            f" 10,000-run cap, and drain by 15 a win (16 deleted, one pushed out), over {surplus / 15:,.0f}"
            f" more wins ({surplus / 15 / 1440:.1f} days of a one-minute job), each as cheap as these."
            f" The oldest run kept starts at {oldest[0] if oldest else '?'}; a week's gap check reports"
            f" {len(pruned_gaps):,} gaps (the year had {MINUTES // GAP_EVERY} real ones, about 2 per week)."
        )
        seconds = timed(lambda: history.find_overlaps(conn, LOCK), repeat=3)
        queries.add(
            "history.find_overlaps, after retention", "all history", f"{count_runs(conn):,}", ms(seconds)
        )
    return [queries, retention], plans
